/*
 * test_cnn_data: the IDX loader of dear-cnn (apps/cnn/data.c). Writes small IDX files (gzip and
 * plain) into a temporary folder, reads them back and compares every byte; then checks that
 * each kind of damage (missing file, bad magic, truncation, bad label, count mismatch, corrupt
 * gzip) is refused with a message saying what is wrong.
 */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zlib.h>

#include "apps/cnn/data.h"

static char dir[256];

static void put_be32(unsigned char *p, uint32_t v)
{
    p[0] = (unsigned char)(v >> 24), p[1] = (unsigned char)(v >> 16);
    p[2] = (unsigned char)(v >> 8), p[3] = (unsigned char)v;
}

/* Write an IDX file (magic, dims, then len data bytes), gzip'ed or plain. */
static void write_idx(const char *name, int gz, uint32_t magic, int ndim, const uint32_t *dims,
                      const uint8_t *data, size_t len)
{
    char path[512];
    unsigned char hdr[16];
    put_be32(hdr, magic);
    for (int d = 0; d < ndim; d++)
        put_be32(hdr + 4 + 4 * d, dims[d]);
    snprintf(path, sizeof path, "%s/%s%s", dir, name, gz ? ".gz" : "");
    if (gz) {
        gzFile f = gzopen(path, "wb");
        ck_assert_ptr_nonnull(f);
        ck_assert_int_eq(gzwrite(f, hdr, 4 + 4 * ndim), 4 + 4 * ndim);
        if (len)
            ck_assert_int_eq(gzwrite(f, data, (unsigned)len), (int)len);
        ck_assert_int_eq(gzclose(f), Z_OK);
    } else {
        FILE *f = fopen(path, "wb");
        ck_assert_ptr_nonnull(f);
        ck_assert_uint_eq(fwrite(hdr, 1, 4 + 4 * ndim, f), 4 + 4 * ndim);
        if (len)
            ck_assert_uint_eq(fwrite(data, 1, len, f), len);
        fclose(f);
    }
}

static void clear_dir(void)
{
    const char *names[] = {"train-images-idx3-ubyte", "train-labels-idx1-ubyte"};
    char path[512];
    for (int i = 0; i < 2; i++) {
        snprintf(path, sizeof path, "%s/%s.gz", dir, names[i]);
        unlink(path);
        snprintf(path, sizeof path, "%s/%s", dir, names[i]);
        unlink(path);
    }
}

enum { N = 7, R = 4, C = 3 };
static uint8_t images[N * R * C], labels[N];

/* A valid pair of files; gz selects compression of each. */
static void write_valid(int gz_images, int gz_labels)
{
    uint32_t idims[3] = {N, R, C}, ldims[1] = {N};
    write_idx("train-images-idx3-ubyte", gz_images, 0x803, 3, idims, images, sizeof images);
    write_idx("train-labels-idx1-ubyte", gz_labels, 0x801, 1, ldims, labels, sizeof labels);
}

static void setup(void)
{
    snprintf(dir, sizeof dir, "/tmp/test_cnn_data.XXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(dir));
    for (size_t i = 0; i < sizeof images; i++)
        images[i] = (uint8_t)(i * 37 + 11);
    for (int i = 0; i < N; i++)
        labels[i] = (uint8_t)((i * 3) % 10);
}

static void teardown(void)
{
    clear_dir();
    rmdir(dir);
}

START_TEST(test_roundtrip)
{
    for (int mode = 0; mode < 2; mode++) { /* gzip, then plain files */
        clear_dir();
        write_valid(mode == 0, mode == 0);
        cnn_dataset_t ds;
        char err[1024];
        ck_assert_msg(cnn_data_load(dir, "train", 0, &ds, err, sizeof err) == 0, "%s", err);
        ck_assert_int_eq(ds.n, N);
        ck_assert_int_eq(ds.rows, R);
        ck_assert_int_eq(ds.cols, C);
        ck_assert_mem_eq(ds.images, images, sizeof images);
        ck_assert_mem_eq(ds.labels, labels, sizeof labels);
        cnn_data_free(&ds);
        /* limit keeps the first images only */
        ck_assert_int_eq(cnn_data_load(dir, "train", 3, &ds, err, sizeof err), 0);
        ck_assert_int_eq(ds.n, 3);
        ck_assert_mem_eq(ds.images, images, 3 * R * C);
        ck_assert_mem_eq(ds.labels, labels, 3);
        cnn_data_free(&ds);
    }
}
END_TEST

static void expect_error(const char *needle)
{
    cnn_dataset_t ds;
    char err[1024] = "";
    ck_assert_int_eq(cnn_data_load(dir, "train", 0, &ds, err, sizeof err), -1);
    ck_assert_msg(strstr(err, needle) != NULL, "error '%s' does not mention '%s'", err, needle);
}

START_TEST(test_missing)
{
    clear_dir();
    expect_error("dataset-fashion-mnist");
    write_valid(1, 1);
    char path[512];
    snprintf(path, sizeof path, "%s/train-labels-idx1-ubyte.gz", dir);
    unlink(path);
    expect_error("train-labels-idx1-ubyte");
}
END_TEST

START_TEST(test_malformed)
{
    uint32_t idims[3] = {N, R, C}, ldims[1] = {N};
    /* bad magic */
    clear_dir();
    write_valid(1, 1);
    write_idx("train-images-idx3-ubyte", 1, 0x801, 3, idims, images, sizeof images);
    expect_error("magic");
    /* truncated data */
    clear_dir();
    write_valid(1, 1);
    write_idx("train-images-idx3-ubyte", 1, 0x803, 3, idims, images, sizeof images - 5);
    expect_error("ends after");
    /* truncated header */
    clear_dir();
    write_valid(1, 1);
    write_idx("train-labels-idx1-ubyte", 1, 0x801, 0, ldims, labels, 0);
    expect_error("ends after");
    /* label out of range */
    clear_dir();
    write_valid(1, 1);
    uint8_t bad[N];
    memcpy(bad, labels, N);
    bad[4] = 12;
    write_idx("train-labels-idx1-ubyte", 1, 0x801, 1, ldims, bad, N);
    expect_error("label 12");
    /* images and labels disagree on the count */
    clear_dir();
    write_valid(1, 1);
    uint32_t l6[1] = {N - 1};
    write_idx("train-labels-idx1-ubyte", 1, 0x801, 1, l6, labels, N - 1);
    expect_error("labels");
    /* zero dimension */
    clear_dir();
    write_valid(1, 1);
    uint32_t z[3] = {N, 0, C};
    write_idx("train-images-idx3-ubyte", 1, 0x803, 3, z, images, 0);
    expect_error("dimension 1 is 0");
    /* corrupt gzip stream: a valid gzip file with its deflate data damaged */
    clear_dir();
    write_valid(1, 1);
    char path[512];
    snprintf(path, sizeof path, "%s/train-images-idx3-ubyte.gz", dir);
    FILE *f = fopen(path, "r+b");
    ck_assert_ptr_nonnull(f);
    fseek(f, 12, SEEK_SET);
    unsigned char junk[16];
    memset(junk, 0xA5, sizeof junk);
    fwrite(junk, 1, sizeof junk, f);
    fclose(f);
    expect_error("train-images-idx3-ubyte.gz");
}
END_TEST

int main(void)
{
    Suite *s = suite_create("cnn_data");
    TCase *tc = tcase_create("idx");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, test_roundtrip);
    tcase_add_test(tc, test_missing);
    tcase_add_test(tc, test_malformed);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
