#include "base/fileio.h"

#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "base/log.h"
#include "dear_types.h"

static const char *kind_name(mode_t m)
{
    if (S_ISLNK(m))
        return "a symbolic link";
    if (S_ISDIR(m))
        return "a folder";
    if (S_ISFIFO(m))
        return "a FIFO";
    if (S_ISCHR(m))
        return "a character device";
    if (S_ISBLK(m))
        return "a block device";
    if (S_ISSOCK(m))
        return "a socket";
    return "not a regular file";
}

int dear_file_check_target(const char *path, const char *what)
{
    struct stat st;
    if (!path || !path[0]) {
        DEAR_ERROR("file", "%s: the path is empty", what);
        return DEAR_ERR_IO;
    }
    if (lstat(path, &st) != 0) {
        if (errno == ENOENT)
            return DEAR_OK;
        DEAR_ERROR("file", "%s %s: %s", what, path, strerror(errno));
        return DEAR_ERR_IO;
    }
    if (!S_ISREG(st.st_mode)) {
        DEAR_ERROR("file", "%s %s is %s; refused (accepted: a regular file, which is replaced, or a path that "
                           "does not exist yet)",
                   what, path, kind_name(st.st_mode));
        return DEAR_ERR_IO;
    }
    return DEAR_OK;
}

int dear_lines_open(dear_lines_t *r, const char *path, const char *what, size_t max_line, size_t max_bytes,
                    int missing_ok)
{
    memset(r, 0, sizeof *r);
    r->path = path;
    r->what = what;
    r->max_line = max_line;
    r->max_bytes = max_bytes;
    /* O_NONBLOCK: opening a FIFO must not wait for a writer; the type is checked right after. */
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) {
        if (errno == ENOENT && missing_ok)
            return DEAR_OK;
        DEAR_ERROR("file", "cannot open %s %s: %s", what, path, strerror(errno));
        return DEAR_ERR_IO;
    }
    struct stat st;
    if (fstat(fd, &st) != 0) {
        DEAR_ERROR("file", "cannot read %s %s: %s", what, path, strerror(errno));
        close(fd);
        return DEAR_ERR_IO;
    }
    if (!S_ISREG(st.st_mode)) {
        DEAR_ERROR("file", "%s %s is %s; refused (accepted: a regular file)", what, path,
                   kind_name(st.st_mode));
        close(fd);
        return DEAR_ERR_IO;
    }
    if ((uintmax_t)st.st_size > (uintmax_t)max_bytes) {
        DEAR_ERROR("file", "%s %s is %jd bytes; refused (accepted: at most %zu)", what, path, (intmax_t)st.st_size,
                   max_bytes);
        close(fd);
        return DEAR_ERR_FORMAT;
    }
    int fl = fcntl(fd, F_GETFL);
    if (fl < 0 || fcntl(fd, F_SETFL, fl & ~O_NONBLOCK) != 0 || !(r->f = fdopen(fd, "r"))) {
        DEAR_ERROR("file", "cannot read %s %s: %s", what, path, strerror(errno));
        close(fd);
        return DEAR_ERR_IO;
    }
    return DEAR_OK;
}

int dear_lines_next(dear_lines_t *r, char **line)
{
    size_t n = 0;
    int c;
    if (!r->buf) {
        r->cap = 256 < r->max_line + 1 ? 256 : r->max_line + 1;
        if (!(r->buf = malloc(r->cap)))
            return DEAR_ERR_NOMEM;
    }
    while ((c = getc(r->f)) != EOF) {
        if (++r->bytes > r->max_bytes) {
            DEAR_ERROR("file", "%s %s grew past %zu bytes while being read; refused", r->what, r->path,
                       r->max_bytes);
            return DEAR_ERR_FORMAT;
        }
        if (c == '\n')
            break;
        if (n == r->max_line) {
            DEAR_ERROR("file", "%s:%d: line longer than %zu characters (the %s's limit)", r->path, r->lineno + 1,
                       r->max_line, r->what);
            return DEAR_ERR_FORMAT;
        }
        if (n + 1 >= r->cap) {
            size_t nc = r->cap * 2 < r->max_line + 1 ? r->cap * 2 : r->max_line + 1;
            char *nb = realloc(r->buf, nc);
            if (!nb)
                return DEAR_ERR_NOMEM;
            r->buf = nb;
            r->cap = nc;
        }
        r->buf[n++] = (char)c;
    }
    if (ferror(r->f)) {
        DEAR_ERROR("file", "error reading %s %s: %s", r->what, r->path, strerror(errno));
        return DEAR_ERR_IO;
    }
    if (c == EOF && n == 0)
        return 0;
    r->buf[n] = '\0';
    r->lineno++;
    *line = r->buf;
    return 1;
}

void dear_lines_close(dear_lines_t *r)
{
    if (r->f)
        fclose(r->f);
    free(r->buf);
    r->f = NULL;
    r->buf = NULL;
}

/* A fresh file next to path, created with O_EXCL under an unpredictable name. */
static int create_tmp(const char *path, char *tmp, size_t cap, const char *what)
{
    static unsigned long counter;
    for (int tries = 0; tries < 64; tries++) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        unsigned long long x = (unsigned long long)ts.tv_nsec * 0x9E3779B97F4A7C15ULL ^
                               ((unsigned long long)getpid() << 20) ^ __atomic_add_fetch(&counter, 1, __ATOMIC_RELAXED);
        if ((size_t)snprintf(tmp, cap, "%s.tmp-%012llx", path, x & 0xffffffffffffULL) >= cap) {
            DEAR_ERROR("file", "%s %s: the path is too long", what, path);
            return -1;
        }
        int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
        if (fd >= 0)
            return fd;
        if (errno != EEXIST) {
            DEAR_ERROR("file", "cannot create a temporary file %s for %s %s: %s", tmp, what, path, strerror(errno));
            return -1;
        }
    }
    DEAR_ERROR("file", "cannot create a temporary file next to %s %s: every name tried exists", what, path);
    return -1;
}

/* The rename is only durable once the folder holding the name is on disk too. */
static void sync_folder(const char *path)
{
    char dir[4096];
    snprintf(dir, sizeof dir, "%s", path);
    char *slash = strrchr(dir, '/');
    if (!slash)
        snprintf(dir, sizeof dir, ".");
    else if (slash == dir)
        dir[1] = '\0';
    else
        *slash = '\0';
    int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd >= 0) {
        if (fsync(dfd) != 0 && errno != EINVAL)
            DEAR_WARN("file", "cannot fsync folder %s: %s", dir, strerror(errno));
        close(dfd);
    }
}

int dear_file_out_open(dear_file_out_t *o, const char *path, const char *what)
{
    memset(o, 0, sizeof *o);
    o->what = what;
    if (dear_file_check_target(path, what) != DEAR_OK)
        return DEAR_ERR_IO;
    if ((size_t)snprintf(o->path, sizeof o->path, "%s", path) >= sizeof o->path) {
        DEAR_ERROR("file", "%s %s: the path is too long", what, path);
        return DEAR_ERR_IO;
    }
    int fd = create_tmp(path, o->tmp, sizeof o->tmp, what);
    if (fd < 0)
        return DEAR_ERR_IO;
    if (!(o->f = fdopen(fd, "w"))) {
        DEAR_ERROR("file", "cannot write %s: %s", o->tmp, strerror(errno));
        close(fd);
        unlink(o->tmp);
        return DEAR_ERR_IO;
    }
    return DEAR_OK;
}

void dear_file_out_abort(dear_file_out_t *o)
{
    if (o->f) {
        fclose(o->f);
        unlink(o->tmp);
        o->f = NULL;
    }
}

int dear_file_out_commit(dear_file_out_t *o)
{
    int err = 0;
    errno = 0;
    if (fflush(o->f) != 0 || ferror(o->f) || fsync(fileno(o->f)) != 0)
        err = errno ? errno : EIO;
    if (fclose(o->f) != 0 && !err)
        err = errno;
    o->f = NULL;
    if (err) {
        DEAR_ERROR("file", "cannot write %s %s: %s; the old file, if any, is left as it was", o->what, o->path,
                   strerror(err));
        unlink(o->tmp);
        return DEAR_ERR_IO;
    }
    /* Checked again just before the rename: what is at path may have changed since the open. */
    if (dear_file_check_target(o->path, o->what) != DEAR_OK) {
        unlink(o->tmp);
        return DEAR_ERR_IO;
    }
    if (rename(o->tmp, o->path) != 0) {
        DEAR_ERROR("file", "cannot rename %s to %s: %s", o->tmp, o->path, strerror(errno));
        unlink(o->tmp);
        return DEAR_ERR_IO;
    }
    sync_folder(o->path);
    return DEAR_OK;
}

int dear_file_create_stream(const char *path, const char *what, int *fd)
{
    char tmp[4128];
    if (dear_file_check_target(path, what) != DEAR_OK)
        return DEAR_ERR_IO;
    int f = create_tmp(path, tmp, sizeof tmp, what);
    if (f < 0)
        return DEAR_ERR_IO;
    if (rename(tmp, path) != 0) {
        DEAR_ERROR("file", "cannot rename %s to %s: %s", tmp, path, strerror(errno));
        close(f);
        unlink(tmp);
        return DEAR_ERR_IO;
    }
    sync_folder(path);
    *fd = f;
    return DEAR_OK;
}
