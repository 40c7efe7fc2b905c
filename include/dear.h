/*
 * dear.h: the whole public API of libdear.
 *
 * libdear makes gradient synchronisation of MPI data-parallel training nearly free. Every
 * all-reduce is split into a reduce-scatter, launched during back-propagation as soon as a
 * bucket of gradients is complete, and an all-gather that runs during the next forward pass,
 * just ahead of the layer that needs it (DeAR). A progress thread owned by the library makes
 * every MPI call on a private duplicate of the communicator; the application thread only ever
 * blocks for data it needs.
 *
 * One iteration, for every schedule (DEAR_SCHEDULE=dear|wfbp|sync):
 *
 *     for l in layers (forward order):  dear_forward_begin(ctx, l); forward(l);
 *     for l in layers (reverse order):  backward(l) -> writes grads; dear_backward_done(ctx, l);
 *     dear_backward_end(ctx);
 *
 * The update callback of each tensor runs exactly once per iteration, on the application
 * thread, the moment that tensor's averaged gradient is in place: inside dear_forward_begin of
 * its layer for `dear`, inside dear_backward_end for `wfbp` and `sync`. Call dear_flush before
 * evaluation, checkpointing and exit: it completes all communication and runs every pending
 * update, so no step is ever silently deferred.
 *
 * All functions return DEAR_OK (0) or a negative dear_status_t; the first place inside the
 * library that sees an error logs it with context, so callers need only check the code.
 * A context's functions run one at a time. Calls from different threads one after another are
 * fine (PyTorch runs backward hooks on its autograd threads); a call made while another runs on
 * another thread, or from inside an update callback, fails at once with DEAR_ERR_STATE, says so,
 * and changes nothing (dear_finalize then frees nothing). The getters of what dear_init and
 * dear_commit fixed (dear_schedule, dear_transport, dear_tensor_index, dear_shard_slices) take no
 * part in this and may be called from anywhere after commit.
 */
#ifndef DEAR_H
#define DEAR_H

#include <mpi.h>

#include "dear_types.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Create a context on comm (duplicated internally). MPI must be initialised with
 * MPI_THREAD_MULTIPLE; anything less fails with DEAR_ERR_UNSUPPORTED and says so. Reads the
 * DEAR_* environment once: a bad value fails with DEAR_ERR_PARAM naming it. Collective. */
DEAR_API int dear_init(MPI_Comm comm, dear_ctx_t **ctx);

/* Register one gradient tensor, in forward order. layer: the caller's layer id; ids must be
 * non-decreasing in registration order and a layer may hold several tensors. grad must stay
 * valid until dear_finalize; tensors that lie back to back in memory (one gradient arena) are
 * communicated without copies. name: up to 63 characters, unique. count must be > 0; dtype
 * a floating type (DEAR_INT32 is refused: it cannot be averaged); update may be NULL (the
 * averaged gradient is then only left in grad). mem says where grad lies: DEAR_MEM_HOST, or
 * DEAR_MEM_CUDA for memory of the calling thread's current CUDA device (cudaMalloc'd, one
 * allocation per tensor or one arena for all), checked against what CUDA says the pointer is;
 * all tensors of a context lie in one kind of memory. Errors: DEAR_ERR_ARG (including a pointer
 * of the other kind or another device), DEAR_ERR_UNSUPPORTED (DEAR_MEM_CUDA without CUDA in the
 * build), DEAR_ERR_STATE (after dear_commit). */
DEAR_API int dear_register(dear_ctx_t *ctx, const char *name, int layer, void *grad, size_t count,
                           dear_dtype_t dtype, dear_mem_t mem, dear_update_fn update, void *arg);

/* CUDA gradients (DEAR_MEM_CUDA): the stream the application computes on (a cudaStream_t; NULL,
 * the default, is the legacy default stream). The hooks order communication against it on the
 * GPU and never block the host thread on the GPU: dear_backward_done records an event on it that
 * the layer's communication waits for; dear_forward_begin makes it wait for the events of the
 * layer's all-gathers and runs the updates, whose dear_update_info_t.stream is this stream, so an
 * update kernel launched there reads the averaged gradient. Between iterations; any time before
 * dear_commit. Ignored for host memory.
 *
 *     dear_set_stream(ctx, (void *)stream);      // before dear_commit
 *     // in the update: my_sgd_kernel<<<grid, block, 0, (cudaStream_t)info->stream>>>(...) */
DEAR_API int dear_set_stream(dear_ctx_t *ctx, void *stream);

/* Declare a layer that may hold no registered tensor (an activation, attention scores, the loss),
 * so that its hooks are accepted and the profile and the timeline see its time. Layers need not be
 * declared in order. Every rank must declare the same layers (dear_commit checks it). Call the
 * hooks of a declared layer like any other's: dear_backward_end waits for its backward_done too.
 * DEAR_ERR_STATE after dear_commit. */
DEAR_API int dear_register_layer(dear_ctx_t *ctx, int layer);

/* A hint of layer's compute for the plan made before any profile: its forward FLOPs, or any
 * number proportional to them in one unit for every layer (only ratios between layers count),
 * finite and >= 0. With a model-driven planner (DEAR_FUSION=mgwfbp|dp|gradssa|auto) on two or
 * more ranks, training starts on a plan made from the model's structure and the cost model
 * (DEAR_FIRST_PLAN): each layer's compute is its hint, or without one its dense parameter bytes
 * at the hinted layers' FLOPs per byte (a layer of sparse tensors and one without parameters
 * count nothing). The plan made from the measured profile replaces it after DEAR_WARMUP_ITERS.
 * Call it after registering the layer (a tensor of it, or dear_register_layer) and before
 * dear_commit, where the first plan is made; with DEAR_FIRST_PLAN=first also until the first
 * dear_backward_end, where it is made again with the first iteration's times (the PyTorch
 * binding sets hints there from the shapes its first forward saw); later calls change nothing.
 * Rank 0's hints decide: it plans for every rank. Errors: DEAR_ERR_ARG for an unknown layer or
 * a hint that is negative, infinite or NaN; DEAR_ERR_STATE during a backward pass.
 *
 *     dear_set_layer_cost(ctx, 3, 2.0 * in * out * tokens);    // a linear layer's forward
 */
DEAR_API int dear_set_layer_cost(dear_ctx_t *ctx, int layer, double flops);

/* Declare tensor (its registration index, dear_tensor_index) sparse-capable: its gradient is
 * mostly zero rows, as a token embedding's, whose rows a batch barely touches. row_elems is the row
 * length, the block that travels or not as a whole; it must divide the tensor's count (otherwise
 * DEAR_ERR_ARG naming the tensor, the count and the block). Call it after dear_register and before
 * dear_commit (DEAR_ERR_STATE afterwards); a second call replaces the block. Every rank must
 * declare the same (dear_commit fails with DEAR_ERR_MISMATCH naming the tensor). Sparse tensors of
 * one block size travel in buckets of their own, whatever the planner, with collectives that send
 * only the non-zero blocks (and each message whole when that is no larger); the results are the
 * dense ones bit for bit. DEAR_SPARSE=auto (the default) measures the density over the warm-up
 * iterations and then keeps the sparse form only for the phases where it sends fewer bytes; on
 * keeps it always, off never. DEAR_SPARSE_BLOCK, when not 0, replaces every sparse tensor's
 * block at dear_commit (DEAR_ERR_PARAM there when it does not divide a count). dear_get_sparse_stats
 * says what happened:
 *
 *     dear_register(ctx, "embed.w", 0, g, vocab * dim, DEAR_FLOAT32, DEAR_MEM_HOST, sgd, w);
 *     dear_register_sparse(ctx, dear_tensor_index(ctx, "embed.w"), dim);
 */
DEAR_API int dear_register_sparse(dear_ctx_t *ctx, int tensor, size_t row_elems);

/* The parameters of tensor (its registration index): count elements of its dtype in the same kind
 * of memory as its gradient, overlapping no registered gradient or parameters. Update callbacks
 * then see them as dear_update_info_t.param; sharded updates need them for every tensor. Before
 * dear_commit (DEAR_ERR_STATE afterwards). */
DEAR_API int dear_set_param(dear_ctx_t *ctx, int tensor, void *param);

/* Sharded updates (ZeRO's optimizer-state sharding inside DeAR's schedule): flags DEAR_SHARD_ON,
 * optionally | DEAR_SHARD_HOLD; 0 off (the default, unless DEAR_SHARD=1). Before dear_commit,
 * after dear_set_param for every tensor; every rank the same. Each tensor (each chunk of a cut
 * tensor) is cut into P slices, rank r updating slice r, whatever the plan: after the
 * reduce-scatters, dear_backward_end calls the update callback once per slice this rank owns
 * (info->grad and info->param point at the slice, info->offset says where it lies in the tensor,
 * info->shard_offset where in this rank's shard), and the all-gathers then carry the updated
 * parameters into every rank's parameter buffers: during the next forward pass under `dear`
 * (dear_forward_begin of a layer waits for its parameters), before dear_backward_end returns
 * under `wfbp` and `sync` (which then reduce-scatter and gather instead of all-reducing). The
 * bytes on the wire are the same; optimizer work and state are 1/P. The callback must update
 * only its slice with an element-wise rule (SGD, momentum, Adam, AdamW: a slice's step is that
 * slice of the tensor's step), keeping state for its slices only (dear_shard_slices). After
 * dear_backward_end a rank's gradient buffers hold the averaged gradient on its own slices only
 * (its own gradient or scratch elsewhere): the next backward pass writes them, it does not add
 * to them. The slices never move: a plan switch, freezing and re-planning keep them.
 * DEAR_SHARD_HOLD: the callbacks only note their slices; the program steps them after
 * dear_backward_end returns and calls dear_shard_release (the next hook or dear_flush releases
 * what is still held: un-stepped parameters are then sent as they are). Refused (with the
 * reason): CUDA memory (DEAR_ERR_UNSUPPORTED); tensors declared sparse travel dense (the
 * parameters are dense). For example:
 *
 *     dear_set_param(ctx, t, w + off[t]);                    // every tensor, then
 *     dear_set_shard(ctx, DEAR_SHARD_ON);
 *     dear_commit(ctx);
 *     int n = dear_shard_slices(ctx, rank, NULL, 0);         // then allocate the state:
 *     // state[info->shard_offset + i] belongs to info->param[i] in the update callback
 */
DEAR_API int dear_set_shard(dear_ctx_t *ctx, int flags);

/* DEAR_SHARD_HOLD: this rank stepped its slices of the last dear_backward_end; their parameters
 * start travelling. Under `wfbp` and `sync` it returns once every parameter is in place. A no-op
 * when nothing is held. */
DEAR_API int dear_shard_release(dear_ctx_t *ctx);

/* The slices of the registered tensors that rank updates under sharded updates, in one fixed
 * order (by tensor, then offset; frozen tensors included, so the list never changes during a
 * run), each with its place in the rank's shard: slices[k].shard_offset is the sum of the counts
 * before it. Fills at most max of them and returns how many there are (a rank may own none of a
 * small tensor), or a negative error: DEAR_ERR_STATE before dear_commit or without sharded
 * updates, DEAR_ERR_ARG for a rank outside the communicator. */
DEAR_API int dear_shard_slices(const dear_ctx_t *ctx, int rank, dear_slice_t *slices, int max);

/* Freeze the registry and build the communication plan. Collective: every rank must have
 * registered the same tensors (name, layer, count, type, order); otherwise every rank fails
 * within seconds with DEAR_ERR_MISMATCH and a message naming the first difference.
 * With a model-driven planner (DEAR_FUSION=mgwfbp|dp|gradssa|auto, auto being the default) on
 * two or more ranks, commit also gets the cost model: DEAR_CALIBRATE=auto measures the
 * collectives the schedule runs on the communicator (reduce-scatter and all-gather for dear,
 * all-reduce otherwise; 0.2-0.3 s on 4 ranks of one 2-core host, seconds across a slow
 * network) unless DEAR_CALIBRATION_FILE already holds them (a cache it fills gets every
 * collective, so that it serves every schedule: 0.5-1 s there); DEAR_CALIBRATE=off takes DEAR_COST_PRESET. Training
 * then starts on a plan made from the model's structure without timing anything
 * (DEAR_FIRST_PLAN, dear_set_layer_cost), or on the threshold plan with DEAR_FIRST_PLAN=threshold;
 * see dear_backward_end for the switches. DEAR_PLAN_FILE,
 * DEAR_FUSION=none|threshold and DEAR_SCHEDULE=sync keep one fixed plan. */
DEAR_API int dear_commit(dear_ctx_t *ctx);

/* Before computing the forward pass of layer: waits until the layer's averaged gradients from
 * the previous iteration are in place and runs their updates (schedule `dear`), and the updates
 * of the later layers whose gradients arrived in the same all-gather group. Call it for
 * every layer before the backward pass writes that layer's gradients; a repeated call (an
 * evaluation forward) has nothing left to do. An unknown layer id is DEAR_ERR_ARG; a call
 * between the first dear_backward_done and dear_backward_end is DEAR_ERR_STATE. */
DEAR_API int dear_forward_begin(dear_ctx_t *ctx, int layer);

/* After the gradients of layer are written: buckets that became complete are queued. A second
 * call for a layer in the same backward pass is DEAR_ERR_STATE. */
DEAR_API int dear_backward_done(dear_ctx_t *ctx, int layer);

/* After the whole backward pass: queues the all-gathers (dear) or waits for the all-reduces
 * and runs the updates (wfbp, sync). DEAR_ERR_STATE unless every layer reported backward_done.
 * Online planning happens here: with DEAR_FIRST_PLAN=first, at the first backward_end the plan
 * from the model's structure is made again with the first iteration's measured forward and
 * backward times (every rank drains as below); at the backward_end of iteration DEAR_WARMUP_ITERS (and every
 * DEAR_REPLAN_EVERY iterations after it) every rank waits for the collectives in flight (dear:
 * this iteration's all-gathers, so this one call blocks for them; the updates still run in the
 * next dear_forward_begin), rank 0 plans from the measured per-layer times and broadcasts, and
 * all ranks continue on the new plan. With DEAR_FUSION=auto the new plan is then timed for
 * DEAR_VERIFY_ITERS iterations and, at another such backward_end, dropped for the plan it
 * replaced if that one ran faster. Results are unchanged by a switch (same sums, same updates);
 * DEAR_LOG_LEVEL=info logs the plan, its predicted and its measured iteration time. */
DEAR_API int dear_backward_end(dear_ctx_t *ctx);

/* Complete all communication in flight and run every pending update. Between iterations only
 * (during a backward pass it is DEAR_ERR_STATE); a no-op when nothing is pending. */
DEAR_API int dear_flush(dear_ctx_t *ctx);

/* What the next passes are, between iterations:
 * - DEAR_MODE_ACCUMULATE (gradient accumulation over micro-batches): forward_begin still runs the
 *   pending updates, but backward_done and backward_end communicate nothing, count no iteration
 *   and enter no profile. Each micro-batch adds its gradients to the registered buffers (the
 *   first one writes them). Set DEAR_MODE_TRAIN before the last micro-batch: its backward pass
 *   synchronises the sum, and the updates see it averaged over the ranks.
 * - DEAR_MODE_EVAL: completes all communication and runs every pending update first (as
 *   dear_flush), then forward_begin only checks its argument; backward hooks are DEAR_ERR_STATE.
 *   Evaluation passes enter neither the profile nor the iteration times.
 * - DEAR_MODE_TRAIN: the default.
 * DEAR_ERR_STATE during a backward pass. For example:
 *
 *     dear_set_mode(ctx, DEAR_MODE_ACCUMULATE);       // micro-batches 0 .. M-2: no messages
 *     for (m = 0; m < M - 1; m++) micro_batch(m);     // with the usual hooks
 *     dear_set_mode(ctx, DEAR_MODE_TRAIN);
 *     micro_batch(M - 1);                             // synchronises the sum
 *
 *     dear_set_mode(ctx, DEAR_MODE_EVAL);             // pending updates run first
 *     for (l = 0; l < L; l++) { dear_forward_begin(ctx, l); forward(l); }
 *     dear_set_mode(ctx, DEAR_MODE_TRAIN); */
DEAR_API int dear_set_mode(dear_ctx_t *ctx, dear_mode_t mode);

/* The schedule in force: "dear", "wfbp" or "sync" (DEAR_SCHEDULE). It says where averaged
 * gradients can be read. wfbp, sync: in every registered buffer from dear_backward_end on.
 * dear: a layer's in the next dear_forward_begin of that layer (just before its updates run),
 * or earlier with dear_wait_grad; reading a buffer before that gives this rank's own gradient. */
DEAR_API const char *dear_schedule(const dear_ctx_t *ctx);

/* What carries this context's collectives: "socket" (the TCP connections dear_init made) or
 * "mpi" (DEAR_TRANSPORT, with auto resolved). */
DEAR_API const char *dear_transport(const dear_ctx_t *ctx);

/* After dear_backward_end: wait for the averaged gradients of layer and put them in its
 * registered buffers, without running its updates (they still run in its dear_forward_begin)
 * and without waiting for any other layer's, whose communication goes on. Returns at once
 * under wfbp and sync (already in place), and when the layer's data is already there;
 * DEAR_ERR_STATE under sharded updates, where the average exists only as each rank's slices:
 *
 *     dear_backward_end(ctx);
 *     dear_wait_grad(ctx, l);   // grad of layer l now averaged, under every schedule
 */
DEAR_API int dear_wait_grad(dear_ctx_t *ctx, int layer);

/* Clip the averaged gradient to a global L2 norm before the updates: each update sees it
 * multiplied by min(1, max_norm / (norm + 1e-6)) and is told grad_norm and clip_coef
 * (dear_update_info_t), as torch.nn.utils.clip_grad_norm_ does. Under `dear` the norm comes from
 * the shards each rank holds after the reduce-scatters, summed by one scalar all-reduce before
 * any all-gather: the all-gathers keep their overlap with the next forward pass (the plan's early
 * all-gathers are not used). max_norm: 0 off, INFINITY to only report the norm. DEAR_CLIP_NORM
 * sets it at dear_commit. Call it before dear_commit to turn clipping on; afterwards only the
 * value can change (0 then reports without clipping). Every rank must use the same value:
 *
 *     dear_set_clip_norm(ctx, 1.0);   // before dear_commit
 *     // in the update: info->grad is clipped; info->grad_norm, info->clip_coef say by how much
 */
DEAR_API int dear_set_clip_norm(dear_ctx_t *ctx, double max_norm);

/* Send float32 gradients as 16-bit values, half the bytes: rs is the format of the reduce-scatters
 * (the all-reduces under wfbp and sync), ag that of the all-gathers (the all-reduces' second
 * half): DEAR_COMPRESS_NONE, DEAR_COMPRESS_BF16, DEAR_COMPRESS_FP16 or DEAR_COMPRESS_INT8 (8-bit
 * integers with a float32 scale per 256 values, about a quarter of the bytes, on the direct
 * exchange; on the NCCL transport through ncclAlltoAll, NCCL 2.28 or newer). Every sum is still taken in float32, values are rounded
 * only to cross the wire, and the averaged gradient arrives as float32 in the registered buffer;
 * tensors of other types travel as they are. error_feedback 1 keeps, on each rank, what rounding
 * its own gradient dropped and adds it to the next iteration's gradient (one float32 per element;
 * with 16 bits the registered gradient is rounded before its reduce-scatter; with int8 the owner
 * also keeps what quantizing its averaged shard for the all-gather dropped). Call
 * it before dear_commit (DEAR_ERR_STATE after); it replaces DEAR_COMPRESS, DEAR_COMPRESS_AG and
 * DEAR_COMPRESS_EF. Every rank must pass the same (dear_commit fails with DEAR_ERR_MISMATCH
 * otherwise). An unknown format is DEAR_ERR_ARG. When it pays and what it costs in accuracy:
 * docs/USAGE.md, "Compressed gradients".
 *
 *     dear_set_compress(ctx, DEAR_COMPRESS_BF16, DEAR_COMPRESS_BF16, 0);   // before dear_commit */
DEAR_API int dear_set_compress(dear_ctx_t *ctx, dear_compress_t rs, dear_compress_t ag, int error_feedback);

/* The registration index of the tensor named name (what dear_freeze and dear_no_grad take), or
 * DEAR_ERR_ARG when there is none. */
DEAR_API int dear_tensor_index(const dear_ctx_t *ctx, const char *name);

/* Freeze (frozen != 0) or thaw a tensor: a frozen tensor is neither communicated nor updated
 * (its bytes leave its bucket; a bucket left empty costs no message). Before dear_commit it
 * applies to every rank's registration (commit checks they agree); afterwards it is
 * collective: every rank calls it with the same arguments between training iterations, it
 * completes what is pending and rebuilds the buckets:
 *
 *     dear_freeze(ctx, dear_tensor_index(ctx, "embed.w"), 1);
 */
DEAR_API int dear_freeze(dear_ctx_t *ctx, int tensor, int frozen);

/* This rank has no gradient for tensor in this iteration (an unused parameter): call it before
 * dear_backward_done of its layer; the library writes the zeros the rank contributes. With
 * DEAR_FIND_UNUSED=1 one small collective per iteration counts the ranks that had a gradient,
 * and a tensor none had one for is not updated (its zeros still travel with its bucket). */
DEAR_API int dear_no_grad(dear_ctx_t *ctx, int tensor);

/* Snapshot of the counters. */
DEAR_API int dear_get_stats(dear_ctx_t *ctx, dear_stats_t *stats);

/* The sparse path of tensor (registration index): block, whether each phase runs sparse now, the
 * densities measured in warm-up and the bytes and messages of its sparse collectives. Set
 * stats->size = sizeof *stats first. DEAR_ERR_ARG for an unknown tensor or a size below that of
 * the first release of the struct; DEAR_ERR_STATE before dear_commit. A tensor not declared
 * sparse reads block 0 and densities -1. */
DEAR_API int dear_get_sparse_stats(dear_ctx_t *ctx, int tensor, dear_sparse_stats_t *stats);

/* What fitting the cost model to training found at the last online plan (DEAR_COST_REFIT): the
 * factor by which every collective must be dearer for the model to price the plan in force as it
 * ran, and the measured and calibrated iterations it came from (1, 0, 0 before any online plan,
 * without online planning, and with DEAR_COST_REFIT=off). Every rank reads the same. Set
 * info->size = sizeof *info first. DEAR_ERR_ARG for a NULL or a size below that of the first
 * release of the struct; DEAR_ERR_STATE before dear_commit. */
DEAR_API int dear_get_plan_info(dear_ctx_t *ctx, dear_plan_info_t *info);

/* Write the per-layer profile measured so far (forward/backward times, tensor sizes) in the
 * text format of docs/FORMATS.md, which dear-plan reads. Rank 0 writes; collective. */
DEAR_API int dear_profile_save(dear_ctx_t *ctx, const char *path);

/* Write the plan in use (buckets, all-gather groups, early groups, who made it) as a plan file
 * (docs/FORMATS.md) that DEAR_PLAN_FILE and dear-plan read: after online planning it is the
 * plan the runtime settled on. Every rank holds the same plan; call it on one. Not collective.
 * DEAR_ERR_STATE before dear_commit, DEAR_ERR_IO if the file cannot be written. */
DEAR_API int dear_plan_save(dear_ctx_t *ctx, const char *path);

/* Flush, meet every other rank in dear_finalize (one that left the training loop early would
 * otherwise leave its peers waiting forever: past DEAR_STALL_ABORT_S the job is aborted, naming
 * the ranks that never came), stop the progress thread, free everything, and set *ctx to NULL (as MPI nulls a freed
 * handle), so that finalizing the same handle twice is a no-op instead of a use after free; a
 * copy of the pointer kept elsewhere is dangling all the same. *ctx may be NULL (DEAR_OK);
 * ctx NULL is DEAR_ERR_ARG. Collective. */
DEAR_API int dear_finalize(dear_ctx_t **ctx);

#ifdef __cplusplus
}
#endif

#endif /* DEAR_H */
