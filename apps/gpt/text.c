/*
 * text.c: loads the training text of dear-gpt, builds the byte vocabulary (or has words.c build
 * the word vocabulary), splits it into training and validation sets and computes the unigram
 * baseline (see text.h).
 */
#include "apps/gpt/text.h"

#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

typedef struct {
    char *data;
    size_t len, cap;
} buf_t;

static int buf_append(buf_t *b, const char *p, size_t n)
{
    if (b->len + n > b->cap) {
        size_t cap = b->cap ? b->cap : 1 << 20;
        while (cap < b->len + n)
            cap *= 2;
        char *d = realloc(b->data, cap);
        if (!d)
            return -1;
        b->data = d;
        b->cap = cap;
    }
    memcpy(b->data + b->len, p, n);
    b->len += n;
    return 0;
}

/* Append one file; with fortune set, lines that are exactly "%" become empty lines. */
static int append_file(buf_t *b, const char *path, int fortune, char *err, size_t errlen)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        snprintf(err, errlen, "cannot open %s: %s", path, strerror(errno));
        return -1;
    }
    char line[4096];
    int at_line_start = 1, rc = 0;
    while (fgets(line, sizeof line, f)) {
        size_t n = strlen(line);
        const char *p = line;
        if (fortune && at_line_start && (strcmp(line, "%\n") == 0 || strcmp(line, "%") == 0)) {
            p = "\n";
            n = 1;
        }
        at_line_start = n > 0 && line[strlen(line) - 1] == '\n';
        if (buf_append(b, p, n)) {
            snprintf(err, errlen, "out of memory reading %s", path);
            rc = -1;
            break;
        }
    }
    if (!rc && ferror(f)) {
        snprintf(err, errlen, "error reading %s: %s", path, strerror(errno));
        rc = -1;
    }
    fclose(f);
    return rc;
}

static int cmp_names(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

static int load_fortunes(buf_t *b, const char *dir, int *files, char *err, size_t errlen)
{
    DIR *d = opendir(dir);
    if (!d) {
        snprintf(err, errlen,
                 "cannot open %s (%s): the default text is Debian's fortunes "
                 "(apt-get install fortunes), or pass --data FILE",
                 dir, strerror(errno));
        return -1;
    }
    char **names = NULL;
    size_t n = 0, cap = 0;
    int rc = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        size_t len = strlen(e->d_name);
        if (e->d_name[0] == '.' || (len > 4 && strcmp(e->d_name + len - 4, ".dat") == 0))
            continue;
        char path[4096];
        struct stat st;
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        /* lstat: the *.u8 names are links to the same files */
        if (lstat(path, &st) != 0 || !S_ISREG(st.st_mode))
            continue;
        if (n == cap) {
            cap = cap ? 2 * cap : 64;
            char **nn = realloc(names, cap * sizeof *names);
            if (!nn) {
                rc = -1;
                break;
            }
            names = nn;
        }
        if (!(names[n] = strdup(e->d_name))) {
            rc = -1;
            break;
        }
        n++;
    }
    closedir(d);
    if (rc) {
        snprintf(err, errlen, "out of memory listing %s", dir);
    } else if (n == 0) {
        snprintf(err, errlen,
                 "no fortune files in %s: install Debian's fortunes (apt-get install fortunes), "
                 "or pass --data FILE",
                 dir);
        rc = -1;
    } else {
        qsort(names, n, sizeof *names, cmp_names);
        for (size_t i = 0; i < n && !rc; i++) {
            char path[4096];
            snprintf(path, sizeof path, "%s/%s", dir, names[i]);
            rc = append_file(b, path, 1, err, errlen);
        }
        *files = (int)n;
    }
    for (size_t i = 0; i < n; i++)
        free(names[i]);
    free(names);
    return rc;
}

/* One token per byte: the distinct bytes, in byte order. */
static int bytes_build(gpt_text_t *text, const char *data, size_t len, char *err, size_t errlen)
{
    size_t count[256] = {0};
    for (size_t i = 0; i < len; i++)
        count[(unsigned char)data[i]]++;
    text->unk = -1;
    for (int c = 0; c < 256; c++) {
        text->stoi[c] = -1;
        if (count[c]) {
            text->stoi[c] = text->vocab;
            text->itos[text->vocab++] = (unsigned char)c;
        }
    }
    if (text->vocab < 2) {
        snprintf(err, errlen, "the text has %d distinct characters; at least 2 are needed",
                 text->vocab);
        return -1;
    }
    text->train = malloc(len * sizeof(int));
    text->val = malloc((len / 10 + GPT_SPLIT_BLOCK) * sizeof(int));
    if (!text->train || !text->val) {
        snprintf(err, errlen, "out of memory for %zu characters", len);
        return -1;
    }
    for (size_t i = 0; i < len; i++) {
        int id = text->stoi[(unsigned char)data[i]];
        if (gpt_is_val(i))
            text->val[text->val_len++] = id;
        else
            text->train[text->train_len++] = id;
    }
    return 0;
}

int gpt_text_load(gpt_text_t *text, const char *path, const char *dir, long words, char *err,
                  size_t errlen)
{
    buf_t b = {0};
    int files = 1;
    memset(text, 0, sizeof *text);
    if (path) {
        struct stat st;
        if (stat(path, &st) != 0) {
            snprintf(err, errlen, "--data %s: %s", path, strerror(errno));
            return -1;
        }
        if (!S_ISREG(st.st_mode)) {
            snprintf(err, errlen, "--data %s: not a regular file", path);
            return -1;
        }
        if (append_file(&b, path, 0, err, errlen))
            goto err_free;
    } else if (load_fortunes(&b, dir ? dir : GPT_FORTUNES_DIR, &files, err, errlen)) {
        goto err_free;
    }

    text->words = words > 0;
    if (words > 0 ? gpt_words_build(text, b.data, b.len, words, err, errlen)
                  : bytes_build(text, b.data, b.len, err, errlen))
        goto err_free;
    text->raw_len = b.len;
    text->files = files;
    free(b.data);
    return 0;

err_free:
    free(b.data);
    gpt_text_free(text);
    return -1;
}

void gpt_text_free(gpt_text_t *text)
{
    free(text->train);
    free(text->val);
    free(text->val_bytes);
    free(text->val_spell);
    free(text->word_pool);
    free(text->word_off);
    text->train = text->val = text->val_bytes = NULL;
    text->val_spell = NULL;
    text->word_pool = NULL;
    text->word_off = NULL;
    text->train_len = text->val_len = 0;
}

size_t gpt_token_text(const gpt_text_t *text, int id, const char **s)
{
    if (!text->words) {
        *s = (const char *)&text->itos[id];
        return 1;
    }
    if (id == text->unk) {
        *s = GPT_UNK_TEXT;
        return sizeof GPT_UNK_TEXT - 1;
    }
    *s = text->word_pool + text->word_off[id];
    return text->word_off[id + 1] - text->word_off[id];
}

uint64_t gpt_vocab_hash(const gpt_text_t *text)
{
    /* FNV-1a over the kind, then each spelling with its length, so "ab","c" != "a","bc" */
    uint64_t h = 0xcbf29ce484222325ull;
    const uint64_t prime = 0x100000001b3ull;
    h = (h ^ (uint64_t)text->words) * prime;
    for (int id = 0; id < text->vocab; id++) {
        const char *s;
        size_t n = gpt_token_text(text, id, &s);
        h = (h ^ (uint64_t)n) * prime;
        for (size_t i = 0; i < n; i++)
            h = (h ^ (unsigned char)s[i]) * prime;
    }
    return h;
}

double gpt_unigram_entropy(const int *ids, size_t n, int vocab)
{
    if (n == 0)
        return 0;
    size_t *count = calloc((size_t)vocab, sizeof *count);
    if (!count)
        return NAN;
    for (size_t i = 0; i < n; i++)
        count[ids[i]]++;
    double h = 0;
    for (int c = 0; c < vocab; c++) {
        if (count[c]) {
            double p = (double)count[c] / (double)n;
            h -= p * log(p);
        }
    }
    free(count);
    return h;
}
