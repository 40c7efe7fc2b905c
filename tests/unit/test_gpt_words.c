/*
 * test_gpt_words: dear-gpt's word vocabulary (apps/gpt/words.c) against a reference built here
 * another way (every training token copied out, sorted, counted in runs, ranked), and the input
 * embedding's gradient of a word-level batch against the batch's own token ids: non-zero on
 * exactly the rows of its distinct tokens, far fewer than the vocabulary. model.c is built in
 * float here, as the trainer runs it.
 */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "apps/gpt/model.h"
#include "apps/gpt/text.h"
#include "tests/unit/ck_run.h"

#define NWORDS 3000             /* word spellings the generator draws from */
#define TEXT_BYTES (20 * 4096)  /* 20 blocks: blocks 9 and 19 are validation */
#define VAL_ONLY "zzvalonly"    /* planted once in a validation block */

static uint64_t g_rng = 2024;

static double urand(void)
{
    g_rng = g_rng * 6364136223846793005ull + 1442695040888963407ull;
    return (double)(g_rng >> 11) / 9007199254740992.0;
}

/* Write the test text: words drawn with Zipf-like frequencies (log-uniform ranks), so many
 * counts tie; separators of one or two bytes, digits and UTF-8 letters in a few words. Returns
 * its bytes (malloc) and length; the file is at path. */
static char *write_text(char *path, size_t *len)
{
    char *buf = malloc(TEXT_BYTES + 64);
    size_t n = 0;
    int planted = 0;
    ck_assert_ptr_nonnull(buf);
    while (n < TEXT_BYTES) {
        if (!planted && n > 9 * 4096 + 100) {
            n += (size_t)sprintf(buf + n, "%s ", VAL_ONLY);
            planted = 1;
        }
        int w = (int)exp(urand() * log((double)NWORDS)) - 1;
        char word[16];
        int k = 0;
        word[k++] = 'w';
        for (int x = w; k < 12; x /= 26) {
            word[k++] = (char)('a' + x % 26);
            if (x < 26)
                break;
        }
        word[k] = '\0';
        if (w % 97 == 5)
            strcpy(word + k, "\xc3\xa9"); /* UTF-8: stays inside the word */
        else if (w % 89 == 7)
            sprintf(word + k, "%d", w);
        double u = urand();
        const char *sep = u < 0.7 ? " " : u < 0.8 ? ", " : u < 0.9 ? ".\n" : u < 0.95 ? "\n" : "'";
        n += (size_t)sprintf(buf + n, "%s%s", word, sep);
    }
    FILE *f = fdopen(mkstemp(path), "w");
    ck_assert_ptr_nonnull(f);
    ck_assert_uint_eq(fwrite(buf, 1, n, f), n);
    fclose(f);
    *len = n;
    return buf;
}

/* ---- the reference: tokens by a byte-class table, counted by sorting ---- */

typedef struct {
    char *s;
    size_t count;
    int id;
} ref_tok_t;

typedef struct {
    ref_tok_t *u;               /* distinct training tokens, in strcmp order */
    size_t nu;
    ref_tok_t **ranked;         /* the same, by count then spelling */
} ref_vocab_t;

static int g_word_class[256];

static void classes_init(void)
{
    const char *w = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
    for (int c = 0; c < 256; c++)
        g_word_class[c] = c >= 128 || (c && strchr(w, c) != NULL);
}

/* Cut text into tokens: calls fn(start, len) for each. */
static void ref_tokens(const char *text, size_t len, void (*fn)(void *, size_t, size_t), void *arg)
{
    size_t i = 0;
    while (i < len) {
        size_t j = i + 1;
        while (g_word_class[(unsigned char)text[i]] && j < len &&
               g_word_class[(unsigned char)text[j]])
            j++;
        fn(arg, i, j - i);
        i = j;
    }
}

typedef struct {
    const char *text;
    char **all;
    size_t n;
} collect_t;

static void collect_train(void *arg, size_t i, size_t n)
{
    collect_t *c = arg;
    if ((i / 4096) % 10 != 9)
        c->all[c->n++] = strndup(c->text + i, n);
}

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

static int cmp_ranked(const void *a, const void *b)
{
    const ref_tok_t *x = *(ref_tok_t *const *)a, *y = *(ref_tok_t *const *)b;
    if (x->count != y->count)
        return x->count > y->count ? -1 : 1;
    return strcmp(x->s, y->s);
}

static void ref_build(ref_vocab_t *r, const char *text, size_t len)
{
    collect_t c = {text, malloc(len * sizeof(char *)), 0};
    ref_tokens(text, len, collect_train, &c);
    qsort(c.all, c.n, sizeof *c.all, cmp_str);
    r->u = malloc(c.n * sizeof *r->u);
    r->nu = 0;
    for (size_t i = 0; i < c.n; i++) {
        if (r->nu > 0 && strcmp(r->u[r->nu - 1].s, c.all[i]) == 0) {
            r->u[r->nu - 1].count++;
            free(c.all[i]);
        } else {
            r->u[r->nu++] = (ref_tok_t){c.all[i], 1, -1};
        }
    }
    free(c.all);
    r->ranked = malloc(r->nu * sizeof *r->ranked);
    for (size_t i = 0; i < r->nu; i++)
        r->ranked[i] = &r->u[i];
    qsort(r->ranked, r->nu, sizeof *r->ranked, cmp_ranked);
}

static void ref_free(ref_vocab_t *r)
{
    for (size_t i = 0; i < r->nu; i++)
        free(r->u[i].s);
    free(r->u);
    free(r->ranked);
}

/* The reference's id of s[0..n) for a vocabulary of k words: its rank, or k. */
static int ref_id(const ref_vocab_t *r, int k, const char *s, size_t n)
{
    char *key = strndup(s, n);
    size_t lo = 0, hi = r->nu;
    int id = k;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        int c = strcmp(r->u[mid].s, key);
        if (c == 0) {
            for (int i = 0; i < k; i++)
                if (r->ranked[i] == &r->u[mid])
                    id = i;
            break;
        }
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    free(key);
    return id;
}

/* Compares every token of the text with the loaded ids, and the spelling costs with a byte
 * unigram counted here from the training text's unknown tokens. */
typedef struct {
    const char *text;
    const ref_vocab_t *ref;
    const gpt_text_t *t;
    int k;
    size_t train_i, val_i, bytes;
    double unk_count[257], unk_total;
    int pass;                   /* 0: count the speller, 1: check */
} walk_t;

static void walk(void *arg, size_t i, size_t n)
{
    walk_t *w = arg;
    int id = ref_id(w->ref, w->k, w->text + i, n);
    if ((i / 4096) % 10 != 9) {
        if (w->pass == 0 && id == w->k) {
            for (size_t j = 0; j < n; j++)
                w->unk_count[(unsigned char)w->text[i + j]]++;
            w->unk_count[256]++;
            w->unk_total += (double)n + 1;
        }
        if (w->pass == 1)
            ck_assert_int_eq(w->t->train[w->train_i], id);
        w->train_i++;
        return;
    }
    if (w->pass == 1) {
        ck_assert_int_eq(w->t->val[w->val_i], id);
        ck_assert_int_eq(w->t->val_bytes[w->val_i], (int)n);
        double spell = 0;
        if (id == w->k) {
            double total = w->unk_total + 257;
            spell = -log((w->unk_count[256] + 1) / total);
            for (size_t j = 0; j < n; j++)
                spell -= log((w->unk_count[(unsigned char)w->text[i + j]] + 1) / total);
        }
        ck_assert_double_eq_tol(w->t->val_spell[w->val_i], spell, 1e-9);
    }
    w->val_i++;
    w->bytes += n;
}

typedef struct {
    const char *text;
    size_t val_i, planted;
} find_t;

static void find_walk(void *arg, size_t i, size_t n)
{
    find_t *f = arg;
    if ((i / 4096) % 10 != 9)
        return;
    if (n == strlen(VAL_ONLY) && memcmp(f->text + i, VAL_ONLY, n) == 0)
        f->planted = f->val_i;
    f->val_i++;
}

/* The validation index of the planted word. */
static size_t find_planted(const char *text, size_t len)
{
    find_t f = {text, 0, (size_t)-1};
    ref_tokens(text, len, find_walk, &f);
    ck_assert_msg(f.planted != (size_t)-1, "the planted validation word is no token");
    return f.planted;
}

/* One text for every test, written and counted once (an unchecked fixture). */
static char g_path[] = "/tmp/test_gpt_wordsXXXXXX";
static char *g_text;
static size_t g_len;
static ref_vocab_t g_ref;

static void text_setup(void)
{
    classes_init();
    g_text = write_text(g_path, &g_len);
    ref_build(&g_ref, g_text, g_len);
}

static void text_teardown(void)
{
    ref_free(&g_ref);
    free(g_text);
    unlink(g_path);
}

static void check_against_reference(const gpt_text_t *t, const ref_vocab_t *ref, int k,
                                    const char *text, size_t len)
{
    ck_assert_int_eq(t->words, 1);
    ck_assert_int_eq(t->vocab, k + 1);
    ck_assert_int_eq(t->unk, k);
    ck_assert_uint_eq(t->distinct, ref->nu);
    for (int id = 0; id < k; id++) {
        const char *s;
        size_t n = gpt_token_text(t, id, &s);
        ck_assert_uint_eq(n, strlen(ref->ranked[id]->s));
        ck_assert_msg(memcmp(s, ref->ranked[id]->s, n) == 0, "id %d: '%.*s', reference '%s'", id,
                      (int)n, s, ref->ranked[id]->s);
    }
    const char *s;
    ck_assert_str_eq((gpt_token_text(t, k, &s), s), GPT_UNK_TEXT);
    walk_t w = {.text = text, .ref = ref, .t = t, .k = k};
    ref_tokens(text, len, walk, &w);
    w.pass = 1;
    w.train_i = w.val_i = w.bytes = 0;
    ref_tokens(text, len, walk, &w);
    ck_assert_uint_eq(w.train_i, t->train_len);
    ck_assert_uint_eq(w.val_i, t->val_len);
}

START_TEST(test_vocab)
{
    const char *path = g_path, *text = g_text;
    const size_t len = g_len;
    const ref_vocab_t ref = g_ref;
    ck_assert_uint_gt(ref.nu, 1000); /* the case is worth testing: many words, many ties */
    char err[256];
    gpt_text_t t, again, small;
    const int k = 500;
    ck_assert_int_eq(gpt_text_load(&t, path, NULL, k, err, sizeof err), 0);
    check_against_reference(&t, &ref, k, text, len);
    ck_assert_uint_gt(t.train_unk, 0);

    /* the word seen only in validation is unknown, and spelling it out costs something */
    size_t planted = find_planted(text, len);
    ck_assert_int_eq(t.val[planted], t.unk);
    ck_assert_double_gt(t.val_spell[planted], 0);

    /* deterministic: again the same ids; a smaller K is a prefix of the same ranking */
    ck_assert_int_eq(gpt_text_load(&again, path, NULL, k, err, sizeof err), 0);
    ck_assert_uint_eq(gpt_vocab_hash(&again), gpt_vocab_hash(&t));
    ck_assert_int_eq(memcmp(again.train, t.train, t.train_len * sizeof *t.train), 0);
    ck_assert_int_eq(memcmp(again.val, t.val, t.val_len * sizeof *t.val), 0);
    ck_assert_int_eq(gpt_text_load(&small, path, NULL, 50, err, sizeof err), 0);
    check_against_reference(&small, &ref, 50, text, len);
    ck_assert_uint_ne(gpt_vocab_hash(&small), gpt_vocab_hash(&t));
    gpt_text_free(&t);
    gpt_text_free(&again);
    gpt_text_free(&small);

    /* every distinct token: nothing in the training text is unknown */
    ck_assert_int_eq(gpt_text_load(&t, path, NULL, (long)ref.nu, err, sizeof err), 0);
    ck_assert_uint_eq(t.train_unk, 0);
    ck_assert_uint_ge(t.val_unk, 1); /* the planted word */
    gpt_text_free(&t);
}
END_TEST

START_TEST(test_vocab_bad_size)
{
    gpt_text_t t;
    char err[256], want[64];
    ck_assert_int_eq(gpt_text_load(&t, g_path, NULL, (long)g_ref.nu + 1, err, sizeof err), -1);
    snprintf(want, sizeof want, "has %zu distinct tokens", g_ref.nu);
    ck_assert_msg(strstr(err, want) && strstr(err, "--vocab-size"), "message: %s", err);
    ck_assert_int_eq(gpt_text_load(&t, g_path, NULL, -3, err, sizeof err), 0); /* < 0: bytes */
    ck_assert_int_eq(t.words, 0);
    gpt_text_free(&t);
}
END_TEST

/* ---- the input embedding's gradient of a word-level batch ---- */

START_TEST(test_embedding_grad_sparse)
{
    gpt_text_t t;
    char err[256];
    ck_assert_int_eq(gpt_text_load(&t, g_path, NULL, 2000, err, sizeof err), 0);
    gpt_config_t cfg = {.vocab = t.vocab, .max_seq = 32, .layers = 1, .heads = 2, .dim = 16};
    const int B = 4, T = 32, C = cfg.dim, V = cfg.vocab;
    gpt_model_t m;
    ck_assert_int_eq(gpt_model_init(&m, &cfg, B, 7, err, sizeof err), 0);
    ck_assert_ptr_ne(m.params.wte, m.params.lmw); /* input and output embeddings are untied */
    int inputs[4 * 32], targets[4 * 32];
    for (int b = 0; b < B; b++) {
        size_t off = (size_t)(urand() * (double)(t.train_len - T - 1));
        for (int i = 0; i < T; i++) {
            inputs[b * T + i] = t.train[off + i];
            targets[b * T + i] = t.train[off + i + 1];
        }
    }
    ck_assert_int_eq(gpt_forward(&m, inputs, targets, B, T, NULL), 0);
    ck_assert_int_eq(gpt_backward(&m, NULL), 0);
    /* the distinct ids of the batch, from the ids alone */
    char *in_batch = calloc((size_t)V, 1);
    int distinct = 0;
    for (int i = 0; i < B * T; i++) {
        if (!in_batch[inputs[i]]) {
            in_batch[inputs[i]] = 1;
            distinct++;
        }
    }
    int nonzero = 0, lm_rows = 0;
    for (int v = 0; v < V; v++) {
        int nz = 0, lm = 0;
        for (int c = 0; c < C; c++) {
            nz |= m.grads.wte[(size_t)v * C + c] != 0;
            lm |= m.grads.lmw[(size_t)v * C + c] != 0;
        }
        ck_assert_msg(nz == (in_batch[v] != 0), "row %d: gradient %s, in the batch %d", v,
                      nz ? "non-zero" : "zero", in_batch[v]);
        nonzero += nz;
        lm_rows += lm;
    }
    ck_assert_int_eq(nonzero, distinct);
    ck_assert_int_lt(8 * nonzero, V); /* far fewer rows than the vocabulary */
    ck_assert_int_eq(lm_rows, V);     /* while the output projection's gradient is dense */
    free(in_batch);
    gpt_model_free(&m);
    gpt_text_free(&t);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("gpt_words");
    TCase *tc = tcase_create("words");
    tcase_set_timeout(tc, 60);
    tcase_add_unchecked_fixture(tc, text_setup, text_teardown);
    tcase_add_test(tc, test_vocab);
    tcase_add_test(tc, test_vocab_bad_size);
    tcase_add_test(tc, test_embedding_grad_sparse);
    suite_add_tcase(s, tc);
    return dear_ck_run(s);
}
