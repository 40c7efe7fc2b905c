/* Topology, from hwloc and MPI: what the node looks like, how ranks share it, and where the
 * progress thread should run (DEAR_PROGRESS_CORE=auto|none|N). */
#ifndef DEAR_TOPO_H
#define DEAR_TOPO_H

#include <mpi.h>
#include <stdio.h>

typedef struct {
    int npackages, nnuma, ncores, npus;  /* of this node, from hwloc */
    int local_rank, local_size;          /* among ranks on this node (MPI_Comm_split_type SHARED) */
    int nnodes;                          /* nodes in the communicator */
    int max_local_size;                  /* most ranks on any one node */
    int progress_core;                   /* core index chosen for the progress thread, -1: unbound */
    char hostname[64];
} dear_topo_t;

/* Collective over comm (called at init, before the progress thread exists). Loads the hwloc
 * topology, counts ranks per node and picks the progress core: for auto, a core that none
 * of this node's ranks is bound to, when there is one; none or a bad choice leaves -1.
 * Logs the result at info level. */
int dear_topo_detect(MPI_Comm comm, dear_topo_t *topo);
/* The same, and on success a sentence in reason saying why the progress core was chosen or
 * left unbound (for dear-info and tests). */
int dear_topo_detect_why(MPI_Comm comm, dear_topo_t *topo, char *reason, size_t reasonlen);

/* Bind the calling thread (the progress thread) to topo->progress_core; no-op for -1. A
 * binding failure is a warning, not an error. */
int dear_topo_bind_self(const dear_topo_t *topo);

void dear_topo_print(FILE *out, const dear_topo_t *topo);

#endif
