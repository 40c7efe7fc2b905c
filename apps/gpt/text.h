/*
 * text.h: the training text of dear-gpt: loading (Debian's fortunes or any file), the
 * character vocabulary, the train/validation split and the unigram baseline.
 *
 * A "character" is a byte: UTF-8 text is modelled byte by byte, which keeps the vocabulary
 * small (the distinct bytes of the data) and needs no decoder.
 */
#ifndef DEAR_APPS_GPT_TEXT_H
#define DEAR_APPS_GPT_TEXT_H

#include <stddef.h>

#define GPT_FORTUNES_DIR "/usr/share/games/fortunes"

typedef struct {
    int vocab;                  /* distinct bytes in the text */
    unsigned char itos[256];    /* id -> byte */
    int stoi[256];              /* byte -> id, -1 if absent */
    int *train, *val;           /* token ids */
    size_t train_len, val_len;
    size_t raw_len;             /* bytes loaded */
    int files;                  /* files concatenated (1 for --data) */
} gpt_text_t;

/* Load the plain-text fortune files of dir (regular files only: the .dat indexes and the .u8
 * links are skipped), in byte order of their names so every run and every rank sees the same
 * text; the "%" lines between fortunes become blank lines. Or, with path != NULL, load that
 * one file. Then build the vocabulary and split: every tenth block of 4 KiB goes to validation,
 * so both sets mix all sources. Returns 0, or -1 with a message (naming the Debian package when
 * the fortunes are missing) in err. */
int gpt_text_load(gpt_text_t *text, const char *path, const char *dir, char *err, size_t errlen);
void gpt_text_free(gpt_text_t *text);

/* Entropy in nats of the character distribution of ids: the loss of the best model that
 * ignores context (the unigram baseline). */
double gpt_unigram_entropy(const int *ids, size_t n, int vocab);

#endif /* DEAR_APPS_GPT_TEXT_H */
