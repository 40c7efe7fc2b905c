/*
 * data.h: Fashion-MNIST in IDX format (the files of Debian's dataset-fashion-mnist), read
 * with zlib so the .gz files are used as shipped. Pixels stay uint8 in memory (47 MB for the
 * training set instead of 188 MB in float per rank) and are normalised per batch.
 */
#ifndef CNN_DATA_H
#define CNN_DATA_H

#include <stddef.h>
#include <stdint.h>

#define CNN_DATA_DEFAULT_DIR "/usr/share/datasets/fashion-mnist"
#define CNN_DATA_PACKAGE "dataset-fashion-mnist"

typedef struct {
    int n;             /* images */
    int rows, cols;    /* image size */
    uint8_t *images;   /* n * rows * cols, row-major */
    uint8_t *labels;   /* n, each < 10 */
} cnn_dataset_t;

/* Load DIR/PREFIX-images-idx3-ubyte(.gz) and DIR/PREFIX-labels-idx1-ubyte(.gz), PREFIX "train"
 * or "t10k". limit > 0 keeps only the first limit images. Returns 0, or -1 with a message in err
 * naming the file and what is wrong (a missing file also names the Debian package). */
int cnn_data_load(const char *dir, const char *prefix, int limit, cnn_dataset_t *out, char *err,
                  size_t errlen);

void cnn_data_free(cnn_dataset_t *ds);

/* Read one IDX file: magic must be expect_magic (0x00000803 images, 0x00000801 labels). On
 * success dims holds the dimension sizes (1 past the file's own) and *data, malloc'ed, holds
 * their product in bytes, the first dimension cut to limit when limit > 0. */
int cnn_idx_read(const char *path, uint32_t expect_magic, int limit, uint32_t dims[3],
                 uint8_t **data, char *err, size_t errlen);

#endif /* CNN_DATA_H */
