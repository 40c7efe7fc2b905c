/*
 * predict.c: dear-bench's predictions. The cost model is a preset, an all-reduce alpha/beta, an
 * entry of a calibration cache, or by default the model the runtime itself calibrated during
 * the runs (read back from its cache), so prediction and runtime plan with the same numbers;
 * when no run calibrated, a quick fit of MPI's collectives stands in. The simulator (fusion/sim.h)
 * then plays each configuration's plan on the scaled profile under that model, and the lower
 * bound says how far any schedule could get.
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <mpi.h>

#include "base/fileio.h"
#include "base/params.h"
#include "fusion/cost.h"
#include "fusion/planners.h"
#include "fusion/profile.h"
#include "fusion/sim.h"
#include "fusion/units.h"
#include "include/dear.h"
#include "apps/bench/bench.h"
#include "apps/bench/predict.h"

/* Default cost model: a quick least-squares fit of MPI's blocking collectives on this
 * communicator (three sizes, best of three). Sizes are those of typical buckets: below them
 * TCP latency effects make the line a poor fit where most bytes travel. The runtime's own
 * collectives may differ; the prediction error column says by how much. Collective. */
static int calibrate_mpi(size_t max_bytes, dear_cost_model_t *model)
{
    static const size_t sizes[] = { (size_t)256 << 10, (size_t)1 << 20, (size_t)4 << 20 };
    size_t cap = max_bytes < sizes[2] ? max_bytes : sizes[2];
    if (cap < sizes[1])
        cap = sizes[1];
    size_t nmax = (cap / sizeof(float) / bench_size + 1) * bench_size;
    float *a = calloc(nmax, sizeof(float)), *b = calloc(nmax, sizeof(float));
    int ok = a && b, all_ok;
    MPI_Allreduce(&ok, &all_ok, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    if (!all_ok) {
        free(a), free(b);
        return DEAR_ERR_NOMEM;
    }
    memset(model, 0, sizeof *model);
    model->comm_size = bench_size;
    model->ranks_per_host = 1;
    snprintf(model->source, sizeof model->source, "bench-fit-mpi");
    int rc = DEAR_OK;
    for (int op = 0; op < DEAR_COLL_OP_COUNT && rc == DEAR_OK; op++) {
        double xs[3], ys[3];
        int n = 0;
        for (int si = 0; si < 3; si++) {
            size_t bytes = sizes[si] > cap ? cap : sizes[si];
            if (si > 0 && bytes == sizes[si - 1])
                break;
            int per = (int)(bytes / sizeof(float) / bench_size);
            if (per < 1)
                per = 1;
            double best = INFINITY;
            for (int rep = 0; rep < 4; rep++) {
                MPI_Barrier(MPI_COMM_WORLD);
                double t0 = MPI_Wtime();
                if (op == DEAR_COLL_REDUCE_SCATTER)
                    MPI_Reduce_scatter_block(a, b, per, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
                else if (op == DEAR_COLL_ALLGATHER)
                    MPI_Allgather(a, per, MPI_FLOAT, b, per, MPI_FLOAT, MPI_COMM_WORLD);
                else
                    MPI_Allreduce(a, b, per * bench_size, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
                double dt = MPI_Wtime() - t0, dtmax;
                MPI_Allreduce(&dt, &dtmax, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
                if (rep > 0) /* the first call sets up connections */
                    best = fmin(best, dtmax);
            }
            xs[n] = (double)per * bench_size * sizeof(float);
            ys[n] = best;
            n++;
        }
        rc = dear_cost_fit(xs, ys, n, &model->line[op][DEAR_ALGO_RING]);
    }
    free(a), free(b);
    return rc;
}

/* A calibration cache's entry for this communicator, keyed by ranks per host as MPI sees
 * shared-memory nodes (the runtime's key, stored in *rph). Rank 0 reads path (the other ranks'
 * is not used), everyone receives: the runtime writes its cache on rank 0 only. *found: lines in
 * the entry. Collective. */
static int load_calibration(const char *path, dear_cost_model_t *model, int *found, int *rph_out)
{
    MPI_Comm node;
    int rph = 1, rc = DEAR_OK;
    MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node);
    MPI_Comm_size(node, &rph);
    MPI_Comm_free(&node);
    MPI_Allreduce(MPI_IN_PLACE, &rph, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    *found = 0;
    if (bench_rank == 0)
        rc = dear_cost_load_ex(path, bench_size, rph, (int)dear_param_int(DEAR_P_MAX_INFLIGHT), model, found);
    int hdr[2] = { rc, *found };
    MPI_Bcast(hdr, 2, MPI_INT, 0, MPI_COMM_WORLD);
    rc = hdr[0], *found = hdr[1];
    if (rc == DEAR_OK && *found)
        MPI_Bcast(model, (int)sizeof *model, MPI_BYTE, 0, MPI_COMM_WORLD);
    *rph_out = rph;
    return rc;
}

/* The model the predictions use: the one asked for, else (use_runtime) the runtime's own
 * calibration from the runs just made, in rank 0's runtime_calib, else a fit of MPI's
 * collectives. Collective. */
int bench_load_model(const bench_opts_t *o, int use_runtime, const char *runtime_calib, size_t total_bytes,
               dear_cost_model_t *model)
{
    if (o->preset)
        return dear_cost_preset(o->preset, bench_size, 1, model);
    if (o->have_ab)
        return dear_cost_from_alpha_beta(o->alpha, o->beta, bench_size, model);
    int found = 0, rph = 1, rc;
    if (o->calibration) {
        if ((rc = load_calibration(o->calibration, model, &found, &rph)) != DEAR_OK)
            return rc;
        if (!found && bench_rank == 0)
            fprintf(stderr, "dear-bench: %s has no entry for %d ranks, %d per host\n", o->calibration, bench_size, rph);
        return found ? DEAR_OK : DEAR_ERR_ARG;
    }
    if (use_runtime) {
        if ((rc = load_calibration(runtime_calib, model, &found, &rph)) != DEAR_OK)
            return rc;
        if (found) {
            snprintf(model->source, sizeof model->source, "runtime-fit");
            return DEAR_OK;
        }
    }
    return calibrate_mpi(total_bytes, model);
}

/* Rank 0: unless the user chose a model or a cache, the runtime calibrates into a temporary
 * cache, which the later configurations reuse (one calibration per run, one model for all) and
 * the predictions read. NULL when not used. The other ranks never read the variable. */
char *bench_runtime_calibration_file(const bench_opts_t *o, int *created)
{
    static char path[4096];
    *created = 0;
    if (o->preset || o->have_ab || o->calibration || bench_rank != 0)
        return NULL;
    const char *set = getenv("DEAR_CALIBRATION_FILE");
    if (set && set[0]) {
        snprintf(path, sizeof path, "%s", set);
        return path;
    }
    const char *dir = getenv("TMPDIR");
    snprintf(path, sizeof path, "%s/dear-bench-calib-XXXXXX", dir && dir[0] ? dir : "/tmp");
    int fd = mkstemp(path);
    if (fd < 0 || setenv("DEAR_CALIBRATION_FILE", path, 1) != 0) {
        fprintf(stderr, "dear-bench: cannot create a calibration cache %s (%s): every configuration calibrates "
                        "anew and predictions use a fit of MPI's collectives\n",
                path, strerror(errno));
        if (fd >= 0)
            close(fd), unlink(path);
        return NULL;
    }
    close(fd);
    *created = 1;
    return path;
}

/* The simulator's iteration time for a configuration on the scaled profile: of the plan the
 * runtime ran when known (ran, over its own units), else planned the way the runtime plans it
 * (same units, same planner, same scaled threshold), the last rank's lateness on the backward
 * pass's end. Optionally its Gantt chart. */
int bench_predict(const bench_model_t *m, const dear_cost_model_t *model, const bench_config_t *c, const bench_opts_t *o,
            const dear_plan_t *ran, const double *upd_s, double late_s, double *iter_s)
{
    dear_sched_t s;
    if (dear_sched_parse(c->sched, &s))
        return DEAR_ERR_ARG;
    dear_sim_model_arg_t marg;
    dear_plan_problem_t prob;
    dear_plan_t plan = { 0 };
    dear_sim_result_t res = { 0 };
    dear_profile_t uprof = { 0 };
    dear_unit_t *units = NULL;
    int nunits = 0, rc;
    if (ran && ran->ntensors == m->prof.ntensors && s != DEAR_SCHED_SYNC)
        rc = dear_prof_units(&m->prof, ran->nunits, ran->units, &uprof);
    else
        /* the units the runtime cuts the scaled profile into for this configuration */
        rc = dear_prof_cut(&m->prof, bench_scaled_partition(c, o), &units, &nunits, &uprof);
    /* Updates are forward compute (runtime/iteration.c runs each layer's before its forward),
     * except sharded ones under dear: steps after the reduce-scatters, spread over a layer's
     * tensors by bytes (fusion/sim.h). */
    int steps = c->shard && s == DEAR_SCHED_DEAR;
    for (int l = 0; rc == DEAR_OK && !steps && l < uprof.nlayers && l < m->prof.nlayers; l++)
        uprof.layers[l].fwd_s += upd_s[l];
    if (rc == DEAR_OK && steps)
        rc = dear_prof_set_steps(&uprof, upd_s);
    /* The collectives at the end of backward wait that much longer for the last rank. */
    if (rc == DEAR_OK && uprof.nlayers > 0)
        uprof.layers[0].bwd_s += late_s;
    if (rc == DEAR_OK)
        rc = dear_plan_problem_init(&prob, &uprof, s, model, 0, &marg);
    if (rc != DEAR_OK)
        goto out;
    prob.threshold = bench_scaled_threshold(c, o);
    /* Sharded: the all-gathers follow the updates, during backward only when slices are stepped
     * there (dear-bench runs no clipping and no DEAR_FIND_UNUSED). */
    prob.no_early = c->shard && (s != DEAR_SCHED_DEAR || !bench_shard_early());
    prob.shard = !steps ? DEAR_SIM_SHARD_NONE : prob.no_early ? DEAR_SIM_SHARD_END : DEAR_SIM_SHARD_EARLY;
    if (ran && ran->ntensors == m->prof.ntensors && s != DEAR_SCHED_SYNC)
        rc = dear_plan_copy(&plan, ran);
    else
        rc = dear_plan_by_name(&plan, &prob, c->fusion);
    if (rc != DEAR_OK)
        goto out;
    /* The chart is rank 0's, the one rank that knows the plan that ran: the others plan the
     * configuration themselves, and their chart would overwrite its file. */
    int chart = o->svg_dir != NULL && bench_rank == 0;
    rc = dear_sim_run_ex(&uprof, &prob.cost, s, &plan, prob.shard, chart, &res);
    if (rc == DEAR_OK)
        *iter_s = res.iter_s;
    if (rc == DEAR_OK && chart) {
        char path[1024], name[64], title[256];
        snprintf(name, sizeof name, "%s", c->text);
        for (char *p = name; *p; p++)
            if (*p == ':' || *p == '/' || *p == ' ')
                *p = '-';
        snprintf(path, sizeof path, "%s/pred-%s-np%d-%s.svg", o->svg_dir, m->prof.model, bench_size, name);
        snprintf(title, sizeof title, "%s, P=%d (%s), %s: predicted", m->prof.model, bench_size, model->source, c->text);
        dear_file_out_t out;
        if (dear_file_out_open(&out, path, "SVG file") == DEAR_OK) {
            if (dear_sim_svg(&res, title, out.f) != DEAR_OK) {
                fprintf(stderr, "dear-bench: cannot draw %s\n", path);
                dear_file_out_abort(&out);
            } else {
                dear_file_out_commit(&out);
            }
        }
    }
out:
    dear_sim_result_free(&res);
    dear_plan_free(&plan);
    dear_prof_free(&uprof);
    free(units);
    return rc;
}

/* One stream of `bytes` from rank `from` to rank `to` in LINK_MSG messages, acknowledged by
 * `to` with one byte: seconds on `from` (0 elsewhere). */
#define LINK_MSG ((size_t)1 << 20)
static double link_stream(int from, int to, char *buf, size_t bytes)
{
    char ack = 0;
    double t = 0;
    if (bench_rank == from) {
        double t0 = MPI_Wtime();
        for (size_t off = 0; off < bytes; off += LINK_MSG)
            MPI_Send(buf, (int)LINK_MSG, MPI_BYTE, to, 71, MPI_COMM_WORLD);
        MPI_Recv(&ack, 1, MPI_BYTE, to, 72, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        t = MPI_Wtime() - t0;
    } else if (bench_rank == to) {
        for (size_t off = 0; off < bytes; off += LINK_MSG)
            MPI_Recv(buf, (int)LINK_MSG, MPI_BYTE, from, 71, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        MPI_Send(&ack, 1, MPI_BYTE, from, 72, MPI_COMM_WORLD);
    }
    return t;
}

int bench_measure_links(double mbps, bench_links_t *links)
{
    MPI_Comm node;
    int lrank = 0, hosts = 1, peer = -1;
    if (MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node) != MPI_SUCCESS)
        return DEAR_ERR_MPI;
    MPI_Comm_rank(node, &lrank);
    /* rank 0's host: the lowest world rank of each host names it */
    int leader = lrank == 0 ? bench_rank : -1, first = 0;
    MPI_Allreduce(&leader, &first, 1, MPI_INT, MPI_MAX, node);
    int lead = lrank == 0;
    MPI_Allreduce(&lead, &hosts, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    /* the peer: the lowest rank on another host than rank 0's, else rank 1 */
    int other = first != 0 ? bench_rank : bench_size;
    MPI_Allreduce(&other, &peer, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    if (peer >= bench_size)
        peer = bench_size > 1 ? 1 : -1;
    MPI_Comm_free(&node);
    *links = (bench_links_t){ .hosts = hosts };
    if (mbps > 0) {
        links->rate = mbps * 1e6;
        snprintf(links->source, sizeof links->source, "--link-rate %g MB/s", mbps);
        return DEAR_OK;
    }
    if (peer < 0) {
        links->rate = INFINITY;
        snprintf(links->source, sizeof links->source, "one rank: no link");
        return DEAR_OK;
    }
    /* The fastest of three: a bound needs the most the link was seen to carry. */
    size_t bytes = (size_t)16 << 20;
    char *buf = (bench_rank == 0 || bench_rank == peer) ? calloc(1, LINK_MSG) : NULL;
    int ok = buf != NULL || (bench_rank != 0 && bench_rank != peer), all = 0;
    MPI_Allreduce(&ok, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    if (!all) {
        free(buf);
        return DEAR_ERR_NOMEM;
    }
    double best = INFINITY;
    link_stream(0, peer, buf, LINK_MSG); /* untimed: the connection set up */
    for (int k = 0; k < 3; k++) {
        double t = link_stream(0, peer, buf, bytes);
        if (bench_rank == 0 && t < best)
            best = t;
    }
    free(buf);
    double rate = bench_rank == 0 ? (double)bytes / best : 0;
    MPI_Bcast(&rate, 1, MPI_DOUBLE, 0, MPI_COMM_WORLD);
    links->rate = rate;
    snprintf(links->source, sizeof links->source, "measured rank 0 -> %d (%s host), %.1f MB/s", peer,
             hosts > 1 ? "another" : "the same", rate / 1e6);
    return DEAR_OK;
}

double bench_lower_bound(const bench_model_t *m, const bench_links_t *links, double upd_s)
{
    const dear_profile_t *p = &m->prof;
    /* the share of each phase's bytes that must cross the bottleneck link */
    int n = links->hosts > 1 ? links->hosts : bench_size;
    double share = n > 1 ? (double)(n - 1) / n : 0;
    double fb = dear_prof_fwd_total(p) + dear_prof_bwd_total(p), link = 0, bound = fb + upd_s;
    /* Cut after layer k: fb holds compute(k..L-1), link the link time of layers 0..k. */
    for (int l = 0, t = 0; l < p->nlayers; l++) {
        for (; t < p->ntensors && p->tensors[t].lidx == l; t++)
            for (int ph = 0; ph < 2; ph++)
                link += share * dear_prof_wire_bytes(&p->tensors[t], ph ? DEAR_COLL_ALLGATHER
                                                                           : DEAR_COLL_REDUCE_SCATTER) / links->rate;
        bound = fmax(bound, fb + link);
        fb -= p->layers[l].fwd_s + p->layers[l].bwd_s;
    }
    return bound;
}
