/*
 * data.c: IDX file loading for dear-cnn. An IDX file is a big-endian header (magic 0x000008TT
 * with TT the number of dimensions, then one uint32 per dimension) followed by the bytes.
 * gzopen reads both the .gz files Debian ships and uncompressed copies, so --data may point
 * at either.
 */
#include "apps/cnn/data.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zlib.h>

/* Reads exactly len bytes; 0 on success, else -1 with the reason in err. */
static int gz_read_all(gzFile gz, const char *path, void *buf, size_t len, const char *what,
                       char *err, size_t errlen)
{
    size_t done = 0;
    while (done < len) {
        size_t chunk = len - done > (1u << 30) ? (1u << 30) : len - done;
        int n = gzread(gz, (char *)buf + done, (unsigned)chunk);
        if (n < 0) {
            int zerr;
            const char *msg = gzerror(gz, &zerr);
            snprintf(err, errlen, "%s: cannot read %s: %s (corrupt gzip stream?)", path, what,
                     zerr == Z_ERRNO ? strerror(errno) : msg);
            return -1;
        }
        if (n == 0) {
            snprintf(err, errlen, "%s: malformed IDX file: %s ends after %zu of %zu bytes", path,
                     what, done, len);
            return -1;
        }
        done += (size_t)n;
    }
    return 0;
}

static uint32_t be32(const unsigned char *p)
{
    return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | p[3];
}

int cnn_idx_read(const char *path, uint32_t expect_magic, int limit, uint32_t dims_out[3],
                 uint8_t **data, char *err, size_t errlen)
{
    uint32_t dims[3];
    gzFile gz = gzopen(path, "rb");
    if (!gz) {
        snprintf(err, errlen, "cannot open %s: %s", path, errno ? strerror(errno) : "gzopen failed");
        return -1;
    }
    uint8_t *buf = NULL;
    unsigned char hdr[16];
    if (gz_read_all(gz, path, hdr, 4, "the header", err, errlen) != 0)
        goto err_close;
    uint32_t magic = be32(hdr);
    if (magic != expect_magic) {
        snprintf(err, errlen,
                 "%s: malformed IDX file: magic 0x%08x, expected 0x%08x (unsigned bytes, %u "
                 "dimensions)",
                 path, magic, expect_magic, expect_magic & 0xff);
        goto err_close;
    }
    uint32_t ndim = magic & 0xff;
    if (ndim < 1 || ndim > 3) {
        snprintf(err, errlen, "%s: IDX files with %u dimensions are not supported", path, ndim);
        goto err_close;
    }
    if (gz_read_all(gz, path, hdr + 4, 4 * ndim, "the header", err, errlen) != 0)
        goto err_close;
    size_t total, per_item = 1;
    for (uint32_t d = 0; d < 3; d++)
        dims[d] = d < ndim ? be32(hdr + 4 + 4 * d) : 1;
    for (uint32_t d = 0; d < ndim; d++) {
        if (dims[d] == 0 || dims[d] > (1u << 24)) {
            snprintf(err, errlen, "%s: malformed IDX file: dimension %u is %u (expected 1..%u)",
                     path, d, dims[d], 1u << 24);
            goto err_close;
        }
        if (d > 0)
            per_item *= dims[d];
    }
    if (limit > 0 && (uint32_t)limit < dims[0])
        dims[0] = (uint32_t)limit;
    total = per_item * dims[0];
    buf = malloc(total);
    if (!buf) {
        snprintf(err, errlen, "%s: out of memory for %zu bytes", path, total);
        goto err_close;
    }
    if (gz_read_all(gz, path, buf, total, "the data", err, errlen) != 0)
        goto err_free;
    gzclose(gz);
    memcpy(dims_out, dims, sizeof dims);
    *data = buf;
    return 0;

err_free:
    free(buf);
err_close:
    gzclose(gz);
    return -1;
}

/* dir/name.gz if it exists, else dir/name if it exists; -1 (with the message) if neither. */
static int find_file(char *path, size_t len, const char *dir, const char *name, char *err,
                     size_t errlen)
{
    snprintf(path, len, "%s/%s.gz", dir, name);
    if (access(path, R_OK) == 0)
        return 0;
    snprintf(path, len, "%s/%s", dir, name);
    if (access(path, R_OK) == 0)
        return 0;
    snprintf(err, errlen,
             "cannot read %s/%s.gz: %s. Install Debian's %s package (apt-get install %s) or "
             "point --data at a folder with the Fashion-MNIST IDX files",
             dir, name, strerror(errno), CNN_DATA_PACKAGE, CNN_DATA_PACKAGE);
    return -1;
}

int cnn_data_load(const char *dir, const char *prefix, int limit, cnn_dataset_t *out, char *err,
                  size_t errlen)
{
    char ipath[4096], lpath[4096], name[256];
    uint32_t idims[3], ldims[3];
    uint8_t *images = NULL, *labels = NULL;

    snprintf(name, sizeof name, "%s-images-idx3-ubyte", prefix);
    if (find_file(ipath, sizeof ipath, dir, name, err, errlen) != 0)
        return -1;
    snprintf(name, sizeof name, "%s-labels-idx1-ubyte", prefix);
    if (find_file(lpath, sizeof lpath, dir, name, err, errlen) != 0)
        return -1;
    if (cnn_idx_read(ipath, 0x00000803, limit, idims, &images, err, errlen) != 0)
        return -1;
    if (cnn_idx_read(lpath, 0x00000801, limit, ldims, &labels, err, errlen) != 0)
        goto err_images;
    if (idims[0] != ldims[0]) {
        snprintf(err, errlen, "%s holds %u images but %s holds %u labels", ipath, idims[0], lpath,
                 ldims[0]);
        goto err_labels;
    }
    for (uint32_t i = 0; i < ldims[0]; i++)
        if (labels[i] > 9) {
            snprintf(err, errlen, "%s: malformed: label %u of image %u (expected 0..9)", lpath,
                     labels[i], i);
            goto err_labels;
        }
    out->n = (int)idims[0];
    out->rows = (int)idims[1];
    out->cols = (int)idims[2];
    out->images = images;
    out->labels = labels;
    return 0;

err_labels:
    free(labels);
err_images:
    free(images);
    return -1;
}

void cnn_data_free(cnn_dataset_t *ds)
{
    free(ds->images);
    free(ds->labels);
    memset(ds, 0, sizeof *ds);
}
