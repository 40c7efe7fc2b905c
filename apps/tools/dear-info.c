/* dear-info: what this libdear build is and what dear_init would see here. Prints the version,
 * the build configuration (compiler, MPI library, hwloc, CUDA and NCCL), every DEAR_* parameter
 * with its value and where it came from, and the node topology with the progress-thread core
 * DEAR_PROGRESS_CORE would choose. A bad value is reported exactly as dear_init reports it and
 * makes the exit status 1. `--markdown` prints docs/PARAMS.md from the same parameter table.
 *
 * An MPI program that also runs alone (`dear-info`, Open MPI's singleton mode); under mpirun
 * rank 0 prints and the topology section covers the ranks of the whole job. --help and
 * --markdown do not start MPI. */
#include "config.h"

#include <hwloc.h>
#include <mpi.h>
#include <stdio.h>
#include <string.h>

#include "cuda/cuda.h"
#include "include/dear.h"
#include "base/log.h"
#include "base/params.h"
#include "runtime/topo.h"

static void usage(FILE *out)
{
    fprintf(out,
            "usage: dear-info [--markdown | --help]\n"
            "  (no option)  print the version, build configuration, every DEAR_* parameter with its\n"
            "               value and origin, and the topology; exit 1 if a DEAR_* value is invalid\n"
            "               (dear_init would fail with DEAR_ERR_PARAM) or topology detection fails.\n"
            "               Runs alone or under mpirun (rank 0 prints).\n"
            "  --markdown   print the parameter reference (docs/PARAMS.md) and exit\n"
            "  --help       this text\n");
}

static void print_build(FILE *out)
{
    char mpilib[MPI_MAX_LIBRARY_VERSION_STRING];
    int len = 0, major = 0, minor = 0;
    unsigned hw = hwloc_get_api_version();

    if (MPI_Get_library_version(mpilib, &len) != MPI_SUCCESS)
        snprintf(mpilib, sizeof mpilib, "unknown");
    /* Open MPI's string may end in a newline or hold several lines: keep the first. */
    mpilib[strcspn(mpilib, "\r\n")] = '\0';
    MPI_Get_version(&major, &minor);

    fprintf(out, "build:\n");
#ifdef __VERSION__
    fprintf(out, "  compiler        : %s (%s)\n", DEAR_BUILD_CC, __VERSION__);
#else
    fprintf(out, "  compiler        : %s\n", DEAR_BUILD_CC);
#endif
    fprintf(out, "  MPI library     : %s (MPI %d.%d)\n", mpilib, major, minor);
    fprintf(out, "  hwloc           : %s headers, library API %u.%u.%u\n", HWLOC_VERSION, hw >> 16,
            (hw >> 8) & 0xff, hw & 0xff);
    if (dear_cuda_built()) {
        int n = 0, rc = dear_cuda_device_count(&n);
        if (rc == DEAR_OK)
            fprintf(out, "  CUDA            : yes (%d device%s visible)\n", n, n == 1 ? "" : "s");
        else
            fprintf(out, "  CUDA            : yes (no device usable: %s)\n", dear_status_string(rc));
    } else {
        fprintf(out, "  CUDA            : no\n");
    }
    fprintf(out, "  NCCL            : %s\n", dear_nccl_built() ? "yes" : "no");
    if (dear_cuda_built()) {
        /* What carries CUDA gradients: auto's rule, since it depends on every rank's GPU. */
        const char *t = dear_param_string(DEAR_P_CUDA_TRANSPORT);
        fprintf(out, "  CUDA transport  : %s%s\n", t,
                strcmp(t, "auto") != 0     ? ""
                : dear_nccl_built()        ? " (nccl when every rank has a GPU of its own and NCCL sets up, else staged)"
                                           : " (staged: NCCL is not in this build)");
    }
}

int main(int argc, char **argv)
{
    int provided, rank = 0, size = 1, status = 0;

    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--markdown") == 0) {
            dear_params_markdown(stdout);
            return fflush(stdout) == 0 ? 0 : 1;
        } else if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            usage(stdout);
            return 0;
        } else {
            fprintf(stderr, "dear-info: unknown option '%s'\n", argv[i]);
            usage(stderr);
            return 2;
        }
    }

    if (MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided) != MPI_SUCCESS) {
        fprintf(stderr, "dear-info: MPI_Init_thread failed\n");
        return 1;
    }
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    dear_log_set_rank(rank);

    /* The same load dear_init does: errors and unknown-variable warnings go to stderr. */
    int prc = dear_params_load();

    if (rank == 0) {
        printf("dear %s\n", dear_version());
        print_build(stdout);
        printf("  MPI threads     : %s\n", provided >= MPI_THREAD_MULTIPLE
                                          ? "MPI_THREAD_MULTIPLE (as dear_init requires)"
                                          : "less than MPI_THREAD_MULTIPLE: dear_init would fail");
        printf("parameters (environment as dear_init would read it):\n");
        int nbad = dear_params_print(stdout, "  ");
        if (prc != DEAR_OK) {
            printf("  -> %d invalid value%s: dear_init would fail with DEAR_ERR_PARAM (%s); the "
                   "message is on stderr\n", nbad, nbad == 1 ? "" : "s", dear_status_string(prc));
        }
        fflush(stdout);
    }
    if (prc != DEAR_OK)
        status = 1;

    /* Collective: every rank takes part. With invalid parameters the defaults are used. */
    dear_topo_t topo;
    char why[512] = "";
    int trc = dear_topo_detect_why(MPI_COMM_WORLD, &topo, why, sizeof why);
    if (rank == 0) {
        printf("topology (rank 0 of %d):\n", size);
        if (trc == DEAR_OK) {
            dear_topo_print(stdout, &topo);
            printf("                    (%s)\n", why);
        }
        else
            printf("  detection failed: %s (message on stderr)\n", dear_status_string(trc));
        fflush(stdout);
    }
    if (trc != DEAR_OK)
        status = 1;

    MPI_Finalize();
    return status;
}
