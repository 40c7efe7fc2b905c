/*
 * The CUDA backend's front (cuda.h): devices and pointers, and a context's device side
 * (dear_cuda_open): the GPU of the calling thread, checked against every rank's; the transport
 * its collectives take; the communication stream; the memory row. Pinned host buffers of the
 * staged transport are placed on the GPU's NUMA node (hwloc, from the device's PCI bus id),
 * where the copies to and from it are the shortest.
 */
#include "config.h"

#include "cuda/cuda.h"

#include <hwloc.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/check.h"
#include "base/mpi_check.h"
#include "cuda/cuda_check.h"
#include "cuda/cuda_impl.h"

int dear_cuda_built(void) { return 1; }

int dear_nccl_built(void)
{
#ifdef HAVE_NCCL
    return 1;
#else
    return 0;
#endif
}

#ifndef HAVE_NCCL
int dear_nccl_alltoall(void) { return 0; } /* nccl.c's, with NCCL */
#endif

/* Asked once per process: devices do not come and go, and every registration asks. */
static pthread_once_t count_once = PTHREAD_ONCE_INIT;
static int count_n;
static cudaError_t count_err;

static void count_devices(void)
{
    count_err = cudaGetDeviceCount(&count_n);
    if (count_err != cudaSuccess) {
        DEAR_INFO("cuda", "cudaGetDeviceCount: %s", cudaGetErrorString(count_err));
        count_n = 0;
        cudaGetLastError();
    }
}

int dear_cuda_device_count(int *n)
{
    pthread_once(&count_once, count_devices);
    *n = count_n;
    return count_err == cudaSuccess ? DEAR_OK : DEAR_ERR_CUDA;
}

int dear_cuda_current_device(int *device)
{
    *device = -1;
    DEAR_CUDA_CHECK(cudaGetDevice(device));
    return DEAR_OK;
}

int dear_cuda_pointer_device(const void *p, size_t bytes, int *device)
{
    struct cudaPointerAttributes a;
    *device = -1;
    cudaError_t err = cudaPointerGetAttributes(&a, p);
    if (err != cudaSuccess) {
        cudaGetLastError(); /* not sticky: the next call must not see it */
        return DEAR_ERR_CUDA;
    }
    /* Plain host memory answers cudaMemoryTypeUnregistered since CUDA 11; pinned, Host. */
    if (a.type != cudaMemoryTypeDevice && a.type != cudaMemoryTypeManaged)
        return DEAR_OK;
    if (bytes > 1) { /* the whole range in the same device's memory */
        struct cudaPointerAttributes b;
        if (cudaPointerGetAttributes(&b, (const char *)p + bytes - 1) != cudaSuccess ||
            (b.type != cudaMemoryTypeDevice && b.type != cudaMemoryTypeManaged) || b.device != a.device) {
            cudaGetLastError();
            return DEAR_OK;
        }
    }
    *device = a.device;
    return DEAR_OK;
}

/* ---- pinned host memory on the GPU's NUMA node ---- */

typedef struct pinned {
    struct pinned *next;
    void *p;
    size_t bytes;
    int bound;                  /* hwloc allocation registered with CUDA (else cudaHostAlloc's) */
} pinned_t;

static pthread_mutex_t pinned_mu = PTHREAD_MUTEX_INITIALIZER;
static pinned_t *pinned_list;
static hwloc_topology_t pinned_topo;
static hwloc_nodeset_t pinned_nodes; /* NULL: no placement known */

/* The NUMA nodes nearest the GPU with PCI bus id `bus`, once per process. */
static void place_near(const char *bus)
{
    pthread_mutex_lock(&pinned_mu);
    if (pinned_topo == NULL && hwloc_topology_init(&pinned_topo) == 0) {
        hwloc_topology_set_io_types_filter(pinned_topo, HWLOC_TYPE_FILTER_KEEP_IMPORTANT);
        if (hwloc_topology_load(pinned_topo) != 0) {
            hwloc_topology_destroy(pinned_topo);
            pinned_topo = NULL;
        }
    }
    hwloc_obj_t dev = pinned_topo ? hwloc_get_pcidev_by_busidstring(pinned_topo, bus) : NULL;
    hwloc_obj_t near = dev ? hwloc_get_non_io_ancestor_obj(pinned_topo, dev) : NULL;
    if (near && near->nodeset && pinned_nodes == NULL) {
        pinned_nodes = hwloc_bitmap_dup(near->nodeset);
        char set[64];
        hwloc_bitmap_snprintf(set, sizeof set, pinned_nodes);
        DEAR_INFO("cuda", "pinned buffers on NUMA node(s) %s, the GPU's (%s)", set, bus);
    } else if (pinned_nodes == NULL) {
        DEAR_INFO("cuda", "hwloc does not place GPU %s: pinned buffers where cudaHostAlloc puts them", bus);
    }
    pthread_mutex_unlock(&pinned_mu);
}

int dear_cuda_pinned_alloc(size_t bytes, void **p)
{
    pinned_t *e = calloc(1, sizeof *e);
    if (e == NULL)
        return DEAR_ERR_NOMEM;
    e->bytes = bytes;
    pthread_mutex_lock(&pinned_mu);
    if (pinned_nodes) {
        e->p = hwloc_alloc_membind(pinned_topo, bytes, pinned_nodes, HWLOC_MEMBIND_BIND,
                                   HWLOC_MEMBIND_BYNODESET | HWLOC_MEMBIND_NOCPUBIND);
        if (e->p && cudaHostRegister(e->p, bytes, cudaHostRegisterPortable) == cudaSuccess) {
            e->bound = 1;
        } else if (e->p) {
            cudaGetLastError();
            hwloc_free(pinned_topo, e->p, bytes);
            e->p = NULL;
        }
    }
    pthread_mutex_unlock(&pinned_mu);
    if (e->p == NULL) {
        cudaError_t err = cudaHostAlloc(&e->p, bytes, cudaHostAllocPortable);
        if (err != cudaSuccess) {
            DEAR_ERROR("cuda", "cudaHostAlloc of %zu bytes of pinned memory failed: %s", bytes, cudaGetErrorString(err));
            free(e);
            return DEAR_ERR_NOMEM;
        }
    }
    pthread_mutex_lock(&pinned_mu);
    e->next = pinned_list;
    pinned_list = e;
    pthread_mutex_unlock(&pinned_mu);
    *p = e->p;
    return DEAR_OK;
}

void dear_cuda_pinned_free(void *p)
{
    pthread_mutex_lock(&pinned_mu);
    pinned_t **link = &pinned_list;
    while (*link && (*link)->p != p)
        link = &(*link)->next;
    pinned_t *e = *link;
    if (e)
        *link = e->next;
    pthread_mutex_unlock(&pinned_mu);
    if (e == NULL)
        return;
    if (e->bound) {
        cudaHostUnregister(e->p);
        hwloc_free(pinned_topo, e->p, e->bytes);
    } else {
        cudaFreeHost(e->p);
    }
    free(e);
}

/* ---- a context's device side ---- */

struct dear_cuda {
    int dev;
    const dear_mem_ops_t *row;
    dear_memq_t *comm;
    dear_transport_t *nccl;
};

#define BUS_LEN 32
#define HOST_LEN 64

typedef struct {
    char host[HOST_LEN];
    char bus[BUS_LEN];
    int ok;
} where_t;

/* Every rank's host and GPU; *shared_a < *shared_b: the first two ranks on one GPU, else -1. */
static int gather_gpus(MPI_Comm comm, const where_t *me, int *shared_a, int *shared_b, int *all_ok)
{
    int rc = DEAR_OK, size;
    where_t *all = NULL;
    DEAR_MPI_CHECK(MPI_Comm_size(comm, &size));
    DEAR_ALLOC_GOTO(all, calloc((size_t)size, sizeof *all), sizeof *all * (size_t)size, rc, out);
    DEAR_MPI_CHECK_GOTO(MPI_Allgather(me, (int)sizeof *me, MPI_BYTE, all, (int)sizeof *me, MPI_BYTE, comm), rc, out);
    *shared_a = *shared_b = -1;
    *all_ok = 1;
    for (int a = 0; a < size; a++)
        *all_ok &= all[a].ok;
    for (int a = 0; a < size && *shared_a < 0; a++)
        for (int b = a + 1; b < size && *all_ok; b++)
            if (strcmp(all[a].host, all[b].host) == 0 && strcmp(all[a].bus, all[b].bus) == 0) {
                *shared_a = a;
                *shared_b = b;
                break;
            }
    if (*shared_a >= 0)
        DEAR_INFO("cuda", "ranks %d and %d share GPU %s on %s", *shared_a, *shared_b, all[*shared_a].bus,
                  all[*shared_a].host);
out:
    free(all);
    return rc;
}

int dear_cuda_open(MPI_Comm comm, int want, double init_timeout_s, dear_cuda_t **out)
{
    int rc = DEAR_OK, rank = 0, shared_a = -1, shared_b = -1, all_ok = 0;
    where_t me = { { 0 }, { 0 }, 1 };
    dear_cuda_t *c = calloc(1, sizeof *c);
    DEAR_MPI_CHECK(MPI_Comm_rank(comm, &rank));
    if (c == NULL || cudaGetDevice(&c->dev) != cudaSuccess ||
        cudaDeviceGetPCIBusId(me.bus, BUS_LEN, c ? c->dev : 0) != cudaSuccess) {
        DEAR_ERROR("cuda", "no usable CUDA device on this rank: %s", cudaGetErrorString(cudaGetLastError()));
        me.ok = 0;
    }
    gethostname(me.host, HOST_LEN - 1);
    DEAR_CHECK_GOTO(gather_gpus(comm, &me, &shared_a, &shared_b, &all_ok), rc, err);
    if (!all_ok) {
        if (me.ok)
            DEAR_ERROR("cuda", "another rank has no usable CUDA device (its log says why)");
        rc = DEAR_ERR_CUDA;
        goto err;
    }
    int nccl = want == DEAR_CUDA_T_NCCL || (want == DEAR_CUDA_T_AUTO && dear_nccl_built() && shared_a < 0);
    if (want == DEAR_CUDA_T_NCCL && !dear_nccl_built()) {
        DEAR_ERROR("cuda", "DEAR_CUDA_TRANSPORT=nccl, but this libdear was built without NCCL (configure "
                           "--with-nccl); DEAR_CUDA_TRANSPORT=staged runs without it");
        rc = DEAR_ERR_UNSUPPORTED;
        goto err;
    }
    if (want == DEAR_CUDA_T_NCCL && shared_a >= 0) {
        DEAR_ERROR("cuda", "DEAR_CUDA_TRANSPORT=nccl: ranks %d and %d share GPU %s on %s, and NCCL refuses two ranks "
                           "on one GPU (\"Duplicate GPU detected\"); give every rank a GPU of its own "
                           "(cudaSetDevice before dear_commit) or use DEAR_CUDA_TRANSPORT=staged",
                   shared_a, shared_b, me.bus, me.host);
        rc = DEAR_ERR_UNSUPPORTED;
        goto err;
    }
    DEAR_CHECK_GOTO(dear_cuda_mem_direct_ops.queue_create(&c->comm), rc, err);
#ifdef HAVE_NCCL
    if (nccl) {
        rc = dear_nccl_create(comm, dear_cuda_queue_stream(c->comm), init_timeout_s, &c->nccl);
        if (rc != DEAR_OK && want == DEAR_CUDA_T_AUTO) {
            DEAR_WARN("cuda", "DEAR_CUDA_TRANSPORT=auto: NCCL could not set up (above); the gradients go through "
                              "pinned host buffers and dear's own collectives instead (staged)");
            nccl = 0;
            rc = DEAR_OK;
        }
        if (rc != DEAR_OK)
            goto err;
    }
#else
    nccl = 0;
#endif
    c->row = nccl ? &dear_cuda_mem_direct_ops : &dear_cuda_mem_staged_ops;
    if (!nccl)
        place_near(me.bus);
    DEAR_INFO("cuda", "GPU %d (%s): gradients %s", c->dev, me.bus,
              nccl ? "reduced by NCCL on the device" : "staged through pinned host buffers for dear's collectives");
    *out = c;
    return DEAR_OK;
err:
    dear_cuda_close(c);
    return rc;
}

void dear_cuda_close(dear_cuda_t *c)
{
    if (c == NULL)
        return;
    dear_cuda_queue_free(c->comm); /* waits for what is queued */
    dear_transport_close(c->nccl);
    free(c);
}

const dear_mem_ops_t *dear_cuda_mem(const dear_cuda_t *c) { return c->row; }
dear_memq_t *dear_cuda_comm_queue(const dear_cuda_t *c) { return c->comm; }
dear_transport_t *dear_cuda_transport(const dear_cuda_t *c) { return c->nccl; }
const char *dear_cuda_transport_name(const dear_cuda_t *c) { return c->nccl ? "nccl" : "staged"; }
