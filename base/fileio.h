/* Every file libdear and its tools read or write goes through here, so that none can be turned
 * against the user: a path that names anything but a regular file is refused before it is
 * opened (a FIFO would block, a device never ends, /dev/null must not become a file), written
 * files are created under a fresh name in the target's folder and renamed into place (never
 * through a planted symbolic link, never leaving a torn or empty file), and readers are bounded
 * per line and per file. MPI-free. */
#ifndef DEAR_BASE_FILEIO_H
#define DEAR_BASE_FILEIO_H

#include <stddef.h>
#include <stdio.h>

/* A path libdear may write: DEAR_OK if it does not exist or is a regular file (not a symbolic
 * link); else DEAR_ERR_IO, logged with what it is and what is accepted. what: "calibration file". */
int dear_file_check_target(const char *path, const char *what);

/* A bounded line reader. */
typedef struct {
    FILE *f;
    const char *path;
    const char *what;
    char *buf;
    size_t cap, max_line, max_bytes, bytes;
    int lineno;
} dear_lines_t;

/* Open path for reading line by line: lines of at most max_line characters, at most max_bytes in
 * all. Refuses anything but a regular file without blocking (symbolic links to one are
 * followed: reading through them harms nothing). A missing file: DEAR_OK with r->f NULL when
 * missing_ok, else DEAR_ERR_IO. */
int dear_lines_open(dear_lines_t *r, const char *path, const char *what, size_t max_line, size_t max_bytes,
                    int missing_ok);
/* The next line, its newline removed, in *line (valid until the next call): 1, or 0 at the end,
 * or DEAR_ERR_FORMAT (a line or the file over its bound, logged with path:line) or DEAR_ERR_IO. */
int dear_lines_next(dear_lines_t *r, char **line);
void dear_lines_close(dear_lines_t *r);

/* A file written atomically: dear_file_out_open creates a fresh temporary file next to path
 * (O_EXCL, so never through a planted link), the caller writes o->f, and dear_file_out_commit
 * flushes, fsyncs, renames it over path and fsyncs the folder. On any error the temporary file
 * is removed and whatever was at path is left as it was. */
typedef struct {
    FILE *f;
    char path[4096];
    char tmp[4128];
    const char *what;
} dear_file_out_t;

int dear_file_out_open(dear_file_out_t *o, const char *path, const char *what);
int dear_file_out_commit(dear_file_out_t *o);
void dear_file_out_abort(dear_file_out_t *o);

/* A new empty file at path, to be written as a stream (the timeline): created like
 * dear_file_out_open and renamed into place at once, so that a reader always finds a file and
 * the path never resolves through a link. *fd: open for writing, close-on-exec. */
int dear_file_create_stream(const char *path, const char *what, int *fd);

#endif
