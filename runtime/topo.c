/* Topology detection and progress-thread placement. hwloc counts what this node has (packages,
 * NUMA nodes, cores, PUs); MPI_Comm_split_type(MPI_COMM_TYPE_SHARED) tells which ranks share
 * the node. For DEAR_PROGRESS_CORE=auto the ranks of a node exchange their CPU bindings (the
 * calling thread's, which is the rank's compute thread) as hwloc bitmap strings, and each picks
 * a core none of them is bound to, preferring the package its own compute runs on so the
 * progress thread's copies and reductions stay near the gradients. Cores are named by hwloc
 * logical index (lstopo's "Core L#n"); a machine without core objects uses PUs instead.
 *
 * Every rank takes part in every collective even when its own part failed, and the outcome is
 * agreed with one MPI_Allreduce, so a bad setting fails on all ranks instead of hanging the
 * ones that went on. */
#include "runtime/topo.h"

#include <errno.h>
#include <hwloc.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "include/dear.h"
#include "base/mpi_check.h"
#include "base/log.h"
#include "base/params.h"

/* Objects the progress thread can be placed on: cores, or PUs where hwloc knows no cores. */
static hwloc_obj_type_t place_type(hwloc_topology_t hw)
{
    return hwloc_get_nbobjs_by_type(hw, HWLOC_OBJ_CORE) > 0 ? HWLOC_OBJ_CORE : HWLOC_OBJ_PU;
}

/* Logical index of the package holding the first PU of set, or -1. */
static int package_of(hwloc_topology_t hw, hwloc_const_bitmap_t set)
{
    int first = hwloc_bitmap_first(set);
    if (first < 0)
        return -1;
    hwloc_obj_t pu = hwloc_get_pu_obj_by_os_index(hw, (unsigned)first);
    if (pu == NULL)
        return -1;
    hwloc_obj_t pkg = hwloc_get_ancestor_obj_by_type(hw, HWLOC_OBJ_PACKAGE, pu);
    return pkg ? (int)pkg->logical_index : -1;
}

/* Exchange the calling thread's binding with the other ranks of the node: sets[i] is local
 * rank i's cpuset, or NULL where it could not be read (treated as unbound). */
static int gather_bindings(hwloc_topology_t hw, MPI_Comm shm, int local_size, hwloc_bitmap_t *sets)
{
    int rc = DEAR_OK;
    char *mine = NULL, *all = NULL;
    int *lens = NULL, *displs = NULL;
    hwloc_bitmap_t set = hwloc_bitmap_alloc();

    DEAR_ALLOC_GOTO(lens, calloc((size_t)local_size, sizeof *lens), sizeof *lens, rc, out);
    DEAR_ALLOC_GOTO(displs, calloc((size_t)local_size, sizeof *displs), sizeof *displs, rc, out);
    if (set == NULL) {
        DEAR_ERROR("sys", "hwloc_bitmap_alloc failed");
        rc = DEAR_ERR_NOMEM;
        goto out;
    }
    /* An empty string says "unknown": hwloc cannot read bindings of a synthetic or XML
     * topology unless HWLOC_THISSYSTEM=1 says it describes this machine. */
    if (hw != NULL && hwloc_get_cpubind(hw, set, HWLOC_CPUBIND_THREAD) == 0) {
        if (hwloc_bitmap_asprintf(&mine, set) < 0)
            mine = NULL;
    } else if (hw != NULL) {
        DEAR_DEBUG("topo", "hwloc_get_cpubind failed (%s); treating this rank as unbound", strerror(errno));
    }
    if (mine == NULL)
        DEAR_ALLOC_GOTO(mine, strdup(""), 1, rc, out);

    int len = (int)strlen(mine) + 1;
    DEAR_MPI_CHECK_GOTO(MPI_Allgather(&len, 1, MPI_INT, lens, 1, MPI_INT, shm), rc, out);
    size_t total = 0;
    for (int i = 0; i < local_size; i++) {
        displs[i] = (int)total;
        total += (size_t)lens[i];
    }
    DEAR_ALLOC_GOTO(all, malloc(total), total, rc, out);
    DEAR_MPI_CHECK_GOTO(MPI_Allgatherv(mine, len, MPI_CHAR, all, lens, displs, MPI_CHAR, shm), rc, out);
    for (int i = 0; i < local_size; i++) {
        const char *s = all + displs[i];
        sets[i] = NULL;
        if (s[0] == '\0')
            continue;
        sets[i] = hwloc_bitmap_alloc();
        if (sets[i] == NULL || hwloc_bitmap_sscanf(sets[i], s) != 0) {
            DEAR_WARN("topo", "cannot parse the binding '%s' of local rank %d; treating it as unbound", s, i);
            hwloc_bitmap_free(sets[i]);
            sets[i] = NULL;
        }
    }
out:
    hwloc_bitmap_free(set);
    free(mine);
    free(all);
    free(lens);
    free(displs);
    return rc;
}

/* DEAR_PROGRESS_CORE=auto: pick a place (core) no rank of this node is bound to. Sets *core
 * (-1: leave unbound) and a sentence saying why in why. */
static void choose_auto(hwloc_topology_t hw, int local_rank, int local_size, hwloc_bitmap_t *sets,
                        int *core, char *why, size_t whylen)
{
    hwloc_obj_type_t type = place_type(hw);
    int nplaces = hwloc_get_nbobjs_by_type(hw, type);
    hwloc_const_bitmap_t allowed = hwloc_topology_get_allowed_cpuset(hw);
    hwloc_bitmap_t used = hwloc_bitmap_alloc();
    int *free_places = calloc((size_t)(nplaces > 0 ? nplaces : 1), sizeof *free_places);
    int nbound = 0, nfree = 0;

    *core = -1;
    if (used == NULL || free_places == NULL) {
        snprintf(why, whylen, "out of memory choosing a core");
        goto out;
    }
    for (int i = 0; i < local_size; i++) {
        /* A rank whose binding covers every allowed PU is not bound at all. */
        if (sets[i] == NULL || hwloc_bitmap_isincluded(allowed, sets[i])) {
            hwloc_bitmap_copy(used, allowed);
            continue;
        }
        nbound++;
        hwloc_bitmap_or(used, used, sets[i]);
    }
    if (nbound == 0) {
        snprintf(why, whylen, "the %d rank(s) on this node are not bound to cores (e.g. mpirun "
                 "--bind-to none) or their binding cannot be read, so no core is known to be free", local_size);
        goto out;
    }
    for (int c = 0; c < nplaces; c++) {
        hwloc_obj_t obj = hwloc_get_obj_by_type(hw, type, (unsigned)c);
        if (hwloc_bitmap_intersects(obj->cpuset, allowed) && !hwloc_bitmap_intersects(obj->cpuset, used))
            free_places[nfree++] = c;
    }
    if (nbound < local_size) {
        snprintf(why, whylen, "%d of the %d rank(s) on this node are not bound to cores, so no core "
                 "is known to be free", local_size - nbound, local_size);
        goto out;
    }
    if (nfree == 0) {
        snprintf(why, whylen, "the %d rank(s) on this node are bound to every one of its %d %ss",
                 local_size, nplaces, hwloc_obj_type_string(type));
        goto out;
    }
    /* Prefer a free place in the package of this rank's compute; spread the ranks of one
     * package over its free places in local-rank order. */
    int mypkg = package_of(hw, sets[local_rank]);
    int nearby = 0, k = 0;
    for (int i = 0; i < nfree; i++) {
        hwloc_obj_t obj = hwloc_get_obj_by_type(hw, type, (unsigned)free_places[i]);
        if (mypkg >= 0 && package_of(hw, obj->cpuset) == mypkg)
            free_places[nearby++] = free_places[i];   /* stable: nearby ones move to the front */
    }
    if (nearby > 0) {
        for (int i = 0; i < local_rank; i++)
            k += package_of(hw, sets[i]) == mypkg;
        *core = free_places[k % nearby];
        snprintf(why, whylen, "%s %d is free and in package %d with this rank's compute", hwloc_obj_type_string(type),
                 *core, mypkg);
    } else {
        /* Nearby ones were moved in place only when nearby > 0, so the list is intact here. */
        *core = free_places[local_rank % nfree];
        snprintf(why, whylen, "%s %d is not used by any rank of this node (none free in this rank's package)",
                 hwloc_obj_type_string(type), *core);
    }
out:
    hwloc_bitmap_free(used);
    free(free_places);
}

/* Apply DEAR_PROGRESS_CORE. Returns DEAR_ERR_PARAM for a core index this node lacks. */
static int choose_progress_core(hwloc_topology_t hw, int local_rank, int local_size, hwloc_bitmap_t *sets,
                                int *core, char *why, size_t whylen)
{
    int mode = dear_param_enum(DEAR_P_PROGRESS_CORE);   /* 0 auto, 1 none, -1 an index */

    *core = -1;
    if (mode == 1) {
        snprintf(why, whylen, "DEAR_PROGRESS_CORE=none");
        return DEAR_OK;
    }
    if (hw == NULL) {
        snprintf(why, whylen, "no hwloc topology");
        return DEAR_OK;
    }
    if (mode == 0) {
        choose_auto(hw, local_rank, local_size, sets, core, why, whylen);
        return DEAR_OK;
    }
    long long want = dear_param_int(DEAR_P_PROGRESS_CORE);
    hwloc_obj_type_t type = place_type(hw);
    int nplaces = hwloc_get_nbobjs_by_type(hw, type);
    if (want < 0 || want >= nplaces) {
        DEAR_ERROR("topo", "DEAR_PROGRESS_CORE=%lld names %s %lld, but this node has %d %ss "
                   "(logical indices 0..%d, as lstopo numbers them); use one of those, auto or none",
                   want, hwloc_obj_type_string(type), want, nplaces, hwloc_obj_type_string(type), nplaces - 1);
        return DEAR_ERR_PARAM;
    }
    *core = (int)want;
    hwloc_obj_t obj = hwloc_get_obj_by_type(hw, type, (unsigned)want);
    hwloc_const_bitmap_t allowed = hwloc_topology_get_allowed_cpuset(hw);
    int shared_with = -1;
    for (int i = 0; i < local_size && shared_with < 0; i++)
        if (sets[i] && !hwloc_bitmap_isincluded(allowed, sets[i]) && hwloc_bitmap_intersects(sets[i], obj->cpuset))
            shared_with = i;
    if (shared_with >= 0)
        DEAR_WARN("topo", "DEAR_PROGRESS_CORE=%lld: local rank %d's compute is bound to that %s too; "
                  "the progress thread will compete with it", want, shared_with, hwloc_obj_type_string(type));
    snprintf(why, whylen, "DEAR_PROGRESS_CORE=%lld", want);
    return DEAR_OK;
}

int dear_topo_detect(MPI_Comm comm, dear_topo_t *topo)
{
    return dear_topo_detect_why(comm, topo, NULL, 0);
}

int dear_topo_detect_why(MPI_Comm comm, dear_topo_t *topo, char *reason, size_t reasonlen)
{
    dear_topo_t t;
    hwloc_topology_t hw = NULL;
    hwloc_bitmap_t *sets = NULL;
    MPI_Comm shm = MPI_COMM_NULL;
    char why[512] = "";
    int rc = DEAR_OK, local_rc = DEAR_OK, rank = 0;

    DEAR_ARG_CHECK(topo != NULL, "dear_topo_detect: NULL output pointer");
    memset(&t, 0, sizeof t);
    t.progress_core = -1;

    if (hwloc_topology_init(&hw) != 0) {
        DEAR_ERROR("topo", "hwloc_topology_init failed: %s", strerror(errno));
        hw = NULL;
        local_rc = DEAR_ERR_INTERNAL;
    } else if (hwloc_topology_load(hw) != 0) {
        DEAR_ERROR("topo", "hwloc_topology_load failed: %s (check HWLOC_SYNTHETIC / HWLOC_XMLFILE if set)",
                   strerror(errno));
        hwloc_topology_destroy(hw);
        hw = NULL;
        local_rc = DEAR_ERR_INTERNAL;
    }
    if (hw != NULL) {
        t.npackages = hwloc_get_nbobjs_by_type(hw, HWLOC_OBJ_PACKAGE);
        t.nnuma = hwloc_get_nbobjs_by_type(hw, HWLOC_OBJ_NUMANODE);
        t.ncores = hwloc_get_nbobjs_by_type(hw, HWLOC_OBJ_CORE);
        t.npus = hwloc_get_nbobjs_by_type(hw, HWLOC_OBJ_PU);
    }
    if (gethostname(t.hostname, sizeof t.hostname - 1) != 0)
        snprintf(t.hostname, sizeof t.hostname, "unknown");

    DEAR_MPI_CHECK_GOTO(MPI_Comm_rank(comm, &rank), rc, out);
    DEAR_MPI_CHECK_GOTO(MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &shm), rc, out);
    DEAR_MPI_CHECK_GOTO(MPI_Comm_rank(shm, &t.local_rank), rc, out);
    DEAR_MPI_CHECK_GOTO(MPI_Comm_size(shm, &t.local_size), rc, out);

    DEAR_ALLOC_GOTO(sets, calloc((size_t)t.local_size, sizeof *sets), sizeof *sets, rc, out);
    DEAR_CHECK_GOTO(gather_bindings(hw, shm, t.local_size, sets), rc, out);
    if (local_rc == DEAR_OK)
        local_rc = choose_progress_core(hw, t.local_rank, t.local_size, sets, &t.progress_core, why, sizeof why);

    /* One leader per node counts nodes; the worst status is everyone's status. */
    int leader = t.local_rank == 0, mx[2] = { t.local_size, -local_rc }, mx_all[2];
    DEAR_MPI_CHECK_GOTO(MPI_Allreduce(&leader, &t.nnodes, 1, MPI_INT, MPI_SUM, comm), rc, out);
    DEAR_MPI_CHECK_GOTO(MPI_Allreduce(mx, mx_all, 2, MPI_INT, MPI_MAX, comm), rc, out);
    t.max_local_size = mx_all[0];
    if (mx_all[1] != 0) {
        rc = local_rc != DEAR_OK ? local_rc : -mx_all[1];
        if (local_rc == DEAR_OK)
            DEAR_ERROR("topo", "topology detection failed on another rank (%s); see its message",
                       dear_status_string(rc));
        goto out;
    }

    DEAR_INFO("topo", "host %s: %d package(s), %d NUMA node(s), %d core(s), %d PU(s); local rank %d of %d; "
              "%d node(s), at most %d rank(s) per node", t.hostname, t.npackages, t.nnuma, t.ncores, t.npus,
              t.local_rank, t.local_size, t.nnodes, t.max_local_size);
    if (t.progress_core >= 0)
        DEAR_INFO("topo", "progress thread core %d: %s", t.progress_core, why);
    else
        DEAR_INFO("topo", "progress thread unbound: %s", why);
    if (reason != NULL && reasonlen > 0)
        snprintf(reason, reasonlen, "%s", why);
    *topo = t;

out:
    if (sets) {
        for (int i = 0; i < t.local_size; i++)
            hwloc_bitmap_free(sets[i]);
        free(sets);
    }
    if (shm != MPI_COMM_NULL && MPI_Comm_free(&shm) != MPI_SUCCESS)
        DEAR_WARN("topo", "MPI_Comm_free of the node communicator failed");
    if (hw)
        hwloc_topology_destroy(hw);
    return rc;
}

int dear_topo_bind_self(const dear_topo_t *topo)
{
    hwloc_topology_t hw;

    DEAR_ARG_CHECK(topo != NULL, "dear_topo_bind_self: NULL topology");
    if (topo->progress_core < 0)
        return DEAR_OK;
    /* The topology is reloaded here rather than kept from detection: this runs once, when the
     * progress thread starts, and dear_topo_t stays a plain value. */
    if (hwloc_topology_init(&hw) != 0) {
        DEAR_WARN("topo", "hwloc_topology_init failed (%s); progress thread left unbound", strerror(errno));
        return DEAR_OK;
    }
    if (hwloc_topology_load(hw) != 0) {
        DEAR_WARN("topo", "hwloc_topology_load failed (%s); progress thread left unbound", strerror(errno));
        goto out;
    }
    hwloc_obj_type_t type = place_type(hw);
    hwloc_obj_t obj = hwloc_get_obj_by_type(hw, type, (unsigned)topo->progress_core);
    if (obj == NULL) {
        DEAR_WARN("topo", "%s %d no longer exists; progress thread left unbound", hwloc_obj_type_string(type),
                  topo->progress_core);
        goto out;
    }
    if (!hwloc_topology_is_thissystem(hw)) {
        DEAR_WARN("topo", "the hwloc topology does not describe this machine (HWLOC_SYNTHETIC or HWLOC_XMLFILE "
                  "without HWLOC_THISSYSTEM=1); progress thread left unbound");
        goto out;
    }
    if (hwloc_set_cpubind(hw, obj->cpuset, HWLOC_CPUBIND_THREAD) != 0) {
        char *s = NULL;
        int err = errno;
        if (hwloc_bitmap_asprintf(&s, obj->cpuset) < 0)
            s = NULL;
        DEAR_WARN("topo", "binding the progress thread to %s %d (cpuset %s) failed: %s; left unbound",
                  hwloc_obj_type_string(type), topo->progress_core, s ? s : "?", strerror(err));
        free(s);
        goto out;
    }
    DEAR_INFO("topo", "progress thread bound to %s %d", hwloc_obj_type_string(type), topo->progress_core);
out:
    hwloc_topology_destroy(hw);
    return DEAR_OK;
}

void dear_topo_print(FILE *out, const dear_topo_t *topo)
{
    if (out == NULL || topo == NULL)
        return;
    fprintf(out, "  host            : %s\n", topo->hostname);
    fprintf(out, "  packages        : %d\n", topo->npackages);
    fprintf(out, "  NUMA nodes      : %d\n", topo->nnuma);
    fprintf(out, "  cores           : %d\n", topo->ncores);
    fprintf(out, "  PUs             : %d\n", topo->npus);
    fprintf(out, "  local rank      : %d of %d on this node\n", topo->local_rank, topo->local_size);
    fprintf(out, "  nodes           : %d (at most %d rank(s) per node)\n", topo->nnodes, topo->max_local_size);
    if (topo->progress_core >= 0)
        fprintf(out, "  progress thread : core %d (hwloc logical index)\n", topo->progress_core);
    else
        fprintf(out, "  progress thread : unbound\n");
}
