/*
 * words.c: the word vocabulary of dear-gpt (see text.h): cuts the text into tokens, counts the
 * training tokens in a hash table, keeps the K most frequent with a tie-break every rank
 * repeats, maps both sets to ids (the rest to the unknown token), and prices spelling out each
 * unknown validation word so that losses per character stay exact.
 */
#include "apps/gpt/text.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The length of the token that starts at data[i]: a run of word bytes, or one other byte. */
static size_t token_len(const char *data, size_t len, size_t i)
{
    size_t j = i + 1;
    if (gpt_is_word_byte((unsigned char)data[i]))
        while (j < len && gpt_is_word_byte((unsigned char)data[j]))
            j++;
    return j - i;
}

/* ------------------------------------------------------------------------------------------ */
/* Counting: open addressing over spellings that point into the text */

typedef struct {
    const char *s;      /* NULL: empty slot */
    size_t n;
    size_t count;       /* occurrences in the training text */
    int id;             /* after ranking: the token's id, or the unknown token's */
} entry_t;

typedef struct {
    entry_t *slots;
    size_t cap, used;   /* cap a power of two, kept at least twice used */
} table_t;

static uint64_t hash_bytes(const char *s, size_t n)
{
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < n; i++)
        h = (h ^ (unsigned char)s[i]) * 0x100000001b3ull;
    return h;
}

static entry_t *table_find(const table_t *t, const char *s, size_t n)
{
    size_t i = (size_t)hash_bytes(s, n) & (t->cap - 1);
    while (t->slots[i].s && (t->slots[i].n != n || memcmp(t->slots[i].s, s, n) != 0))
        i = (i + 1) & (t->cap - 1);
    return &t->slots[i];
}

static int table_grow(table_t *t)
{
    table_t g = {calloc(2 * t->cap, sizeof(entry_t)), 2 * t->cap, t->used};
    if (!g.slots)
        return -1;
    for (size_t i = 0; i < t->cap; i++)
        if (t->slots[i].s)
            *table_find(&g, t->slots[i].s, t->slots[i].n) = t->slots[i];
    free(t->slots);
    *t = g;
    return 0;
}

/* Count one more occurrence of s[0..n). */
static int table_add(table_t *t, const char *s, size_t n)
{
    if (2 * (t->used + 1) > t->cap && table_grow(t))
        return -1;
    entry_t *e = table_find(t, s, n);
    if (!e->s) {
        *e = (entry_t){.s = s, .n = n};
        t->used++;
    }
    e->count++;
    return 0;
}

/* Most frequent first; equal counts in byte order of the spelling, a shorter prefix first:
 * a total order on distinct spellings, so every rank ranks alike. */
static int cmp_rank(const void *pa, const void *pb)
{
    const entry_t *a = *(entry_t *const *)pa, *b = *(entry_t *const *)pb;
    if (a->count != b->count)
        return a->count > b->count ? -1 : 1;
    int c = memcmp(a->s, b->s, a->n < b->n ? a->n : b->n);
    return c ? c : (a->n > b->n) - (a->n < b->n);
}

/* ------------------------------------------------------------------------------------------ */
/* Spelling out unknown words: a byte unigram with an end mark */

#define SPELL_END 256

/* -log q(c) for every byte and the end mark, from the bytes of the training text's unknown
 * words, each symbol counted once more (add-one), so any spelling has a finite cost. */
static void spell_model(const table_t *t, int unk, double nats[SPELL_END + 1])
{
    double count[SPELL_END + 1], total = SPELL_END + 1;
    for (int c = 0; c <= SPELL_END; c++)
        count[c] = 1;
    for (size_t i = 0; i < t->cap; i++) {
        const entry_t *e = &t->slots[i];
        if (!e->s || e->id != unk)
            continue;
        for (size_t j = 0; j < e->n; j++)
            count[(unsigned char)e->s[j]] += (double)e->count;
        count[SPELL_END] += (double)e->count;
        total += (double)e->count * (double)(e->n + 1);
    }
    for (int c = 0; c <= SPELL_END; c++)
        nats[c] = -log(count[c] / total);
}

static double spell_cost(const double nats[SPELL_END + 1], const char *s, size_t n)
{
    double cost = nats[SPELL_END];
    for (size_t i = 0; i < n; i++)
        cost += nats[(unsigned char)s[i]];
    return cost;
}

/* ------------------------------------------------------------------------------------------ */

/* Rank the counted tokens: the first k get ids 0..k-1 and their spellings go to the pool, the
 * rest get the unknown token k. */
static int rank_tokens(gpt_text_t *text, table_t *t, long k)
{
    entry_t **order = malloc(t->used * sizeof *order);
    size_t n = 0, bytes = 0;
    if (!order)
        return -1;
    for (size_t i = 0; i < t->cap; i++)
        if (t->slots[i].s)
            order[n++] = &t->slots[i];
    qsort(order, n, sizeof *order, cmp_rank);
    for (long i = 0; i < k; i++)
        bytes += order[i]->n;
    text->word_pool = malloc(bytes ? bytes : 1);
    text->word_off = malloc((size_t)(k + 1) * sizeof *text->word_off);
    if (!text->word_pool || !text->word_off) {
        free(order);
        return -1;
    }
    size_t off = 0;
    for (size_t i = 0; i < n; i++) {
        order[i]->id = i < (size_t)k ? (int)i : (int)k;
        if (i < (size_t)k) {
            text->word_off[i] = off;
            memcpy(text->word_pool + off, order[i]->s, order[i]->n);
            off += order[i]->n;
        }
    }
    text->word_off[k] = off;
    free(order);
    return 0;
}

int gpt_words_build(gpt_text_t *text, const char *data, size_t len, long k, char *err,
                    size_t errlen)
{
    table_t t = {calloc(1 << 16, sizeof(entry_t)), 1 << 16, 0};
    size_t ntok = 0, nval = 0;
    int rc = -1;
    if (!t.slots)
        goto err_nomem;
    for (size_t i = 0, n; i < len; i += n, ntok++) {
        n = token_len(data, len, i);
        if (gpt_is_val(i))
            nval++;
        else if (table_add(&t, data + i, n))
            goto err_nomem;
    }
    text->distinct = t.used;
    if (k < 1 || (size_t)k > t.used) {
        snprintf(err, errlen,
                 "--vocab-size %ld: the training text has %zu distinct tokens (words, and the "
                 "single bytes between them); pick 1 to %zu",
                 k, t.used, t.used);
        goto done;
    }
    if (rank_tokens(text, &t, k))
        goto err_nomem;
    text->vocab = (int)k + 1;
    text->unk = (int)k;

    double nats[SPELL_END + 1];
    spell_model(&t, text->unk, nats);
    text->train = malloc((ntok - nval + 1) * sizeof(int));
    text->val = malloc((nval + 1) * sizeof(int));
    text->val_bytes = malloc((nval + 1) * sizeof(int));
    text->val_spell = malloc((nval + 1) * sizeof(double));
    if (!text->train || !text->val || !text->val_bytes || !text->val_spell)
        goto err_nomem;
    for (size_t i = 0, n; i < len; i += n) {
        n = token_len(data, len, i);
        const entry_t *e = table_find(&t, data + i, n);
        /* a token the training text never had is unknown too */
        int id = e->s ? e->id : text->unk;
        if (gpt_is_val(i)) {
            text->val_bytes[text->val_len] = (int)n;
            text->val_spell[text->val_len] = id == text->unk ? spell_cost(nats, data + i, n) : 0;
            text->val_unk += id == text->unk;
            text->val[text->val_len++] = id;
        } else {
            text->train_unk += id == text->unk;
            text->train[text->train_len++] = id;
        }
    }
    rc = 0;
    goto done;

err_nomem:
    snprintf(err, errlen, "out of memory building the word vocabulary of %zu bytes", len);
done:
    free(t.slots);
    return rc;
}
