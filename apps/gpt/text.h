/*
 * text.h: the training text of dear-gpt: loading (Debian's fortunes or any file), the
 * vocabulary (characters, or words in words.c), the train/validation split and the unigram
 * baseline.
 *
 * A "character" is a byte: UTF-8 text is modelled byte by byte, which keeps the vocabulary
 * small (the distinct bytes of the data) and needs no decoder. A "word" is a maximal run of
 * word bytes (ASCII letters and digits, and every byte of 0x80 and above, so UTF-8 letters stay
 * inside their word); every other byte (space, newline, punctuation) is a token of its own, so
 * the tokens of a text spell it exactly.
 */
#ifndef DEAR_APPS_GPT_TEXT_H
#define DEAR_APPS_GPT_TEXT_H

#include <stddef.h>
#include <stdint.h>

#define GPT_FORTUNES_DIR "/usr/share/games/fortunes"
#define GPT_SPLIT_BLOCK 4096 /* bytes; every tenth block is validation */
#define GPT_UNK_TEXT "<unk>" /* how the unknown word prints */

/* Whether the byte at offset off of the text belongs to the validation set: every tenth block,
 * so both sets mix all sources. A word belongs where its first byte does. */
static inline int gpt_is_val(size_t off)
{
    return (off / GPT_SPLIT_BLOCK) % 10 == 9;
}

/* Whether byte c is part of a word (words.c); every other byte is a token by itself. */
static inline int gpt_is_word_byte(unsigned char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c >= 0x80;
}

typedef struct {
    int words;                  /* 0: one token per byte; 1: word tokens */
    int vocab;                  /* V: distinct bytes of the text, or K words + the unknown token */
    int unk;                    /* words: id of the unknown token (V - 1); -1 for bytes */
    unsigned char itos[256];    /* bytes: id -> byte */
    int stoi[256];              /* bytes: byte -> id, -1 if absent */
    char *word_pool;            /* words: the spellings of ids 0..V-2, back to back */
    size_t *word_off;           /* words: id's spelling is word_pool[word_off[id] .. word_off[id+1]) */
    size_t distinct;            /* words: distinct tokens of the training text */
    int *train, *val;           /* token ids */
    size_t train_len, val_len;
    int *val_bytes;             /* words: bytes of each validation token (bytes: NULL, 1 each) */
    double *val_spell;          /* words: nats the unknown-word speller pays for each validation
                                 * token, 0 unless it is the unknown token (bytes: NULL) */
    size_t train_unk, val_unk;  /* words: tokens that became the unknown token */
    size_t raw_len;             /* bytes loaded */
    int files;                  /* files concatenated (1 for --data) */
} gpt_text_t;

/* Load the plain-text fortune files of dir (regular files only: the .dat indexes and the .u8
 * links are skipped), in byte order of their names so every run and every rank sees the same
 * text; the "%" lines between fortunes become blank lines. Or, with path != NULL, load that
 * one file. Then build the vocabulary and split: a byte (or a word, by its first byte) goes to
 * validation when gpt_is_val says so. words = 0 gives the byte vocabulary; words = K > 0 the K
 * most frequent tokens of the training text and the unknown token (gpt_words_build). Returns 0,
 * or -1 with a message (naming the Debian package when the fortunes are missing, or the number
 * of distinct tokens when K exceeds it) in err. */
int gpt_text_load(gpt_text_t *text, const char *path, const char *dir, long words, char *err,
                  size_t errlen);
void gpt_text_free(gpt_text_t *text);

/* Build the word vocabulary of data[0..len) into text (words.c): the k most frequent tokens of
 * the training part, most frequent first, ties in byte order of their spelling (so every rank
 * builds the same), then the unknown token; the training and validation ids; and for each
 * validation token its bytes and what spelling it out costs when it is unknown. That cost comes
 * from a unigram model of the bytes of the training text's unknown words with an end mark
 * (add-one smoothed), so the word model's loss plus it is the loss of a model of the exact
 * characters. Returns 0, or -1 with a message in err. */
int gpt_words_build(gpt_text_t *text, const char *data, size_t len, long k, char *err,
                    size_t errlen);

/* The spelling of token id: its bytes in *s, their count returned (GPT_UNK_TEXT for the
 * unknown word). */
size_t gpt_token_text(const gpt_text_t *text, int id, const char **s);

/* A 64-bit fingerprint of the vocabulary (kind, size, every token's spelling in id order), for
 * checking that every rank built the same one. */
uint64_t gpt_vocab_hash(const gpt_text_t *text);

/* Entropy in nats of the token distribution of ids: the loss of the best model that ignores
 * context (the unigram baseline). */
double gpt_unigram_entropy(const int *ids, size_t n, int vocab);

#endif /* DEAR_APPS_GPT_TEXT_H */
