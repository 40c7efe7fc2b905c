/*
 * emu_nccl.h: between the NCCL API (emu_nccl.c: communicators, groups, checks, stream work) and
 * the shared-memory communicator under it (emu_coll.c: the ranks' rendezvous in /dev/shm, the
 * barrier, the shared error, and the collectives' data movement and arithmetic).
 */
#ifndef CUEMU_EMU_NCCL_H
#define CUEMU_EMU_NCCL_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

/* nccl.h declares ncclGroupStart() and ncclGroupEnd() without prototypes. */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wstrict-prototypes"
#include <nccl.h>
#pragma GCC diagnostic pop

#include "tests/cuda/emu/emu.h"

ncclResult_t ncclGroupStart(void);
ncclResult_t ncclGroupEnd(void);

/* The most ranks one communicator may have. */
#define EMU_MAX_RANKS 256

enum emu_coll_kind { EMU_COLL_ALLREDUCE, EMU_COLL_REDUCESCATTER, EMU_COLL_ALLGATHER, EMU_COLL_BROADCAST,
                     EMU_COLL_REDUCE, EMU_COLL_ALLTOALL };

/* What every rank must agree on for one collective; count is per rank (recvcount of a
 * reduce-scatter, sendcount of an all-gather). */
struct emu_opdesc {
    uint64_t seq; /* the collective's number on its communicator, from 1, in call order */
    int32_t kind, dtype, op, root;
    uint64_t count;
};

struct emu_coll {
    struct emu_opdesc d;
    const void *send; /* the application's addresses, translated when the collective runs */
    void *recv;
};

/* Who a rank is, for the duplicate-GPU check: NCCL compares host and PCI bus id. */
struct emu_ident {
    uint64_t host_hash; /* of NCCL_HOSTID, else the host name */
    int32_t cudev, phys;
    char busid[16];
};

struct emu_shm;

/* Element size of a supported type, 0 for the others. */
size_t emu_dtype_size(int dtype);
/* "AllReduce(count=10, float32, sum)" and the like. */
void emu_opdesc_str(const struct emu_opdesc *d, char *buf, size_t len);

/* Joins the communicator id names as rank of nranks: waits (CUEMU_NCCL_TIMEOUT_S) until every
 * rank has, checks that no two share a GPU. *abort, when set, gives up. On failure why says
 * what went wrong. */
ncclResult_t emu_shm_join(const ncclUniqueId *id, int nranks, int rank, const struct emu_ident *me,
                          const atomic_int *abort, struct emu_shm **out, char *why, size_t whylen);
/* Marks this rank as gone: peers that wait for it from now on fail. */
void emu_shm_leave(struct emu_shm *sh);
/* Unmaps (after emu_shm_leave, once no work of this rank can touch it). */
void emu_shm_close(struct emu_shm *sh);
/* The communicator's error as this rank sees it (ncclSuccess when none), its message in msg. */
ncclResult_t emu_shm_error(struct emu_shm *sh, char *msg, size_t len);
/* Sets the communicator's error unless one is set: code for this rank, peers for the others. */
void emu_shm_fail(struct emu_shm *sh, ncclResult_t code, ncclResult_t peers, const char *fmt, ...) EMU_PRINTF(4, 5);
/* Runs one collective with the peers: checks that they issued the same one, moves the data,
 * reduces. Blocks until the peers arrive, an error, or *abort. */
ncclResult_t emu_coll_run(struct emu_shm *sh, const struct emu_coll *c, const atomic_int *abort);

/* The unique id as the emulator fills it. */
struct emu_uid {
    uint32_t magic;
    int32_t creator_pid;
    uint64_t key;
};
#define EMU_UID_MAGIC 0x43554e31u

#endif
