/* Topology and progress-core placement under mpirun (all ranks on one node), with no special
 * hardware: hwloc synthetic topologies (HWLOC_SYNTHETIC, set here after MPI_Init so Open MPI's
 * own hwloc never sees them) and a topology XML exported from one. Counts are checked against
 * the synthetic description, node counts against the host names the ranks exchange, and the
 * progress core against a table of the placement rule and the property that no rank is bound to
 * it. For placement the synthetic topology is declared to be this machine (HWLOC_THISSYSTEM=1)
 * with PU OS indexes chosen so the real CPUs the ranks bind to land in chosen cores. */
#include <check.h>
#include <hwloc.h>
#include <mpi.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "include/dear.h"
#include "base/log.h"
#include "base/params.h"
#include "runtime/topo.h"
#include "tests/mpi/np_check.h"

static int rank, size;
static cpu_set_t original_mask;
static int real_cpus[CPU_SETSIZE], nreal;

static char logbuf[8192];
static void capture(const char *line, void *arg)
{
    (void)arg;
    strncat(logbuf, line, sizeof logbuf - strlen(logbuf) - 1);
}

static void setup(void)
{
    logbuf[0] = '\0';
    dear_log_set_sink(capture, NULL);
    unsetenv("HWLOC_SYNTHETIC");
    unsetenv("HWLOC_XMLFILE");
    unsetenv("HWLOC_THISSYSTEM");
    unsetenv("DEAR_PROGRESS_CORE");
    ck_assert_int_eq(dear_params_load(), DEAR_OK);
}

static void teardown(void)
{
    dear_log_set_sink(NULL, NULL);
    sched_setaffinity(0, sizeof original_mask, &original_mask);
    unsetenv("HWLOC_SYNTHETIC");
    unsetenv("HWLOC_XMLFILE");
    unsetenv("HWLOC_THISSYSTEM");
    unsetenv("DEAR_PROGRESS_CORE");
    dear_params_load();
    MPI_Barrier(MPI_COMM_WORLD);
}

/* Bind the calling thread to one real CPU. */
static void bind_to_cpu(int cpu)
{
    cpu_set_t m;
    CPU_ZERO(&m);
    CPU_SET(cpu, &m);
    ck_assert_int_eq(sched_setaffinity(0, sizeof m, &m), 0);
}

/* Distinct host names among the ranks: the node count, found without MPI_Comm_split_type. */
static int count_hosts(void)
{
    char me[64] = "", *all = malloc((size_t)size * 64);
    ck_assert_ptr_nonnull(all);
    gethostname(me, sizeof me - 1);
    MPI_Allgather(me, 64, MPI_CHAR, all, 64, MPI_CHAR, MPI_COMM_WORLD);
    int n = 0;
    for (int i = 0; i < size; i++) {
        int seen = 0;
        for (int j = 0; j < i && !seen; j++)
            seen = strncmp(all + 64 * i, all + 64 * j, 64) == 0;
        n += !seen;
    }
    free(all);
    return n;
}

static void check_ranks(const dear_topo_t *t)
{
    int hosts = count_hosts();
    ck_assert_int_eq(t->nnodes, hosts);
    /* Every test run is on one host: then node-local numbering is the world numbering. */
    if (hosts == 1) {
        ck_assert_int_eq(t->local_rank, rank);
        ck_assert_int_eq(t->local_size, size);
        ck_assert_int_eq(t->max_local_size, size);
    }
    char host[64] = "";
    gethostname(host, sizeof host - 1);
    ck_assert_str_eq(t->hostname, host);
}

/* Synthetic topologies: levels and arities; expected counts follow from the description
 * (a topology without a NUMA level gets one NUMA node, one without cores has none). */
typedef struct { const char *desc; int pack, numa, core, pu; } synth_t;

START_TEST(test_synthetic_counts)
{
    const synth_t cases[] = {
        { "pack:2 numa:1 core:4 pu:2", 2, 2 * 1, 2 * 4, 2 * 4 * 2 },
        { "pack:1 core:3 pu:1", 1, 1, 3, 3 },
        { "pack:4 numa:2 l3:1 core:5 pu:4", 4, 4 * 2, 4 * 2 * 5, 4 * 2 * 5 * 4 },
        { "pack:2 pu:3", 2, 1, 0, 6 },
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        dear_topo_t t;
        char why[512];
        memset(&t, 0x5a, sizeof t);
        setenv("HWLOC_SYNTHETIC", cases[i].desc, 1);
        ck_assert_int_eq(dear_topo_detect_why(MPI_COMM_WORLD, &t, why, sizeof why), DEAR_OK);
        ck_assert_msg(t.npackages == cases[i].pack && t.nnuma == cases[i].numa && t.ncores == cases[i].core &&
                      t.npus == cases[i].pu, "%s: got %d packages, %d NUMA, %d cores, %d PUs", cases[i].desc,
                      t.npackages, t.nnuma, t.ncores, t.npus);
        check_ranks(&t);
        /* A synthetic topology is not this machine: bindings read as "everything", so auto
         * finds the ranks unbound and leaves the progress thread unbound. */
        ck_assert_int_eq(t.progress_core, -1);
        ck_assert_msg(strstr(why, "not bound to cores") != NULL, "%s", why);
    }
}
END_TEST

/* The same counts from a topology XML (exported from a synthetic topology). */
START_TEST(test_xml_counts)
{
    char path[256];
    hwloc_topology_t hw;
    snprintf(path, sizeof path, "/tmp/dear-test-topo-%d-%d.xml", (int)getpid(), rank);
    setenv("HWLOC_SYNTHETIC", "pack:3 numa:2 core:2 pu:2", 1);
    ck_assert_int_eq(hwloc_topology_init(&hw), 0);
    ck_assert_int_eq(hwloc_topology_load(hw), 0);
    ck_assert_int_eq(hwloc_topology_export_xml(hw, path, 0), 0);
    hwloc_topology_destroy(hw);
    unsetenv("HWLOC_SYNTHETIC");
    setenv("HWLOC_XMLFILE", path, 1);
    dear_topo_t t;
    ck_assert_int_eq(dear_topo_detect(MPI_COMM_WORLD, &t), DEAR_OK);
    unlink(path);
    ck_assert_int_eq(t.npackages, 3);
    ck_assert_int_eq(t.nnuma, 6);
    ck_assert_int_eq(t.ncores, 12);
    ck_assert_int_eq(t.npus, 24);
    check_ranks(&t);
}
END_TEST

/* "pack:2 core:4 pu:2" whose PU OS indexes put real CPU a in core 0 (package 0) and real CPU b
 * in core 4 (package 1); the other PUs get unused indexes. */
static void set_two_package_synthetic(int a, int b)
{
    char desc[512], *p;
    int next = 0;
    p = desc + snprintf(desc, sizeof desc, "pack:2 core:4 pu:2(indexes=");
    for (int pos = 0; pos < 16; pos++) {
        int os;
        if (pos == 0) {
            os = a;
        } else if (pos == 8) {
            os = b;
        } else {
            while (next == a || next == b)
                next++;
            os = next++;
        }
        p += snprintf(p, (size_t)(desc + sizeof desc - p), "%s%d", pos ? "," : "", os);
    }
    snprintf(p, (size_t)(desc + sizeof desc - p), ")");
    setenv("HWLOC_SYNTHETIC", desc, 1);
    setenv("HWLOC_THISSYSTEM", "1", 1);
}

START_TEST(test_auto_picks_free_core)
{
    if (nreal < 2) {
        if (rank == 0)
            printf("test_auto_picks_free_core: skipped, fewer than 2 CPUs available\n");
        return;
    }
    /* Even ranks compute on real CPU 0 (core 0, package 0), odd ranks on real CPU 1 (core 4,
     * package 1). Rule: a free core in the rank's own package, the package's ranks spread in
     * local-rank order: package 0 has cores 1,2,3 free, package 1 has 5,6,7. */
    static const int expected[4][4] = { { 1 }, { 1, 5 }, { 1, 5, 2 }, { 1, 5, 2, 6 } };
    ck_assert_msg(size <= 4, "this test covers 1 to 4 ranks");
    set_two_package_synthetic(real_cpus[0], real_cpus[1]);
    bind_to_cpu(real_cpus[rank % 2]);
    dear_topo_t t;
    char why[512];
    int rc = dear_topo_detect_why(MPI_COMM_WORLD, &t, why, sizeof why);
    /* Gather before asserting, so a failure on one rank cannot leave the others waiting. */
    int *chosen = malloc((size_t)size * sizeof *chosen);
    ck_assert_ptr_nonnull(chosen);
    MPI_Allgather(&t.progress_core, 1, MPI_INT, chosen, 1, MPI_INT, MPI_COMM_WORLD);
    ck_assert_int_eq(rc, DEAR_OK);
    ck_assert_int_eq(t.npackages, 2);
    ck_assert_int_eq(t.ncores, 8);
    ck_assert_msg(t.progress_core == expected[size - 1][rank], "rank %d: core %d, expected %d (%s)", rank,
                  t.progress_core, expected[size - 1][rank], why);
    ck_assert_msg(strstr(why, "is free and in package") != NULL, "%s", why);
    /* Property, independent of the table: no rank computes on any chosen core. */
    for (int i = 0; i < size; i++)
        ck_assert(chosen[i] != 0 && chosen[i] != 4);
    free(chosen);
}
END_TEST

START_TEST(test_auto_every_core_used)
{
    if (nreal < 2 || size < 2) {
        if (rank == 0)
            printf("test_auto_every_core_used: skipped, needs 2 CPUs and 2 ranks\n");
        return;
    }
    char desc[128];
    snprintf(desc, sizeof desc, "pack:1 core:2 pu:1(indexes=%d,%d)", real_cpus[0], real_cpus[1]);
    setenv("HWLOC_SYNTHETIC", desc, 1);
    setenv("HWLOC_THISSYSTEM", "1", 1);
    bind_to_cpu(real_cpus[rank % 2]);
    dear_topo_t t;
    char why[512];
    ck_assert_int_eq(dear_topo_detect_why(MPI_COMM_WORLD, &t, why, sizeof why), DEAR_OK);
    ck_assert_int_eq(t.progress_core, -1);
    ck_assert_msg(strstr(why, "bound to every one of its 2 Cores") != NULL, "%s", why);
}
END_TEST

/* The synthetic topology is exactly the CPUs this process may use, so an unbound rank's
 * binding covers all of it. */
static void set_exact_synthetic(void)
{
    static char desc[16384];
    char *p = desc + snprintf(desc, sizeof desc, "pack:1 core:%d pu:1(indexes=", nreal);
    for (int i = 0; i < nreal; i++)
        p += snprintf(p, (size_t)(desc + sizeof desc - p), "%s%d", i ? "," : "", real_cpus[i]);
    snprintf(p, (size_t)(desc + sizeof desc - p), ")");
    setenv("HWLOC_SYNTHETIC", desc, 1);
    setenv("HWLOC_THISSYSTEM", "1", 1);
}

START_TEST(test_auto_unbound_ranks)
{
    dear_topo_t t;
    char why[512];
    set_exact_synthetic();
    ck_assert_int_eq(dear_topo_detect_why(MPI_COMM_WORLD, &t, why, sizeof why), DEAR_OK);
    ck_assert_int_eq(t.ncores, nreal);
    ck_assert_int_eq(t.progress_core, -1);
    ck_assert_msg(strstr(why, "not bound to cores") != NULL, "%s", why);
    /* Auto says so at info level. */
    logbuf[0] = '\0';
    dear_log_set_level(DEAR_LOG_INFO);
    ck_assert_int_eq(dear_topo_detect(MPI_COMM_WORLD, &t), DEAR_OK);
    dear_log_set_level(DEAR_LOG_WARN);
    ck_assert_msg(strstr(logbuf, "info topo: progress thread unbound: ") != NULL, "%s", logbuf);
    char want[256];
    snprintf(want, sizeof want, "info topo: host %s: 1 package(s), 1 NUMA node(s), %d core(s), %d PU(s)",
             t.hostname, nreal, nreal);
    ck_assert_msg(strstr(logbuf, want) != NULL, "%s", logbuf);

    /* Only rank 0 bound: the others may run anywhere, so still no free core. */
    if (size > 1 && nreal > 1) {
        if (rank == 0)
            bind_to_cpu(real_cpus[0]);
        ck_assert_int_eq(dear_topo_detect_why(MPI_COMM_WORLD, &t, why, sizeof why), DEAR_OK);
        ck_assert_int_eq(t.progress_core, -1);
        char want2[128];
        snprintf(want2, sizeof want2, "%d of the %d rank(s) on this node are not bound", size - 1, size);
        ck_assert_msg(strstr(why, want2) != NULL, "%s", why);
    }
}
END_TEST

START_TEST(test_explicit_core)
{
    dear_topo_t t;
    char why[512];
    setenv("HWLOC_SYNTHETIC", "pack:2 core:4 pu:2", 1);

    setenv("DEAR_PROGRESS_CORE", "none", 1);
    ck_assert_int_eq(dear_params_load(), DEAR_OK);
    ck_assert_int_eq(dear_topo_detect_why(MPI_COMM_WORLD, &t, why, sizeof why), DEAR_OK);
    ck_assert_int_eq(t.progress_core, -1);
    ck_assert_str_eq(why, "DEAR_PROGRESS_CORE=none");

    for (int core = 0; core < 8; core += 7) {
        char v[16];
        snprintf(v, sizeof v, "%d", core);
        setenv("DEAR_PROGRESS_CORE", v, 1);
        ck_assert_int_eq(dear_params_load(), DEAR_OK);
        ck_assert_int_eq(dear_topo_detect(MPI_COMM_WORLD, &t), DEAR_OK);
        ck_assert_int_eq(t.progress_core, core);
    }

    /* A core the node lacks: DEAR_ERR_PARAM naming the value and the count, on every rank. */
    setenv("DEAR_PROGRESS_CORE", "8", 1);
    ck_assert_int_eq(dear_params_load(), DEAR_OK);   /* in range for the parameter itself */
    logbuf[0] = '\0';
    memset(&t, 0x5a, sizeof t);
    ck_assert_int_eq(dear_topo_detect(MPI_COMM_WORLD, &t), DEAR_ERR_PARAM);
    ck_assert_int_eq(t.progress_core, 0x5a5a5a5a);   /* untouched on failure */
    ck_assert_msg(strstr(logbuf, "DEAR_PROGRESS_CORE=8 names Core 8, but this node has 8 Cores (logical indices 0..7") != NULL,
                  "%s", logbuf);

    /* Only the last rank has the bad value: every rank still fails, none hangs. */
    if (size > 1) {
        setenv("DEAR_PROGRESS_CORE", rank == size - 1 ? "99" : "2", 1);
        ck_assert_int_eq(dear_params_load(), DEAR_OK);
        logbuf[0] = '\0';
        ck_assert_int_eq(dear_topo_detect(MPI_COMM_WORLD, &t), DEAR_ERR_PARAM);
        if (rank == size - 1)
            ck_assert_msg(strstr(logbuf, "DEAR_PROGRESS_CORE=99 names Core 99") != NULL, "%s", logbuf);
        else
            ck_assert_msg(strstr(logbuf, "topology detection failed on another rank") != NULL, "%s", logbuf);
    }

    /* Without cores, indices are PUs: "pack:2 pu:3" has PUs 0..5. */
    setenv("HWLOC_SYNTHETIC", "pack:2 pu:3", 1);
    setenv("DEAR_PROGRESS_CORE", "5", 1);
    ck_assert_int_eq(dear_params_load(), DEAR_OK);
    ck_assert_int_eq(dear_topo_detect(MPI_COMM_WORLD, &t), DEAR_OK);
    ck_assert_int_eq(t.progress_core, 5);
    setenv("DEAR_PROGRESS_CORE", "6", 1);
    ck_assert_int_eq(dear_params_load(), DEAR_OK);
    logbuf[0] = '\0';
    ck_assert_int_eq(dear_topo_detect(MPI_COMM_WORLD, &t), DEAR_ERR_PARAM);
    ck_assert_msg(strstr(logbuf, "names PU 6, but this node has 6 PUs") != NULL, "%s", logbuf);
}
END_TEST

/* dear_topo_bind_self in a fresh thread, as the progress thread calls it. */
typedef struct { dear_topo_t topo; int rc; cpu_set_t mask; } bind_arg_t;

static void *bind_thread(void *p)
{
    bind_arg_t *a = p;
    a->rc = dear_topo_bind_self(&a->topo);
    sched_getaffinity(0, sizeof a->mask, &a->mask);
    return NULL;
}

START_TEST(test_bind_self)
{
    bind_arg_t a;
    pthread_t th;
    hwloc_topology_t hw;

    /* The real machine: the thread ends up on exactly the PUs of the last core. */
    ck_assert_int_eq(dear_topo_detect(MPI_COMM_WORLD, &a.topo), DEAR_OK);
    ck_assert_int_eq(hwloc_topology_init(&hw), 0);
    ck_assert_int_eq(hwloc_topology_load(hw), 0);
    int ncores = hwloc_get_nbobjs_by_type(hw, HWLOC_OBJ_CORE);
    hwloc_obj_type_t type = ncores > 0 ? HWLOC_OBJ_CORE : HWLOC_OBJ_PU;
    int last = hwloc_get_nbobjs_by_type(hw, type) - 1;
    hwloc_obj_t obj = hwloc_get_obj_by_type(hw, type, (unsigned)last);
    a.topo.progress_core = last;
    ck_assert_int_eq(pthread_create(&th, NULL, bind_thread, &a), 0);
    ck_assert_int_eq(pthread_join(th, NULL), 0);
    ck_assert_int_eq(a.rc, DEAR_OK);
    for (int cpu = 0; cpu < CPU_SETSIZE; cpu++)
        ck_assert_msg(!!CPU_ISSET(cpu, &a.mask) == hwloc_bitmap_isset(obj->cpuset, (unsigned)cpu),
                      "cpu %d: affinity %d, core %d", cpu, !!CPU_ISSET(cpu, &a.mask),
                      hwloc_bitmap_isset(obj->cpuset, (unsigned)cpu));
    hwloc_topology_destroy(hw);

    /* -1: nothing happens, the thread keeps the creator's mask. */
    a.topo.progress_core = -1;
    ck_assert_int_eq(pthread_create(&th, NULL, bind_thread, &a), 0);
    ck_assert_int_eq(pthread_join(th, NULL), 0);
    ck_assert_int_eq(a.rc, DEAR_OK);
    ck_assert(CPU_EQUAL(&a.mask, &original_mask));

    /* A synthetic topology cannot be bound to: a warning, not an error. */
    setenv("HWLOC_SYNTHETIC", "pack:2 core:4 pu:2", 1);
    a.topo.progress_core = 3;
    logbuf[0] = '\0';
    ck_assert_int_eq(pthread_create(&th, NULL, bind_thread, &a), 0);
    ck_assert_int_eq(pthread_join(th, NULL), 0);
    ck_assert_int_eq(a.rc, DEAR_OK);
    ck_assert(CPU_EQUAL(&a.mask, &original_mask));
    ck_assert_msg(strstr(logbuf, "warn topo: the hwloc topology does not describe this machine") != NULL, "%s", logbuf);
    ck_assert_int_eq(dear_topo_bind_self(NULL), DEAR_ERR_ARG);
}
END_TEST

START_TEST(test_print)
{
    dear_topo_t t;
    char *buf = NULL;
    size_t len = 0;
    setenv("HWLOC_SYNTHETIC", "pack:2 numa:1 core:4 pu:2", 1);
    setenv("DEAR_PROGRESS_CORE", "6", 1);
    ck_assert_int_eq(dear_params_load(), DEAR_OK);
    ck_assert_int_eq(dear_topo_detect(MPI_COMM_WORLD, &t), DEAR_OK);
    FILE *f = open_memstream(&buf, &len);
    ck_assert_ptr_nonnull(f);
    dear_topo_print(f, &t);
    fclose(f);
    ck_assert(strstr(buf, "  packages        : 2\n"));
    ck_assert(strstr(buf, "  NUMA nodes      : 2\n"));
    ck_assert(strstr(buf, "  cores           : 8\n"));
    ck_assert(strstr(buf, "  PUs             : 16\n"));
    ck_assert(strstr(buf, "  progress thread : core 6 (hwloc logical index)\n"));
    free(buf);
}
END_TEST

int main(int argc, char **argv)
{
    int provided;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
    np_check(argv[0]);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    dear_log_set_rank(rank);
    sched_getaffinity(0, sizeof original_mask, &original_mask);
    for (int cpu = 0; cpu < CPU_SETSIZE; cpu++)
        if (CPU_ISSET(cpu, &original_mask))
            real_cpus[nreal++] = cpu;

    Suite *s = suite_create("topo");
    TCase *tc = tcase_create("topo");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, test_synthetic_counts);
    tcase_add_test(tc, test_xml_counts);
    tcase_add_test(tc, test_auto_picks_free_core);
    tcase_add_test(tc, test_auto_every_core_used);
    tcase_add_test(tc, test_auto_unbound_ranks);
    tcase_add_test(tc, test_explicit_core);
    tcase_add_test(tc, test_bind_self);
    tcase_add_test(tc, test_print);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, rank == 0 ? CK_NORMAL : CK_SILENT);
    int failed = srunner_ntests_failed(sr);
    if (failed && rank != 0) {
        /* Other ranks run silently; their failures still need to be seen. */
        TestResult **tr = srunner_failures(sr);
        for (int i = 0; i < failed; i++)
            fprintf(stderr, "rank %d: %s:%d: %s\n", rank, tr_lfile(tr[i]), tr_lno(tr[i]), tr_msg(tr[i]));
        free(tr);
    }
    srunner_free(sr);
    /* Any rank's failure fails the run. */
    int any = 0;
    MPI_Allreduce(&failed, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    MPI_Finalize();
    return any ? 1 : 0;
}
