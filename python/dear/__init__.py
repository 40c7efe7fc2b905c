"""dear: data-parallel PyTorch training under mpirun, with libdear as the engine.

    import torch, dear
    model = Net()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model, opt = dear.wrap(model, opt)          # collective: every rank, the same model
    for x, y in batches:
        opt.zero_grad()
        loss = loss_fn(model(x), y)
        loss.backward()                         # gradients start travelling during backward
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)   # optional: sees averaged gradients
        opt.step()                              # under `dear`, runs in the next forward: see below
    dear.close(model)                           # every pending update applied, the context freed

Run it with `mpirun -np 4 python3 train.py`. A loop written for DistributedDataParallel runs
unchanged and computes what DDP computes: ``p.grad`` after backward is the gradient averaged over
the ranks, ``opt.step()``, ``opt.zero_grad()``, ``model.no_sync()``, learning-rate schedulers,
``state_dict()`` and evaluation mean what they mean there. Options are keywords of ``wrap``
(``schedule=``, ``clip_norm=``, ...) or DEAR_* variables; a keyword wins. What happens, in the
terms of libdear's C API (include/dear.h):

* The gradients of every parameter that requires one live in one flat arena per dtype, and each
  ``param.grad`` is a view into it, so buckets are zero-copy. Parameters are registered in the
  order of ``model.modules()``; each module that owns parameters is a layer, and its forward
  pre-hook begins its own layer and those of the modules inside it (whose parameters its forward
  may use without calling them).
* A hook on the model's outputs marks the start of a backward pass; a hook after each parameter's
  gradient accumulation counts its layer down and reports ``dear_backward_done`` when the layer's
  gradients are all written (``register_post_accumulate_grad_hook`` where torch has it, >= 2.1;
  the AccumulateGrad node's hook before); the autograd engine's end-of-backward callback (as DDP
  and FSDP use) reports ``dear_backward_end``. A forward pre-hook on each layer calls
  ``dear_forward_begin``.
* libdear's update callback only says a tensor's averaged gradient is in place; the binding runs
  the optimizer for every tensor that became ready in one C call at once: one ``step()`` of the
  optimizer with its parameter groups narrowed to those tensors (the optimizer's own single- or
  multi-tensor path), then zeroes them if ``zero_grad()`` was asked for. Under ``wfbp`` and
  ``sync``, and on one rank, that is all tensors, at ``opt.step()``. Under ``dear`` on several
  ranks the gradients are still travelling when backward returns: ``opt.step()`` records the
  step with the hyper-parameters it has then (a scheduler may change them afterwards) and the
  steps run in the next forward, once per all-gather group: before the group's first layer, for
  every layer whose gradients that group brought (one ``step()`` per layer would cost the
  optimizer's Python once per layer);
  ``zero_grad()`` after it is applied after that step. The very first ``opt.step()`` runs at
  once (it waits for every gradient), so that an optimizer that fails does so there. So between
  ``opt.step()`` and the next forward the parameters are the old ones: ``state_dict()``,
  ``load_state_dict()`` (model and optimizer), evaluation (a forward under ``torch.no_grad()``)
  and ``dear.flush`` run the pending steps first; a read of the parameters by hand there needs
  ``dear.flush(model)``.
* There, each ``param.grad`` is a torch.Tensor subclass view of the arena whose
  ``__torch_function__`` first waits for its layer's averaged gradient (``dear_wait_grad``). The
  rule: any read of gradient memory after ``backward()`` returns sees the averaged gradient,
  whatever Python object it goes through. A gradient is found wherever it sits in a call's
  arguments (lists, dicts, keywords, at any depth: ``torch.cat(tensors=[...])``,
  ``torch._foreach_*``, ``parameters_to_vector``), and every result that aliases it (``.data``,
  ``.detach()``, ``.view()``, slices, ``split``) is such a view too, so a list of views made once
  (as fused optimizers and gradient loggers keep) waits on every later read. Reads and in-place
  writes (``clip_grad_norm_``, ``clip_grad_value_``, norms for logging, GradScaler's
  ``unscale_``) see the averaged gradient, and what they write is what the step later uses.
  ``.numpy()`` (and ``numpy.asarray``) gives a read-only copy, since an array is read without
  Python's dispatch: a write to it raises instead of being lost. Clipping that reads every
  gradient gives up, for that iteration, the overlap of the all-gathers with the next forward;
  ``clip_norm=`` clips inside libdear from the shards and keeps it. Code that reads the storage
  without Python's dispatch (a C++ extension's kernel, ``data_ptr()`` kept for later, DLPack)
  cannot be waited for: call ``dear.flush(model)`` first, which completes every gradient.
* ``model.no_sync()`` (DDP's gradient accumulation) makes the backward passes of the forwards it
  encloses local (DEAR_MODE_ACCUMULATE); the next forward outside it synchronises the sum.
  Evaluation enters no profile. ``find_unused=True`` leaves parameters that no rank used in an
  iteration untouched, as DDP's ``find_unused_parameters``.
* A backward pass that raised is completed at the next call into the binding (forward, step,
  zero_grad, flush) with the gradients it wrote, so every rank stays in step; an exception of the
  optimizer is raised as it is, where the step runs. While a context is open, an uncaught
  exception or SIGINT on any rank aborts the job (MPI_Abort) after printing the error, instead of
  leaving the other ranks waiting in libdear for DEAR_STALL_ABORT_S.
* Parameters on a GPU (every one on the same device, one GPU per rank, as DDP's
  ``device_ids=[local_rank]``): the arenas are allocated there and registered as DEAR_MEM_CUDA,
  ``torch.cuda.current_stream()`` is libdear's compute stream (``dear_set_stream``; a forward on
  another stream moves it there), and the optimizer steps run on that stream, ordered after the
  averaged gradients by libdear's events: the hooks never wait for the GPU.
  ``DEAR_CUDA_TRANSPORT`` picks NCCL or host-staged collectives, as in C.
* ``shard=True`` (sharded updates, libdear's dear_set_shard; ZeRO-1/2, FSDP's SHARD_GRAD_OP with
  ``use_orig_params``): every parameter becomes a view of one flat parameter arena per dtype, and
  the optimizer's parameter groups are given this rank's slices of them, a Parameter each, viewing
  the arena, whose ``.grad`` views the averaged slice of the gradient arena: the optimizer's state
  is that of 1/P of the model (state it already had when wrapped is cut to the slices). The slices
  are averaged when backward returns. From the second iteration each is stepped as libdear reports
  it averaged, inside backward's end (a few ``step()`` calls, each over whole buckets and at least a
  quarter of this rank's elements, so that they overlap the reduce-scatters still travelling), and
  the parameters then leave for every rank at once, overlapping what the program does until the next
  forward and, under ``dear``, that forward; ``opt.step()`` is a no-op. That rests on what the first
  iteration shows, whose steps run at ``opt.step()``: that ``opt.step()`` follows backward with no
  arguments, the hyper-parameters unchanged and the gradients unwritten in between (schedulers step
  after ``opt.step()``, as torch asks). Where it shows otherwise, or skips ``opt.step()``, every
  step of the run waits for ``opt.step()`` (as ``shard='at_step'`` asks from the start), with the
  hyper-parameters it has then, and a skipped ``opt.step()`` sends the slices unchanged. A later
  iteration that breaks it after its steps ran raises DearError (at ``opt.step()``, or at the next
  forward for a skipped one) rather than train on a step the program did not ask for. Not stepped
  early: a backward pass that raised, and under ``clip_norm=`` (whose global norm needs every
  reduce-scatter before any step) one whose norm is not finite, so that the program may skip its
  step on ``dear.grad_norm(model)`` as GradScaler skips one on an inf (``clip_norm=1e30`` only
  reports the norm). An exception of the optimizer in an early step is raised by ``backward()``. The
  optimizer must be element-wise (SGD, momentum, Adam, AdamW: a slice's step is that slice of the
  tensor's step; LAMB and LARS, whose steps use whole-tensor norms, are not). ``param.grad`` of the
  model holds the average only on this rank's slices, so reading it from Python raises DearError:
  ``clip_grad_norm_`` gives way to ``clip_norm=`` (libdear clips from the shards), and GradScaler,
  whose inf check would differ between ranks, is not supported. A second backward pass through one
  forward is refused. ``opt.state_dict()`` is this rank's slices: a checkpoint saves one per rank
  and resumes on as many ranks with the same DEAR_PARTITION, or unsharded state is loaded before
  ``wrap`` (it is cut to the slices). CUDA parameters are refused (libdear shards host memory only).
* The plan training starts on comes from the model's structure, before anything is timed
  (DEAR_FIRST_PLAN): the binding gives libdear each layer's forward FLOPs where it knows the
  module (Linear, convolutions, embeddings, MultiheadAttention, normalisations;
  ``dear_set_layer_cost``), at ``wrap`` from parameter shapes (per position: the batch and
  sequence are unknown) or, with ``wrap(example=batch)``, from the shapes one forward of it
  shows, and from the shapes of the first forward, which DEAR_FIRST_PLAN=first plans with.
* Parameters are broadcast from rank 0 at ``wrap``; buffers are not synchronised (as DDP with
  ``broadcast_buffers=False``). The optimizer must keep per-parameter state only (SGD, Adam,
  AdamW, ... but not LBFGS: a closure is refused).

ctypes, not a C extension: libdear's API is a dozen plain C calls, so ctypes binds it without
compiling against one torch's C++ ABI, and the same files work with every torch and Python the
machine has; the cost, a Python call per hook, is microseconds against milliseconds of layer
compute. Errors from libdear raise DearError with the library's own message.
"""
import contextlib
import ctypes
import ctypes.util
import inspect
import math
import os
import signal
import sys
import traceback
import types

import torch
from torch.utils._pytree import tree_flatten as _tree_flatten, tree_map as _tree_map

__all__ = ["DearError", "wrap", "flush", "close", "schedule", "grad_norm", "sparse_stats", "plan_info"]

DEAR_OK = 0
_DTYPES = {torch.float32: 0, torch.float64: 1, torch.bfloat16: 2, torch.float16: 3}
_MODE_TRAIN, _MODE_ACCUMULATE, _MODE_EVAL = 0, 1, 2
# The keywords of wrap and the DEAR_* variable each sets.
_KEYWORDS = {"schedule": "DEAR_SCHEDULE", "fusion": "DEAR_FUSION", "bucket_cap_mb": "DEAR_FUSION_THRESHOLD",
             "clip_norm": "DEAR_CLIP_NORM", "find_unused": "DEAR_FIND_UNUSED", "compress": "DEAR_COMPRESS",
             "compress_ag": "DEAR_COMPRESS_AG", "error_feedback": "DEAR_COMPRESS_EF", "sparse": "DEAR_SPARSE"}
_LEVELS = ("error", "warn", "info", "debug")
# Subclass dispatch off, user modes on, where torch tells them apart (>= 2.0).
_no_torch_function = getattr(torch._C, "DisableTorchFunctionSubclass", None) or torch._C.DisableTorchFunction


class DearError(RuntimeError):
    """A libdear call failed, or the binding refuses a use it cannot serve: .status is the
    dear_status_t, the message libdear's (or the binding's) own words."""

    def __init__(self, call, status, message):
        self.status = status
        super().__init__("%s failed: %s%s" % (call, _status_string(status),
                                             (":\n" + message.strip()) if message.strip() else ""))


def _status_string(status):
    lib = _load()
    return lib.dear_status_string(status).decode()


class _UpdateInfo(ctypes.Structure):
    _fields_ = [("size", ctypes.c_size_t), ("grad", ctypes.c_void_p), ("count", ctypes.c_size_t),
                ("dtype", ctypes.c_int), ("mem", ctypes.c_int), ("arg", ctypes.c_void_p),
                ("name", ctypes.c_char_p), ("tensor", ctypes.c_int), ("layer", ctypes.c_int),
                ("iteration", ctypes.c_longlong), ("grad_norm", ctypes.c_double),
                ("clip_coef", ctypes.c_double), ("stream", ctypes.c_void_p), ("param", ctypes.c_void_p),
                ("offset", ctypes.c_size_t), ("tensor_count", ctypes.c_size_t), ("shard_offset", ctypes.c_size_t)]


class _Slice(ctypes.Structure):
    _fields_ = [("tensor", ctypes.c_int), ("offset", ctypes.c_size_t), ("count", ctypes.c_size_t),
                ("shard_offset", ctypes.c_size_t)]


_SHARD_ON, _SHARD_HOLD = 1, 2
# Sharded steps at backward's end: a bucket's slices step once this share of the rank's elements is
# waiting, so that at most this many step() calls (and the rest's) pay the optimizer's Python.
_EARLY_STEPS = 4


class _SparseStats(ctypes.Structure):
    """dear_sparse_stats_t (dear_types.h); size set by the caller."""
    _fields_ = [("size", ctypes.c_size_t), ("block", ctypes.c_size_t), ("sparse_rs", ctypes.c_int),
                ("sparse_ag", ctypes.c_int), ("density", ctypes.c_double), ("density_union", ctypes.c_double),
                ("bytes_sent", ctypes.c_uint64), ("msgs_sparse", ctypes.c_uint64), ("msgs_dense", ctypes.c_uint64)]


class _PlanInfo(ctypes.Structure):
    """dear_plan_info_t (dear_types.h); size set by the caller."""
    _fields_ = [("size", ctypes.c_size_t), ("comm_scale", ctypes.c_double), ("measured_iter_s", ctypes.c_double),
                ("predicted_iter_s", ctypes.c_double)]


_UPDATE_FN = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(_UpdateInfo))


def _find_library():
    """DEAR_LIBRARY, else the build tree this package sits in, else the installed library."""
    env = os.environ.get("DEAR_LIBRARY")
    if env:
        return env
    here = os.path.dirname(os.path.abspath(__file__))
    for rel in ("../../.libs/libdear.so.1", "../../../libdear.so.1"):
        path = os.path.normpath(os.path.join(here, rel))
        if os.path.exists(path):
            return path
    return ctypes.util.find_library("dear") or "libdear.so.1"


_lib = None
_MPI = None


def _load():
    global _lib, _MPI
    if _lib is not None:
        return _lib
    import mpi4py
    mpi4py.rc.thread_level = "multiple"   # libdear's progress thread makes MPI calls too
    from mpi4py import MPI
    _MPI = MPI
    lib = ctypes.CDLL(_find_library(), mode=ctypes.RTLD_GLOBAL)
    comm_t = ctypes.c_void_p if MPI._sizeof(MPI.Comm) == ctypes.sizeof(ctypes.c_void_p) else ctypes.c_int
    vp, pvp, c_int = ctypes.c_void_p, ctypes.POINTER(ctypes.c_void_p), ctypes.c_int
    for name, args in (("dear_init", [comm_t, pvp]),
                       ("dear_register", [vp, ctypes.c_char_p, c_int, vp, ctypes.c_size_t, c_int, c_int,
                                          _UPDATE_FN, vp]),
                       ("dear_register_layer", [vp, c_int]), ("dear_commit", [vp]),
                       ("dear_forward_begin", [vp, c_int]), ("dear_backward_done", [vp, c_int]),
                       ("dear_backward_end", [vp]), ("dear_flush", [vp]), ("dear_set_mode", [vp, c_int]),
                       ("dear_no_grad", [vp, c_int]), ("dear_wait_grad", [vp, c_int]), ("dear_finalize", [pvp]),
                       ("dear_set_stream", [vp, vp]), ("dear_set_param", [vp, c_int, vp]),
                       ("dear_set_shard", [vp, c_int]), ("dear_shard_release", [vp]),
                       ("dear_shard_slices", [vp, c_int, ctypes.POINTER(_Slice), c_int]),
                       ("dear_set_layer_cost", [vp, c_int, ctypes.c_double]),
                       ("dear_register_sparse", [vp, c_int, ctypes.c_size_t]),
                       ("dear_get_sparse_stats", [vp, c_int, ctypes.POINTER(_SparseStats)]),
                       ("dear_get_plan_info", [vp, ctypes.POINTER(_PlanInfo)])):
        fn = getattr(lib, name)
        fn.argtypes, fn.restype = args, ctypes.c_int
    lib.dear_schedule.argtypes, lib.dear_schedule.restype = [vp], ctypes.c_char_p
    lib.dear_status_string.argtypes, lib.dear_status_string.restype = [ctypes.c_int], ctypes.c_char_p
    lib.dear_last_error.argtypes, lib.dear_last_error.restype = [ctypes.c_char_p, ctypes.c_size_t], ctypes.c_size_t
    lib._comm_t = comm_t
    _lib = lib
    return lib


def _check(call, status):
    if status != DEAR_OK:
        buf = ctypes.create_string_buffer(4096)
        _lib.dear_last_error(buf, len(buf))
        raise DearError(call, status, buf.value.decode(errors="replace"))


def _log(level, msg):
    """A line as libdear writes them ('[dear RANK] LEVEL python: ...'), under DEAR_LOG_LEVEL."""
    want = os.environ.get("DEAR_LOG_LEVEL", "warn")
    if want in _LEVELS and _LEVELS.index(level) > _LEVELS.index(want):
        return
    rank = _MPI.COMM_WORLD.Get_rank() if _MPI is not None else "?"
    sys.stderr.write("[dear %s] %s python: %s\n" % (rank, level, msg))
    sys.stderr.flush()


# ---- the end of the job when one rank fails ----
# While a context is open the other ranks wait in libdear for this one; an error it does not
# survive must end all of them now, not after DEAR_STALL_ABORT_S.
_open = []
_saved_hooks = None


def _rank():
    return _MPI.COMM_WORLD.Get_rank()


def _abort(code):
    sys.stdout.flush()
    sys.stderr.flush()
    _MPI.COMM_WORLD.Abort(code)


def _excepthook(tp, value, tb):
    _saved_hooks[0](tp, value, tb)   # the original error first, as Python prints it
    if _open:
        _log("error", "uncaught %s with a dear context open: aborting the job (MPI_Abort), the other ranks "
             "would wait for this one" % tp.__name__)
        _abort(1)


def _sigint(signum, frame):
    sys.stderr.write("Traceback (most recent call last):\n" + "".join(traceback.format_stack(frame)) +
                     "KeyboardInterrupt (SIGINT)\n")
    if _open:
        _log("error", "SIGINT with a dear context open: aborting the job (MPI_Abort), the other ranks would "
             "wait for this one")
        _abort(128 + signal.SIGINT)
    raise KeyboardInterrupt


def _arm(w):
    global _saved_hooks
    if not _open:
        handler = None
        # A handler of the program's own is its to keep; only Python's default is replaced.
        import threading
        if threading.current_thread() is threading.main_thread() and \
                signal.getsignal(signal.SIGINT) is signal.default_int_handler:
            handler = signal.signal(signal.SIGINT, _sigint)
        _saved_hooks = (sys.excepthook, handler)
        sys.excepthook = _excepthook
    _open.append(w)


def _disarm(w):
    global _saved_hooks
    if w in _open:
        _open.remove(w)
    if not _open and _saved_hooks is not None:
        if sys.excepthook is _excepthook:
            sys.excepthook = _saved_hooks[0]
        if _saved_hooks[1] is not None and signal.getsignal(signal.SIGINT) is _sigint:
            signal.signal(signal.SIGINT, _saved_hooks[1])
        _saved_hooks = None


# ---- param.grad under schedule dear ----
# Metadata needs no gradient values: reading it waits for nothing.
_META = frozenset(getattr(torch.Tensor, n).__get__ for n in
                  ("shape", "dtype", "device", "requires_grad", "is_leaf", "grad_fn", "ndim", "layout",
                   "is_sparse", "is_cuda"))


# Conversions whose result is memory Python's dispatch never sees again: a read-only copy.
_TO_NUMPY = frozenset((torch.Tensor.numpy, torch.Tensor.__array__))


class _Grad(torch.Tensor):
    """param.grad under schedule dear: a view of the arena that waits, before any operation from
    Python, for its layer's averaged gradient (dear_wait_grad). The rule it keeps: any read of
    gradient memory after backward() returns sees the averaged gradient, whatever Python object
    it goes through. So a _Grad is found wherever it sits in the arguments (nested lists, dicts,
    keywords), and every result that aliases a _Grad's memory (.data, .detach(), views, slices,
    split) is a _Grad of the same layer, so that a view kept across iterations waits too. NumPy
    conversions return a read-only copy: an array aliasing the arena would be read later without
    a wait, and a write to it fails loudly rather than being lost."""

    @classmethod
    def __torch_function__(cls, func, types_, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in _META:
            with _no_torch_function():
                return func(*args, **kwargs)
        grads = [a for a in _tree_flatten((args, kwargs))[0] if isinstance(a, _Grad)]
        for g in grads:
            g._dear_wait()
        with _no_torch_function():
            out = func(*args, **kwargs)
            if func in _TO_NUMPY:
                out = out.copy()
                out.setflags(write=False)
                return out
            return _tree_map(lambda r: _as_grad(r, grads), out) if grads else out

    def _dear_wait(self):
        w = self._dear_w
        if w.unsettled[self._dear_l]:
            w.wait_layer(self._dear_l)


def _as_grad(r, grads):
    """r as a _Grad of the layer of the first of grads whose memory it aliases; r otherwise (a
    plain result, or a _Grad already). Called with subclass dispatch off."""
    if type(r) is not torch.Tensor or r.numel() == 0:
        return r
    p = r.data_ptr()
    for g in grads:
        lo = g.data_ptr()
        if r.device == g.device and lo <= p < lo + g.numel() * g.element_size():
            v = r.as_subclass(_Grad)
            v._dear_w, v._dear_l = g._dear_w, g._dear_l
            return v
    return r


class _ShardedGrad(torch.Tensor):
    """param.grad under shard=True: the averaged gradient exists only as each rank's slices, which
    the optimizer holds; any operation on this one from Python (clipping, norms) would read this
    rank's own gradient and is refused."""

    @classmethod
    def __torch_function__(cls, func, types_, args=(), kwargs=None):
        if func not in _META:
            raise DearError("param.grad", -2, "under dear.wrap(shard=True) a parameter's gradient is averaged only "
                            "on the slices each rank's optimizer steps, so reading it (clip_grad_norm_, a norm "
                            "for logging, GradScaler) would see this rank's own gradient: clip with "
                            "dear.wrap(clip_norm=...) and read dear.grad_norm(model), or train unsharded")
        with _no_torch_function():
            return func(*args, **(kwargs or {}))


def _tensors_in(obj, depth=0):
    """The tensors of a forward's output (tensors, sequences, dicts, nested a little)."""
    if isinstance(obj, torch.Tensor):
        yield obj
    elif depth < 4 and isinstance(obj, (list, tuple)):
        for o in obj:
            yield from _tensors_in(o, depth + 1)
    elif depth < 4 and isinstance(obj, dict):
        for o in obj.values():
            yield from _tensors_in(o, depth + 1)


def _fill_groups(groups, params, hyper):
    """Give each parameter group its parameters and, when hyper is given, its hyper-parameters."""
    for g, grp in enumerate(groups):
        grp["params"] = params[g]
        if hyper:
            grp.update(hyper[g])


def _hyper(opt):
    """Each parameter group's hyper-parameters, tensors copied (a scheduler may write them in place)."""
    return [{k: (v.detach().clone() if torch.is_tensor(v) else v) for k, v in g.items() if k != "params"}
            for g in opt.param_groups]


def _same_hyper(a, b):
    if len(a) != len(b):
        return False
    for x, y in zip(a, b):
        if x.keys() != y.keys():
            return False
        for k, u in x.items():
            v = y[k]
            if torch.is_tensor(u) or torch.is_tensor(v):
                if not (torch.is_tensor(u) and torch.is_tensor(v) and torch.equal(u, v)):
                    return False
                continue
            try:
                if not (u is v or bool(u == v)):
                    return False
            except Exception:   # a value that cannot say (an array): taken as changed
                return False
    return True


def _prod(xs):
    n = 1
    for x in xs:
        n *= int(x)
    return n


def _conv_positions(mod, x):
    """Output positions of convolution mod on input x over the whole batch, or None."""
    k = mod.kernel_size
    if x is None or x.dim() < len(k) + 1:
        return None
    spatial = x.shape[-len(k):]
    batch = x.numel() // max(1, mod.in_channels * _prod(spatial))
    if mod.transposed:   # a transposed convolution does its work per input position
        return batch * _prod(spatial)
    pad = mod.padding
    if pad == "same":
        out = [-(-n // s) for n, s in zip(spatial, mod.stride)]
    else:
        pad = (0,) * len(k) if pad == "valid" else pad
        out = [(n + 2 * p - d * (kk - 1) - 1) // s + 1
               for n, p, d, kk, s in zip(spatial, pad, mod.dilation, k, mod.stride)]
    return batch * _prod(max(0, o) for o in out)


def _layer_flops(mod, inputs=None):
    """Forward FLOPs of a module the binding knows, as [(module, flops)] (a MultiheadAttention's
    out_proj, whose parameters it uses without calling it, included); [] for any other module.
    With the forward's inputs: for that batch; without: per output position (token, pixel),
    which the parameter shapes alone give; 2 FLOPs per multiply-add."""
    nn = torch.nn
    x = inputs[0] if inputs and isinstance(inputs[0], torch.Tensor) else None
    if isinstance(mod, nn.Linear):
        rows = x.numel() // mod.in_features if x is not None and x.numel() else 1
        return [(mod, 2.0 * mod.in_features * mod.out_features * rows)]
    if isinstance(mod, nn.modules.conv._ConvNd):
        per = 2.0 * mod.in_channels // mod.groups * _prod(mod.kernel_size) * mod.out_channels
        return [(mod, per * (_conv_positions(mod, x) or 1))]
    if isinstance(mod, (nn.Embedding, nn.EmbeddingBag)):   # a lookup; backward adds rows up
        return [(mod, 2.0 * mod.embedding_dim * (x.numel() if x is not None else 1))]
    if isinstance(mod, nn.MultiheadAttention):
        e, kd, vd = mod.embed_dim, mod.kdim, mod.vdim
        key = inputs[1] if inputs and len(inputs) > 1 and isinstance(inputs[1], torch.Tensor) else None
        if x is None or key is None or x.dim() != 3:
            return [(mod, 2.0 * e * (e + kd + vd)), (mod.out_proj, 2.0 * e * e)]
        n = x.shape[0] if mod.batch_first else x.shape[1]
        lq, lk = x.numel() // (n * e), key.numel() // (n * kd)
        proj = 2.0 * n * (lq * e * e + lk * e * (kd + vd))
        return [(mod, proj + 4.0 * n * lq * lk * e), (mod.out_proj, 2.0 * n * lq * e * e)]
    if isinstance(mod, (nn.LayerNorm, nn.GroupNorm, nn.modules.batchnorm._NormBase)):
        if x is not None:
            return [(mod, 8.0 * x.numel())]   # normalise, scale and shift each element
        width = _prod(mod.normalized_shape) if isinstance(mod, nn.LayerNorm) else \
            mod.num_channels if isinstance(mod, nn.GroupNorm) else mod.num_features
        return [(mod, 8.0 * width)]
    return []


class _Wrapped:
    """The state behind a wrapped model (model._dear)."""

    def __init__(self, model, opt, comm, env, shard=False, example=None):
        lib = _load()
        if shard not in (False, True, "at_step"):
            raise DearError("dear.wrap", -1, "shard=%r; accepted: False, True (steps as the reduce-scatters end), "
                            "'at_step' (steps at opt.step())" % (shard,))
        self.lib, self.model, self.opt, self.shard = lib, model, opt, bool(shard)
        self.comm = comm if comm is not None else _MPI.COMM_WORLD
        handle = lib._comm_t.from_address(_MPI._addressof(self.comm)).value
        self.ctx = ctypes.c_void_p()
        saved = {k: os.environ.get(k) for k in env}
        os.environ.update(env)   # dear_init reads the environment once: the keywords hold for this context
        try:
            _check("dear_init", lib.dear_init(handle, ctypes.byref(self.ctx)))
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
        try:
            self._collect(model)
            self._check_optimizer(opt)
            for p in self.params:   # every rank starts from rank 0's parameters, as DDP does
                self._bcast(p)
            self.sched = lib.dear_schedule(self.ctx).decode()
            # Only `dear` on several ranks leaves gradients travelling after backward returns;
            # sharded, every rank's slices are averaged when backward returns.
            self.deferred = self.sched == "dear" and self.comm.Get_size() > 1 and not self.shard
            self._make_arenas()
            if self.shard:
                self._make_param_arenas()
            self._update_fn = _UPDATE_FN(self._on_update)   # kept alive as long as the context
            for t, p in enumerate(self.params):
                _check("dear_register", lib.dear_register(self.ctx, self.names[t].encode(), self.layer_of[t],
                                                          ctypes.c_void_p(self.views[t].data_ptr()), p.numel(),
                                                          _DTYPES[p.dtype], int(self.cuda), self._update_fn,
                                                          None))
            for t, row in self._sparse_rows(model):
                _check("dear_register_sparse", lib.dear_register_sparse(self.ctx, t, row))
            if self.cuda:   # the hooks order the gradients' communication against torch's stream
                self.stream = torch.cuda.current_stream(self.device)
                _check("dear_set_stream", lib.dear_set_stream(self.ctx, ctypes.c_void_p(self.stream.cuda_stream)))
            if self.shard:   # the binding steps the slices (at backward's end or opt.step()), then they travel
                for t, p in enumerate(self.params):
                    _check("dear_set_param", lib.dear_set_param(self.ctx, t, ctypes.c_void_p(p.data_ptr())))
                _check("dear_set_shard", lib.dear_set_shard(self.ctx, _SHARD_ON | _SHARD_HOLD))
            self.lid_of = {id(mod): lid for lid, (mod, _) in enumerate(self.layers)}
            self._set_costs(self._traced(example) if example is not None else
                            [f for mod, _ in self.layers for f in _layer_flops(mod)])
            _check("dear_commit", lib.dear_commit(self.ctx))
            if self.shard:
                self._shard_optimizer()
        except BaseException:
            self.ctx = ctypes.c_void_p()   # left open: finalize would wait for ranks that may not fail
            raise
        n, nl = len(self.params), len(self.layers)
        self.shapes = []   # until the first forward with gradients ends: the FLOPs its inputs give
        self.mode, self.no_sync_depth, self.in_backward, self.norm = _MODE_TRAIN, 0, False, None
        self.fired, self.ready, self.step_req, self.steps, self.stepped = [], [], None, 0, True
        self.shard_fired = []                # shard=True: slices whose averaged gradient is in place
        self.fired_count = 0                 # ... and their elements
        # Sharded steps at backward's end: None until the first iteration decides, then True or False.
        self.early = None if self.shard and shard != "at_step" else False
        self.early_now = False               # stepping the slices as libdear reports them
        self.early_hyper = None              # the hyper-parameters they ran with, until opt.step() comes
        self.early_versions = None           # the gradient arenas' versions after they ran
        self.early_error = None              # what the optimizer raised while they ran
        self.probe = None                    # the first iteration: what backward's end saw, for opt.step()
        self.synced = False                  # a synchronised backward pass since the last forward
        self.zero_after = [0] * n            # 1: zero once stepped; 2: and leave p.grad None
        self.to_fire = [False] * nl          # schedule dear: the layer's updates still to come
        self.unsettled = [False] * nl        # ... and its averaged gradient not yet in place
        # Reset in place each iteration: the hooks hold these lists.
        self.seen, self.pending, self.begun = [False] * n, [len(ts) for _, ts in self.layers], [False] * nl
        self._install_hooks()
        _arm(self)

    def __reduce_ex__(self, protocol):
        raise DearError("copy", -6, "a wrapped model cannot be copied or pickled: its hooks hold libdear's "
                        "context. Copy it before dear.wrap (an EMA of the weights, say) or after dear.close, "
                        "and save model.state_dict() rather than the model")

    def _collect(self, model):
        """Parameters in module order, each module that owns some a layer."""
        self.params, self.names, self.layer_of, self.layers = [], [], [], []
        mine = set()
        for mname, mod in model.named_modules():
            # A parameter two modules share (tied embeddings) belongs to the first, as in parameters().
            own = [(n, p) for n, p in mod.named_parameters(recurse=False) if p.requires_grad and id(p) not in mine]
            mine.update(id(p) for _, p in own)
            if not own:
                continue
            lid = len(self.layers)
            self.layers.append((mod, [len(self.params) + i for i in range(len(own))]))
            for n, p in own:
                name = (mname + "." + n) if mname else n
                if p.dtype not in _DTYPES or p.device.type not in ("cpu", "cuda"):
                    raise DearError("dear.wrap", -6, "parameter %s is %s on %s; accepted: float32, float64, "
                                    "bfloat16, float16 on the CPU or a CUDA device" % (name, p.dtype, p.device))
                if self.params and p.device != self.params[0].device:
                    raise DearError("dear.wrap", -6, "parameter %s is on %s, %s on %s: a wrapped model trains on "
                                    "one device (one GPU per rank, as DDP's device_ids=[local_rank])" %
                                    (name, p.device, self.names[0], self.params[0].device))
                self.params.append(p)
                self.names.append(name)
                self.layer_of.append(lid)
        if not self.params:
            raise DearError("dear.wrap", -1, "the model has no parameter that requires a gradient")
        self.index = {id(p): t for t, p in enumerate(self.params)}
        self.device = self.params[0].device
        self.cuda = self.device.type == "cuda"
        if self.cuda:   # libdear takes the calling thread's current device as the context's
            torch.cuda.set_device(self.device)
        self.walked = [(p, p is not None and p.requires_grad, p is not None and p.shape) for p in self._walk()]

    def _sparse_rows(self, model):
        """[(tensor, row elements)] of the gradients declared row-sparse: the weight of each
        nn.Embedding and nn.EmbeddingBag (its gradient is non-zero only in the rows of the batch's
        tokens, sparse=True or not), unless another module uses it too (a tied output layer makes
        the gradient dense) or it lives on a GPU (the zero-row scan runs on the host). DEAR_SPARSE
        decides whether the sparse form runs (auto: where it sends fewer bytes)."""
        if self.cuda:
            return []
        users = {}
        for mod in model.modules():
            for p in mod.parameters(recurse=False):
                users[id(p)] = users.get(id(p), 0) + 1
        rows = []
        for mod in model.modules():
            w = getattr(mod, "weight", None)
            if isinstance(mod, (torch.nn.Embedding, torch.nn.EmbeddingBag)) and id(w) in self.index and \
                    users.get(id(w)) == 1 and w.dim() == 2:
                rows.append((self.index[id(w)], w.shape[1]))
        return rows

    def sparse_stats(self):
        """{name: dear_sparse_stats_t as a dict} of the gradients declared sparse."""
        out = {}
        for t, _ in self._sparse_rows(self.model):
            st = _SparseStats(size=ctypes.sizeof(_SparseStats))
            _check("dear_get_sparse_stats", self.lib.dear_get_sparse_stats(self.ctx, t, ctypes.byref(st)))
            out[self.names[t]] = {k: getattr(st, k) for k, _ in _SparseStats._fields_ if k != "size"}
        return out

    def plan_info(self):
        """dear_plan_info_t as a dict."""
        info = _PlanInfo(size=ctypes.sizeof(_PlanInfo))
        _check("dear_get_plan_info", self.lib.dear_get_plan_info(self.ctx, ctypes.byref(info)))
        return {k: getattr(info, k) for k, _ in _PlanInfo._fields_ if k != "size"}

    def _traced(self, example):
        """The FLOPs of the layers one forward of example shows, [(module, flops)], layers it
        never called at 0. The forward runs under torch.no_grad() in the model's own mode (eval
        mode would take fused paths that skip the modules' hooks), and leaves no trace: buffers
        (batch-norm statistics) and the random generators are restored."""
        seen, handles = [], []
        buffers = [(b, b.detach().clone()) for b in self.model.buffers()]
        devices = [self.device] if self.cuda else []
        try:
            for mod, _ in self.layers:
                handles.append(mod.register_forward_pre_hook(lambda m, i: seen.append((m, _layer_flops(m, i)))))
            with torch.no_grad(), torch.random.fork_rng(devices=devices):
                self.model(*(example if isinstance(example, tuple) else (example,)))
        except Exception as e:   # the hints are a refinement: without them the plan is still made
            _log("warn", "dear.wrap: the forward of example raised (%s: %s); the first plan takes each layer's "
                 "FLOPs per position from its parameters" % (type(e).__name__, e))
            return [f for mod, _ in self.layers for f in _layer_flops(mod)]
        finally:
            for h in handles:
                h.remove()
            with torch.no_grad():
                for b, saved in buffers:
                    b.copy_(saved)
        called = {id(m) for m, _ in seen}
        return [f for _, fl in seen for f in fl] + [(mod, 0.0) for mod, _ in self.layers if id(mod) not in called]

    def _set_costs(self, flops):
        """Each layer's compute hint (dear_set_layer_cost) from [(module, flops)]: the sum of its
        module's entries, as a module called twice in a forward does its work twice."""
        total = {}
        for mod, f in flops:
            lid = self.lid_of.get(id(mod))
            if lid is not None:
                total[lid] = total.get(lid, 0.0) + f
        for lid, f in total.items():
            _check("dear_set_layer_cost", self.lib.dear_set_layer_cost(self.ctx, lid, f))

    def _walk(self):
        """Every module's own parameters (None, frozen and shared ones too) in modules() order:
        what the model is made of, read in a tenth of the time parameters() takes."""
        out, stack = [], [self.model]
        while stack:
            m = stack.pop()
            out.extend(m._parameters.values())
            stack.extend(c for c in reversed(m._modules.values()) if c is not None)
        return out

    def _check_optimizer(self, opt):
        self.group_of = {}
        for g, group in enumerate(opt.param_groups):
            for p in group["params"]:
                if id(p) not in self.index:
                    raise DearError("dear.wrap", -1, "the optimizer holds a parameter of shape %s that the model "
                                    "does not train (not in the model, or requires_grad=False)" % (tuple(p.shape),))
                self.group_of[self.index[id(p)]] = g
        self.group_sizes = [len(g["params"]) for g in opt.param_groups]

    def _bcast(self, p):
        """p from rank 0, through host memory (mpi4py need not be CUDA-aware) as bytes (numpy has
        no bfloat16)."""
        host = p.detach()
        if host.device.type != "cpu" or not host.is_contiguous():
            host = host.to("cpu", memory_format=torch.contiguous_format, copy=True)
        self.comm.Bcast(host.reshape(-1).view(torch.uint8).numpy(), root=0)
        if host.data_ptr() != p.data_ptr():
            with torch.no_grad():
                p.copy_(host)

    def _make_arenas(self):
        self.arenas = {}
        for dt in {p.dtype for p in self.params}:
            n = sum(p.numel() for p in self.params if p.dtype == dt)
            self.arenas[dt] = torch.zeros(n, dtype=dt, device=self.device)
        off = {dt: 0 for dt in self.arenas}
        self.views, self.gviews, self.place = [], [], []
        for t, p in enumerate(self.params):
            o = off[p.dtype]
            self.place.append((self.arenas[p.dtype], o, o + p.numel()))
            view = self.arenas[p.dtype][o:o + p.numel()].view_as(p)
            off[p.dtype] = o + p.numel()
            if p.grad is not None:
                view.copy_(p.grad)
            gview = view
            if self.shard:   # averaged only on the optimizer's slices
                gview = view.as_subclass(_ShardedGrad)
            elif self.deferred:   # gradients travel after backward: reads must wait for them
                gview = view.as_subclass(_Grad)
                gview._dear_w, gview._dear_l = self, self.layer_of[t]
            p.grad = gview
            self.views.append(view)
            self.gviews.append(gview)

    def _make_param_arenas(self):
        """shard=True: every parameter a view of one flat arena per dtype (as FSDP's flat parameter), in
        the gradients' layout, so that the all-gathers write the parameters where the model reads them
        and the optimizer's slices are views of them."""
        self.parenas, self.pplace = {}, []
        for dt in self.arenas:
            self.parenas[dt] = torch.empty_like(self.arenas[dt])
        for t, p in enumerate(self.params):
            arena, o, e = self.place[t]
            pview = self.parenas[p.dtype][o:e]
            with torch.no_grad():
                pview.copy_(p.detach().reshape(-1))
            p.data = pview.view_as(p)
            self.pplace.append((self.parenas[p.dtype], o, e))

    def _shard_optimizer(self):
        """shard=True: the optimizer's parameter groups hold this rank's slices of their parameters,
        each a Parameter viewing the parameter arena with its averaged gradient viewing the gradient
        arena (as FSDP's use_orig_params), so the optimizer's state is that of 1/P of the model. State
        the optimizer already has (loaded before wrap) is cut to the slices."""
        lib, rank = self.lib, self.comm.Get_rank()
        n = lib.dear_shard_slices(self.ctx, rank, None, 0)
        if n < 0:
            _check("dear_shard_slices", n)
        buf = (_Slice * max(n, 1))()
        if n > 0 and lib.dear_shard_slices(self.ctx, rank, buf, n) != n:
            raise DearError("dear_shard_slices", -13, "the slices changed between two calls")
        self.slices, self.slice_of, self.orig_groups = [], {}, [list(g["params"]) for g in self.opt.param_groups]
        subsets = [[] for _ in self.opt.param_groups]
        for k in range(n):
            t, off, cnt = buf[k].tensor, buf[k].offset, buf[k].count
            parena, o, _ = self.pplace[t]
            sp = torch.nn.Parameter(parena[o + off:o + off + cnt])
            sp.grad = self.arenas[self.params[t].dtype][o + off:o + off + cnt]
            g = self.group_of.get(t)
            self.slice_of[(t, off)] = len(self.slices)
            self.slices.append((t, off, cnt, sp, g))
            if g is not None:
                subsets[g].append(sp)
                self._cut_state(self.params[t], sp, off, cnt)
        for p in self.params:
            self.opt.state.pop(p, None)
        _fill_groups(self.opt.param_groups, subsets, None)
        self.early_min = -(-sum(s[2] for s in self.slices) // _EARLY_STEPS)
        self.group_sizes = [len(g["params"]) for g in self.opt.param_groups]

    def _cut_state(self, p, sp, off, cnt):
        """The optimizer's state of parameter p, cut to its slice [off, off + cnt) for sp: tensors of
        p's shape sliced, the rest (a step count) shared."""
        st = self.opt.state.get(p)
        if not st:
            return
        self.opt.state[sp] = {k: (v.detach().reshape(-1)[off:off + cnt].clone()
                                  if torch.is_tensor(v) and v.shape == p.shape else v)
                              for k, v in st.items()}

    def _install_hooks(self):
        self.handles, self.accumulators = [], []
        self.handles.append(self.model.register_forward_pre_hook(self._model_pre))
        self.handles.append(self.model.register_forward_hook(self._model_post))
        # A module's forward may use its children's parameters without calling them
        # (MultiheadAttention and its out_proj): its hook begins their layers too, in order.
        for lid, (mod, _) in enumerate(self.layers):
            inside = {id(m) for m in mod.modules()}
            lids = [k for k, (m, _) in enumerate(self.layers) if id(m) in inside]
            self.handles.append(mod.register_forward_pre_hook(self._layer_pre(lids)))
        public = hasattr(torch.Tensor, "register_post_accumulate_grad_hook")   # torch >= 2.1
        for t, p in enumerate(self.params):
            if public:
                self.handles.append(p.register_post_accumulate_grad_hook(self._grad_ready(t)))
            else:
                acc = p.expand_as(p).grad_fn.next_functions[0][0]   # the parameter's AccumulateGrad node
                self.handles.append(acc.register_hook(self._grad_ready(t)))
                self.accumulators.append(acc)

    # ---- calls into libdear: any of them may report updates, which run when it returns ----
    def _call(self, name, *args):
        _check(name, getattr(self.lib, name)(self.ctx, *args))
        if self.fired:
            self._settle()

    def _on_update(self, info_p):
        info = info_p.contents
        norm = info.grad_norm
        if not norm < 0:   # -1 without clipping; a NaN norm (an inf or NaN gradient) is reported too
            self.norm = norm
        if self.shard:
            k = self.slice_of[(info.tensor, info.offset)]
            if self.early_now:
                if not norm < 0 and not math.isfinite(norm):
                    # Decided before any slice is stepped (the norm comes before every update): a
                    # step the program may skip on it waits for opt.step().
                    self.early_now = False
                    self.early_hyper = None
                elif self.shard_fired and k < self.shard_fired[-1] and self.fired_count >= self.early_min:
                    # libdear reports a bucket's slices in order and the buckets backwards: the last
                    # bucket's slices are all here, and their step overlaps the next reduce-scatter.
                    self._early_batch()
            self.shard_fired.append(k)
            self.fired_count += self.slices[k][2]
        else:
            self.fired.append(info.tensor)
        return 0

    def _on_stream(self):
        """Where an update runs: on CUDA, the stream libdear ordered the averaged gradients on."""
        return torch.cuda.stream(self.stream) if self.cuda else contextlib.nullcontext()

    def _settle(self):
        """The tensors libdear just reported averaged: step them if opt.step() asked for it."""
        with self._on_stream():
            self._settle_here()

    def _settle_here(self):
        fired, self.fired = self.fired, []
        for t in fired:
            lid = self.layer_of[t]
            self.to_fire[lid] = self.unsettled[lid] = False
        if self.step_req is None:
            self.ready.extend(fired)
            return
        hyper, kwargs = self.step_req
        try:
            self._run_updates(fired, hyper, kwargs)
        except BaseException as e:
            self.ready.extend(fired)   # as torch leaves a step that raised: the gradients stay
            if hasattr(e, "add_note"):
                e.add_note("dear: raised by the optimizer step of the previous iteration, which schedule dear "
                           "runs in this forward pass, one batch per all-gather group")
            raise
        self._zero([t for t in fired if self.zero_after[t]])

    def _run_updates(self, ts, hyper=None, kwargs=None):
        """One optimizer step over tensors ts: the parameter groups narrowed to them, with the
        hyper-parameters opt.step() saw (hyper) or the current ones."""
        opt, groups = self.opt, self.opt.param_groups
        subsets, restore_none = [[] for _ in groups], []
        for t in ts:
            g = self.group_of.get(t)
            if g is None:
                continue
            p = self.params[t]
            grad = p.grad
            if grad is not self.gviews[t]:
                if grad is None and self.zero_after[t] == 2:
                    restore_none.append(p)   # zero_grad(set_to_none=True) came after the step it awaits
                elif grad is None:
                    continue                 # dropped by the program: torch.optim skips it
                else:
                    self.views[t].copy_(grad)   # a gradient the program assigned
                p.grad = self.gviews[t]
            subsets[g].append(p)
        if not any(subsets):
            return
        saved = [grp["params"] for grp in groups]
        saved_hyper = [{k: grp[k] for k in h if k in grp} for grp, h in zip(groups, hyper)] if hyper else None
        try:
            _fill_groups(groups, subsets, hyper)
            with _no_torch_function():
                type(opt).step(opt, **(kwargs or {}))
        finally:
            _fill_groups(groups, saved, saved_hyper)
            for p in restore_none:
                p.grad = None

    def _zero(self, ts):
        self._zero_views(ts)
        for t in ts:
            if self.zero_after[t] == 2 and self.params[t].grad is self.gviews[t]:
                self.params[t].grad = None
            self.zero_after[t] = 0

    def _zero_views(self, ts):
        """Zero the gradients of ts, one call per run of them that lies back to back in an arena."""
        arena, lo, hi = None, 0, 0
        for t in ts:
            a, o, e = self.place[t]
            if a is arena and o == hi:
                hi = e
                continue
            if arena is not None:
                arena[lo:hi].zero_()
            arena, lo, hi = a, o, e
        if arena is not None:
            arena[lo:hi].zero_()

    def wait_layer(self, lid):
        self._call("dear_wait_grad", lid)
        self.unsettled[lid] = False

    # ---- what the training loop calls ----
    def step(self, closure=None, kwargs=None):
        if closure is not None:
            raise DearError("optimizer.step", -6, "a closure re-evaluates the model inside the step (LBFGS); "
                            "dear runs each parameter's step when its averaged gradient arrives: use an "
                            "optimizer that needs no closure")
        self._recover()
        if [len(g["params"]) for g in self.opt.param_groups] != self.group_sizes:
            raise DearError("optimizer.step", -2, "the optimizer's parameter groups changed after dear.wrap "
                            "(add_param_group?); wrap the model and the new optimizer again")
        if self.stepped:
            raise DearError("optimizer.step", -2, "no synchronised backward pass since the last step: each "
                            "averaged gradient is applied once (was the last backward inside no_sync()?)")
        self.stepped = True
        if self.shard:
            self._shard_opt_step(kwargs)
            return
        hyper = [{k: v for k, v in g.items() if k != "params"} for g in self.opt.param_groups]
        if any(self.to_fire) and self.steps == 0:
            self._call("dear_flush")   # the first step at once: an optimizer that fails does so here
        if any(self.to_fire):
            self.step_req = (hyper, kwargs)
        self.steps += 1
        now, self.ready = self.ready, []
        try:
            with self._on_stream():
                self._run_updates(now, None, kwargs)
        except BaseException:
            self.ready = now
            raise

    def _shard_opt_step(self, kwargs):
        """shard=True, opt.step(): a no-op where the steps ran at backward's end (what they assumed is
        checked), the steps otherwise; the first iteration decides whether later ones step early."""
        if self.early_hyper is not None:
            used, self.early_hyper = self.early_hyper, None
            why = [w for w, bad in (("opt.step() was given arguments %s" % sorted(kwargs or {}), bool(kwargs)),
                                    ("the hyper-parameters changed", not _same_hyper(used, _hyper(self.opt))),
                                    ("the gradients were written", self._grad_versions() != self.early_versions))
                   if bad]
            if why:
                raise DearError("optimizer.step", -2, "%s between backward() and opt.step(), but under "
                                "dear.wrap(shard=True) this step already ran when backward ended (the first "
                                "iteration showed none of that): change hyper-parameters after opt.step() (as "
                                "schedulers do) or before backward(), or wrap with shard='at_step', which steps "
                                "at opt.step()" % " and ".join(why))
            return
        probe, self.probe = self.probe, None
        if self.early is None and probe is not None:
            self.early = not kwargs and _same_hyper(probe[0], _hyper(self.opt)) and \
                probe[1] == self._grad_versions()
            _log("info", "dear.wrap(shard=True): %s" % (
                "opt.step() followed backward with nothing in between: from the next iteration the slices "
                "step as their reduce-scatters end" if self.early else
                "the first iteration changed hyper-parameters or gradients, or gave arguments, between "
                "backward() and opt.step(): the slices step at opt.step()"))
        self._shard_step(kwargs)

    def _shard_step(self, kwargs):
        """shard=True: one step of the optimizer over this rank's slices averaged since the last step,
        then their parameters travel (dear_shard_release)."""
        fired, self.shard_fired, self.fired_count = self.shard_fired, [], 0
        try:
            self._step_slices(fired, kwargs)
        finally:
            self._call("dear_shard_release")

    def _step_slices(self, ks, kwargs=None):
        """One step of the optimizer over slices ks (indices in self.slices)."""
        opt, groups = self.opt, self.opt.param_groups
        subsets = [[] for _ in groups]
        for k in ks:
            t, _, _, sp, g = self.slices[k]
            if g is not None:
                subsets[g].append(sp)
        if not any(subsets):
            return
        saved = [grp["params"] for grp in groups]
        try:
            _fill_groups(groups, subsets, None)
            with self._on_stream():
                type(opt).step(opt, **(kwargs or {}))
        finally:
            _fill_groups(groups, saved, None)

    def _early_batch(self):
        """Step the slices reported so far, inside dear_backward_end's update callbacks: an error is
        kept for backward's end (nothing may cross the C call), and the rest then stay unstepped."""
        ks, self.shard_fired, self.fired_count = self.shard_fired, [], 0
        try:
            self._step_slices(ks)
        except BaseException as e:
            self.early_error, self.early_now = e, False

    def _early_end(self):
        """Backward's end, sharded steps on: step what is left, then the parameters travel."""
        if self.early_now and self.shard_fired:
            self._early_batch()
        self.early_now, self.shard_fired, self.fired_count = False, [], 0
        err, self.early_error = self.early_error, None
        if err is not None:   # raised where the step ran, as at opt.step(); the next opt.step() is a no-op
            self.early_hyper = None
        self.early_versions = self._grad_versions()
        self._call("dear_shard_release")
        if err is not None:
            raise err

    def _grad_versions(self):
        """The gradient arenas' version counters: torch bumps them on every in-place write from Python
        (an unscale, a zeroing), libdear's writes leave them."""
        return [a._version for a in self.arenas.values()]

    def zero_grad(self, ts, set_to_none):
        self._recover()
        later = self.step_req is not None
        now = []
        for t in ts:
            lid = self.layer_of[t]
            if later and self.to_fire[lid]:
                self.zero_after[t] = 2 if set_to_none else 1
            elif self.unsettled[lid]:
                self.wait_layer(lid)
            if not (later and self.to_fire[lid]):
                now.append(t)
        self._zero_views(now)
        for t in ts:
            grad = self.params[t].grad
            if set_to_none:
                self.params[t].grad = None
            elif grad is not None and grad is not self.gviews[t]:
                self._adopt(t)   # as torch.optim, a gradient that is None stays None

    def _adopt(self, t):
        """param.grad is not the arena's view: take back what the program put there."""
        p, grad = self.params[t], self.params[t].grad
        lid = self.layer_of[t]
        if grad is None:
            if self.step_req is not None and self.to_fire[lid]:
                self.zero_after[t] = 1   # after its step; p.grad is the arena's again from here on
            else:
                if self.unsettled[lid]:
                    self.wait_layer(lid)
                self.views[t].zero_()   # the next backward starts from nothing, as after set_to_none
        else:
            if self.unsettled[lid]:
                self.wait_layer(lid)
            self.views[t].copy_(grad)
        p.grad = self.gviews[t]

    @contextlib.contextmanager
    def no_sync(self):
        self.no_sync_depth += 1
        try:
            yield
        finally:
            self.no_sync_depth -= 1

    def flush(self):
        self._recover()
        self._call("dear_flush")

    # ---- hooks ----
    def _model_pre(self, module, inputs):
        self._recover()
        if self.shard and torch.is_grad_enabled():
            self._shard_skipped()
        now = self._walk()
        if len(now) != len(self.walked) or any(a is not b or (a is not None and (a.requires_grad != r or a.shape != s))
                                               for a, (b, r, s) in zip(now, self.walked)):
            raise DearError("forward", -2, "the model changed after dear.wrap (parameters added, removed, "
                            "reshaped or frozen); wrap the new model instead")
        for t, p in enumerate(self.params):
            if p.grad is not self.gviews[t]:
                self._adopt(t)
        if self.cuda and torch.cuda.current_stream(self.device) != self.stream:
            # The program moved to another stream: libdear orders against it from here on (the
            # steps still pending run first, on the stream they were promised).
            new = torch.cuda.current_stream(self.device)
            self._call("dear_set_stream", ctypes.c_void_p(new.cuda_stream))
            self.stream = new
        self.synced = False
        # model.eval() alone is not evaluation: fine-tuning with frozen batch-norm statistics trains so.
        if not torch.is_grad_enabled():
            mode = _MODE_EVAL
        else:
            mode = _MODE_ACCUMULATE if self.no_sync_depth else _MODE_TRAIN
        if mode != self.mode:
            self._call("dear_set_mode", mode)
            self.mode = mode
        self.begun[:] = [False] * len(self.layers)

    def _shard_skipped(self):
        """A forward with gradients after a backward pass whose opt.step() never came."""
        if self.probe is not None:   # the first iteration: the loop skips steps, so they wait for opt.step()
            self.probe, self.early = None, False
            _log("info", "dear.wrap(shard=True): the first iteration skipped opt.step(): the slices step at "
                 "opt.step()")
        if self.early_hyper is not None:
            self.early_hyper = None
            raise DearError("forward", -2, "opt.step() did not follow the last backward pass, but under "
                            "dear.wrap(shard=True) its steps already ran when it ended (the first iteration "
                            "called opt.step() after backward): decide to skip a step before backward(), "
                            "accumulate gradients inside model.no_sync(), or wrap with shard='at_step', which "
                            "steps at opt.step()")

    def _layer_pre(self, lids):
        begin, ctx, begun = self.lib.dear_forward_begin, self.ctx, self.begun

        def hook(module, inputs):
            if self.mode == _MODE_EVAL:
                return
            for lid in lids:
                _check("dear_forward_begin", begin(ctx, lid))
                begun[lid] = True
            if self.shapes is not None:
                self.shapes += _layer_flops(module, inputs)
            if self.fired:
                self._settle()
        return hook

    def _model_post(self, module, inputs, output):
        if self.mode == _MODE_EVAL:
            return
        if self.shapes is not None:   # for the plan libdear makes again at the first backward's end
            # A layer this forward never began computed nothing.
            self._set_costs(self.shapes + [(m, 0.0) for lid, (m, _) in enumerate(self.layers) if not self.begun[lid]])
            self.shapes = None
        # Layers the forward never called (an unused module) begin now, before backward: their
        # updates are then not left pending into the backward pass.
        for lid, done in enumerate(self.begun):
            if not done:
                _check("dear_forward_begin", self.lib.dear_forward_begin(self.ctx, lid))
        if self.fired:
            self._settle()
        # The gradient of an output arrives before any parameter's: the backward pass starts there.
        for o in _tensors_in(output):
            if o.requires_grad:
                o.register_hook(self._output_grad)

    def _output_grad(self, grad):
        self._backward_begin()

    def _backward_begin(self):
        if self.in_backward:
            return
        if self.shard and self.synced:
            raise DearError("backward", -2, "a second backward pass through one forward under dear.wrap(shard=True): "
                            "it would add to gradients averaged only on this rank's slices; backward the sum of the "
                            "losses once, or train unsharded")
        self.in_backward = True
        torch.autograd.Variable._execution_engine.queue_callback(self._backward_end)
        if any(self.to_fire):
            # A second backward pass without a forward: the gradients it adds to must be in place.
            self._call("dear_flush")

    def _grad_ready(self, t):
        lid, seen, pending = self.layer_of[t], self.seen, self.pending

        def hook(*_):
            if not self.in_backward:
                if any(self.to_fire):
                    raise DearError("backward", -2, "a backward pass that did not start from the wrapped model's "
                                    "output added to gradients still being averaged; call dear.flush(model) "
                                    "before it")
                self._backward_begin()
            if seen[t]:
                return
            seen[t] = True
            pending[lid] -= 1
            if pending[lid] == 0:
                self._call("dear_backward_done", lid)
        return hook

    def _backward_end(self, engine=True):
        """engine: called by autograd at backward's end; False: completing a pass that raised."""
        self.in_backward = False
        for lid, (_, ts) in enumerate(self.layers):
            if self.pending[lid] == 0:
                continue
            for t in ts:   # no gradient this iteration: contribute zeros (the arena holds them)
                if not self.seen[t]:
                    self._call("dear_no_grad", t)
            self._call("dear_backward_done", lid)
        self.pending[:] = [len(ts) for _, ts in self.layers]
        self.seen[:] = [False] * len(self.params)
        if self.mode == _MODE_TRAIN:   # new averaged gradients, for the next opt.step()
            self.ready, self.step_req, self.stepped = [], None, False
            self.zero_after = [0] * len(self.params)
            if self.deferred:
                self.to_fire = [bool(ts) for _, ts in self.layers]
                self.unsettled = list(self.to_fire)
        if self.mode == _MODE_TRAIN:
            self.shard_fired, self.fired_count = [], 0
            self.synced = True
        # Sharded, after an iteration that showed opt.step() following backward: each slice steps
        # as libdear reports it averaged, so its parameters travel before opt.step() is called. Not
        # for a backward pass that raised: the program may not step its gradients.
        train = self.shard and self.mode == _MODE_TRAIN and engine
        self.early_now = train and self.early is True
        self.early_hyper = _hyper(self.opt) if self.early_now else None
        try:
            self._call("dear_backward_end")
        except BaseException:
            self.early_now, self.early_hyper = False, None
            raise
        if self.early_now or self.early_error is not None:   # not when a non-finite norm stopped them
            self._early_end()
        elif train and self.early is None:
            self.probe = (_hyper(self.opt), self._grad_versions())
        if self.mode == _MODE_TRAIN and self.sched == "dear" and not self.deferred and not self.shard:
            # One rank: the gradients are in place already, so the steps run at opt.step() in one
            # batch, which costs less than a batch per layer between the layers' kernels.
            self._call("dear_flush")

    def _recover(self):
        """A backward pass that raised never reached its end: complete it (every rank must run the
        same collectives) with the gradients it wrote; zero_grad() drops them."""
        if not self.in_backward:
            return
        _log("warn", "the last backward pass raised before its end; it is completed with the gradients it "
             "wrote (zeros for the rest), averaged as usual: zero_grad() drops them")
        self._backward_end(engine=False)

    def close(self):
        if not self.ctx:
            return
        try:
            self.flush()
        finally:
            for h in self.handles:
                h.remove()
            for t, p in enumerate(self.params):
                if p.grad is self.gviews[t]:
                    p.grad = self.views[t]
            if self.shard:   # the optimizer gets its parameters back; state kept per slice is dropped
                for k in range(len(self.slices)):
                    self.opt.state.pop(self.slices[k][3], None)
                _fill_groups(self.opt.param_groups, self.orig_groups, None)
            _disarm(self)
            st = self.lib.dear_finalize(ctypes.byref(self.ctx))
            self.ctx = ctypes.c_void_p()
            _check("dear_finalize", st)


def _keyword_env(kw):
    """The DEAR_* values the keywords of wrap set; a keyword wins over the environment, and says so."""
    env = {}
    for key, value in kw.items():
        if value is None:
            continue
        var = _KEYWORDS[key]
        if key in ("find_unused", "error_feedback"):
            text = "1" if value else "0"
        elif key == "bucket_cap_mb":
            text = str(int(float(value) * 2 ** 20))
        else:
            text = str(value)
        env[var] = text
        old = os.environ.get(var)
        if old is not None and old != text:
            _log("warn" if _rank() == 0 else "debug",
                 "dear.wrap(%s=%r) wins over %s=%s from the environment" % (key, value, var, old))
        else:
            _log("info", "dear.wrap(%s=%r): %s=%s" % (key, value, var, text))
    return env


def _set_to_none_default(zero_grad):
    """The running torch's default for zero_grad's set_to_none (False in 1.13, True from 2.0)."""
    try:
        p = inspect.signature(zero_grad).parameters.get("set_to_none")
    except (TypeError, ValueError):
        return False
    return False if p is None or p.default is inspect.Parameter.empty else p.default


def _patch(obj, name, fn):
    """Put fn in obj's own attributes in place of name; close() puts back what was there."""
    saved = obj.__dict__.get(name, _MISSING)
    setattr(obj, name, fn)
    return (obj, name, saved)


_MISSING = object()


def wrap(model, optimizer, comm=None, *, schedule=None, fusion=None, bucket_cap_mb=None, clip_norm=None,
         find_unused=None, shard=False, example=None, compress=None, compress_ag=None, error_feedback=None,
         sparse=None):
    """Register model's trainable parameters with libdear and hook optimizer's steps onto the
    arrival of the averaged gradients. Collective over comm (default MPI.COMM_WORLD): every rank
    wraps the same model. Returns (model, optimizer), the same objects, hooked.

    Keywords, each the DEAR_* variable in brackets and winning over it (the override is logged):
    schedule ('dear', 'wfbp', 'sync'; DEAR_SCHEDULE), fusion (DEAR_FUSION), bucket_cap_mb (DDP's
    bucket size in MiB; DEAR_FUSION_THRESHOLD), clip_norm (clip the averaged gradient to this
    global L2 norm inside libdear, from the shards, keeping the all-gathers' overlap;
    DEAR_CLIP_NORM; dear.grad_norm tells the norm), find_unused (DDP's find_unused_parameters;
    DEAR_FIND_UNUSED), shard (sharded updates, as ZeRO-1/2 or FSDP's SHARD_GRAD_OP: the optimizer
    steps only this rank's 1/P slice of every parameter, its state 1/P of the model's, and the
    all-gathers carry the parameters; an element-wise optimizer only, see the module's text; True
    steps each slice at backward's end once the first iteration shows the loop allows it, with
    clip_norm only after every reduce-scatter, 'at_step' always at opt.step()),
    example: an input of the model (a tensor, or a tuple of its forward's positional arguments),
    which wrap runs once under torch.no_grad() (buffers and random generators restored after) so
    that the first plan knows each layer's FLOPs from the shapes it sees rather than per position
    (a model whose forward has other side effects should not be given one), compress ('none',
    'bf16', 'fp16': float32 gradients travel as 16-bit values, summed in float32, averaged into
    float32 as DDP's bf16_compress_hook / fp16_compress_hook do but rounded only to cross the
    wire; 'int8': 8-bit values with a float32 scale per 256, about a quarter of the bytes, error
    feedback on unless error_feedback=False, not on the NCCL transport; DEAR_COMPRESS), compress_ag (the all-gathers' own format, 'same' by default;
    DEAR_COMPRESS_AG), error_feedback (keep what rounding dropped for the next iteration;
    DEAR_COMPRESS_EF), sparse ('auto', 'on', 'off'; DEAR_SPARSE): the weight of every nn.Embedding
    and nn.EmbeddingBag used by no other module (not tied) is declared row-sparse, so that only
    the rows a batch touched travel, where that sends fewer bytes (auto: measured over the
    warm-up; dear.sparse_stats tells what ran); on a GPU they travel dense, and sharded (their
    all-gathers carry parameters) only their gradients' reduce-scatters travel sparse. libdear
    refuses an unknown value, naming the accepted ones."""
    _load()
    if hasattr(model, "_dear"):
        raise DearError("dear.wrap", -2, "this model is already wrapped")
    env = _keyword_env({"schedule": schedule, "fusion": fusion, "bucket_cap_mb": bucket_cap_mb,
                        "clip_norm": clip_norm, "find_unused": find_unused, "compress": compress,
                        "compress_ag": compress_ag, "error_feedback": error_feedback, "sparse": sparse})
    w = _Wrapped(model, optimizer, comm, env, shard=shard, example=example)
    model._dear = w
    everything = range(len(w.params))
    mine = sorted(w.group_of)
    opt_default = _set_to_none_default(type(optimizer).zero_grad)
    mod_default = _set_to_none_default(type(model).zero_grad)

    def step(self, closure=None, **kwargs):
        return w.step(closure, kwargs)

    def opt_zero_grad(self, set_to_none=opt_default):
        w.zero_grad(mine, set_to_none)

    def model_zero_grad(self, set_to_none=mod_default):
        w.zero_grad(everything, set_to_none)

    def flushing(method):
        def run(*args, **kwargs):   # pending steps first: the state is the one after opt.step()
            w.flush()
            return method(*args, **kwargs)
        return run

    new_step = types.MethodType(step, optimizer)
    old = optimizer.__dict__.get("step")
    if old is not None and (hasattr(old, "_with_counter") or hasattr(old, "_wrapped_by_lr_sched")):
        # A scheduler made before wrap counts the steps through its own wrapper: count for it.
        def counted(closure=None, **kwargs):
            optimizer._step_count = getattr(optimizer, "_step_count", 0) + 1
            optimizer._opt_called = True
            return w.step(closure, kwargs)
        counted._with_counter = counted._wrapped_by_lr_sched = True
        new_step = counted
    w.patches = [_patch(optimizer, "step", new_step),
                 _patch(optimizer, "zero_grad", types.MethodType(opt_zero_grad, optimizer)),
                 _patch(optimizer, "state_dict", flushing(optimizer.state_dict)),
                 _patch(optimizer, "load_state_dict", flushing(optimizer.load_state_dict)),
                 _patch(model, "zero_grad", types.MethodType(model_zero_grad, model)),
                 _patch(model, "state_dict", flushing(model.state_dict)),
                 _patch(model, "load_state_dict", flushing(model.load_state_dict)),
                 _patch(model, "no_sync", w.no_sync)]
    return model, optimizer


def flush(model):
    """Complete all communication and run every pending step (under `dear`, the steps opt.step()
    asked for run in the next forward otherwise)."""
    model._dear.flush()


def close(model):
    """Flush, meet the other ranks and free libdear's context; the hooks are removed."""
    w = model._dear
    try:
        w.close()
    finally:
        for obj, name, saved in reversed(getattr(w, "patches", [])):
            if saved is _MISSING:
                obj.__dict__.pop(name, None)
            else:
                obj.__dict__[name] = saved
        del model._dear


def schedule(model):
    """The schedule in force: 'dear', 'wfbp' or 'sync'."""
    return model._dear.sched


def sparse_stats(model):
    """What the sparse path did for each embedding weight the binding declared row-sparse
    ({name: {block, sparse_rs, sparse_ag, density, density_union, bytes_sent, msgs_sparse,
    msgs_dense}}; dear_get_sparse_stats): whether its reduce-scatters and all-gathers run sparse
    now, the non-zero share of its rows measured over the warm-up (of the averaged gradient: -1
    sharded, where no rank holds it whole), and what was sent."""
    return model._dear.sparse_stats()


def plan_info(model):
    """What fitting the cost model to training found at the last online plan ({comm_scale,
    measured_iter_s, predicted_iter_s}; dear_get_plan_info, DEAR_COST_REFIT): the factor by which
    every collective must be dearer for the model to price the plan in force as it ran, that
    plan's measured iteration and its calibrated price (1, 0, 0 before the first online plan)."""
    return model._dear.plan_info()


def grad_norm(model):
    """With clip_norm (DEAR_CLIP_NORM): the global L2 norm, before clipping, of the last averaged
    gradient whose steps have run (under `dear` they run in the next forward: dear.flush first for
    the latest); None without clipping."""
    return model._dear.norm
