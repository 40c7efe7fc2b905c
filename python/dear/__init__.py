"""dear: data-parallel PyTorch training under mpirun, with libdear as the engine.

    import torch, dear
    model = Net()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model, opt = dear.wrap(model, opt)          # collective: every rank, the same model
    for x, y in batches:
        loss = loss_fn(model(x), y)
        loss.backward()                         # gradients start travelling during backward
        opt.step()                              # nothing left to do: see below
    dear.flush(model)                           # before a checkpoint, evaluation by hand, exit

Run it with `mpirun -np 4 python3 train.py`; every DEAR_* variable applies (DEAR_SCHEDULE,
DEAR_FUSION, ...). What happens, in the terms of libdear's C API (include/dear.h):

* The gradients of every parameter that requires one live in one flat arena per dtype, and each
  ``param.grad`` is a view into it, so buckets are zero-copy. Parameters are registered in the
  order of ``model.modules()``; each module that owns parameters is a layer, and its forward
  pre-hook begins its own layer and those of the modules inside it (whose parameters its forward
  may use without calling them).
* A hook on each parameter's gradient accumulator counts the layer down and reports
  ``dear_backward_done`` when the layer's gradients are all written; the end of backward is
  detected through the autograd engine (as DDP does) and reports ``dear_backward_end``. A forward
  pre-hook on each layer calls ``dear_forward_begin``.
* Each parameter's optimizer step runs inside libdear's update callback, the moment its averaged
  gradient is in place (in the next forward under ``dear``, at the end of backward under
  ``wfbp`` and ``sync``), with the hyper-parameters (learning rate, ...) its gradient's iteration
  had, then its gradient is zeroed for the next backward. So ``opt.step()`` and
  ``opt.zero_grad()`` do nothing; create learning-rate schedulers after ``wrap``. The optimizer
  must keep per-parameter state only (SGD, Adam, AdamW, ... but not LBFGS).
* Evaluation (``model.eval()`` or ``torch.no_grad()``) runs every pending update first and enters
  no profile. ``find_unused=True`` (or DEAR_FIND_UNUSED=1) leaves parameters that no rank used in
  an iteration untouched, as DDP's ``find_unused_parameters``.
* Parameters are broadcast from rank 0 at ``wrap``; buffers are not synchronised (as DDP with
  ``broadcast_buffers=False``).

ctypes, not a C extension: libdear's API is a dozen plain C calls, so ctypes binds it without
compiling against one torch's C++ ABI, and the same files work with every torch and Python the
machine has; the cost, a Python call per hook, is microseconds against milliseconds of layer
compute. Errors from libdear raise DearError with the library's own message.
"""
import ctypes
import ctypes.util
import os
import types

import torch

__all__ = ["DearError", "wrap", "flush", "close", "schedule"]

DEAR_OK = 0
_DTYPES = {torch.float32: 0, torch.float64: 1, torch.bfloat16: 2, torch.float16: 3}
_MODE_TRAIN, _MODE_EVAL = 0, 2


class DearError(RuntimeError):
    """A libdear call failed: .status is its dear_status_t, the message the library's log lines."""

    def __init__(self, call, status, message):
        self.status = status
        super().__init__("%s failed: %s%s" % (call, _load().dear_status_string(status).decode(),
                                             (":\n" + message.strip()) if message.strip() else ""))


class _UpdateInfo(ctypes.Structure):
    _fields_ = [("size", ctypes.c_size_t), ("grad", ctypes.c_void_p), ("count", ctypes.c_size_t),
                ("dtype", ctypes.c_int), ("mem", ctypes.c_int), ("arg", ctypes.c_void_p),
                ("name", ctypes.c_char_p), ("tensor", ctypes.c_int), ("layer", ctypes.c_int),
                ("iteration", ctypes.c_longlong), ("grad_norm", ctypes.c_double),
                ("clip_coef", ctypes.c_double), ("stream", ctypes.c_void_p)]


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
                       ("dear_no_grad", [vp, c_int]), ("dear_finalize", [pvp])):
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


class _Wrapped:
    """The state behind a wrapped model (model._dear)."""

    def __init__(self, model, opt, comm, find_unused):
        lib = _load()
        self.lib, self.model, self.opt, self.error = lib, model, opt, None
        comm = comm if comm is not None else _MPI.COMM_WORLD
        if find_unused:
            os.environ["DEAR_FIND_UNUSED"] = "1"
        handle = lib._comm_t.from_address(_MPI._addressof(comm)).value
        self.ctx = ctypes.c_void_p()
        _check("dear_init", lib.dear_init(handle, ctypes.byref(self.ctx)))
        self._collect(model)
        self._check_optimizer(opt)
        for p in self.params:   # every rank starts from rank 0's parameters, as DDP does
            comm.Bcast(p.detach().numpy(), root=0)
        self._make_arenas()
        self._update_fn = _UPDATE_FN(self._update)   # kept alive as long as the context
        for t, p in enumerate(self.params):
            dt = _DTYPES[p.dtype]
            _check("dear_register", lib.dear_register(self.ctx, self.names[t].encode(), self.layer_of[t],
                                                      ctypes.c_void_p(p.grad.data_ptr()), p.numel(), dt, 0,
                                                      self._update_fn, None))
        _check("dear_commit", lib.dear_commit(self.ctx))
        self.iteration, self.hyper, self.in_backward, self.mode = 0, {}, False, _MODE_TRAIN
        self.seen = set()
        self._install_hooks()

    def _collect(self, model):
        """Parameters in module order, each module that owns some a layer."""
        self.params, self.names, self.layer_of, self.layers = [], [], [], []
        for mname, mod in model.named_modules():
            own = [(n, p) for n, p in mod.named_parameters(recurse=False) if p.requires_grad]
            if not own:
                continue
            lid = len(self.layers)
            self.layers.append((mod, [len(self.params) + i for i in range(len(own))]))
            for n, p in own:
                if p.dtype not in _DTYPES or p.device.type != "cpu":
                    raise DearError("dear.wrap", -6, "parameter %s.%s is %s on %s; accepted: float32, float64, "
                                    "bfloat16, float16 on the CPU" % (mname, n, p.dtype, p.device))
                self.params.append(p)
                self.names.append((mname + "." + n) if mname else n)
                self.layer_of.append(lid)
        if not self.params:
            raise DearError("dear.wrap", -1, "the model has no parameter that requires a gradient")
        self.index = {id(p): t for t, p in enumerate(self.params)}
        self.signature = [(id(p), tuple(p.shape), p.requires_grad) for p in self.params]

    def _check_optimizer(self, opt):
        self.group_of = {}
        for g, group in enumerate(opt.param_groups):
            for p in group["params"]:
                if id(p) not in self.index:
                    raise DearError("dear.wrap", -1, "the optimizer holds a parameter of shape %s that the model "
                                    "does not train (not in the model, or requires_grad=False)" % (tuple(p.shape),))
                self.group_of[self.index[id(p)]] = g

    def _make_arenas(self):
        self.arenas = {}
        for dt in {p.dtype for p in self.params}:
            n = sum(p.numel() for p in self.params if p.dtype == dt)
            self.arenas[dt] = torch.zeros(n, dtype=dt)
        off = {dt: 0 for dt in self.arenas}
        self.views = []
        for p in self.params:
            o = off[p.dtype]
            view = self.arenas[p.dtype][o:o + p.numel()].view_as(p)
            off[p.dtype] = o + p.numel()
            if p.grad is not None:
                view.copy_(p.grad)
            p.grad = view
            self.views.append(view)

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
        self.pending = [len(ts) for _, ts in self.layers]
        self.begun = [False] * len(self.layers)
        for t, p in enumerate(self.params):
            acc = p.expand_as(p).grad_fn.next_functions[0][0]   # the parameter's AccumulateGrad node
            self.handles.append(acc.register_hook(self._grad_ready(t)))
            self.accumulators.append(acc)

    # ---- hooks ----
    def _model_pre(self, module, inputs):
        now = [(id(p), tuple(p.shape), p.requires_grad)
               for m in self.model.modules() for p in m.parameters(recurse=False) if p.requires_grad]
        if now != self.signature:
            raise DearError("forward", -2, "the model changed after dear.wrap (parameters added, removed, "
                            "reshaped or frozen); wrap the new model instead")
        for p, v in zip(self.params, self.views):
            if p.grad is None or p.grad.data_ptr() != v.data_ptr():
                p.grad = v   # model.zero_grad(set_to_none=True) dropped the view; the data is in the arena
        mode = _MODE_TRAIN if module.training and torch.is_grad_enabled() else _MODE_EVAL
        if mode != self.mode:
            _check("dear_set_mode", self.lib.dear_set_mode(self.ctx, mode))
            self.mode = mode

    def _layer_pre(self, lids):
        def hook(module, inputs):
            for lid in lids:
                _check("dear_forward_begin", self.lib.dear_forward_begin(self.ctx, lid))
                self.begun[lid] = True
            self._raise_update_error()
        return hook

    def _model_post(self, module, inputs, output):
        # Layers the forward never called (an unused module) begin now, before backward: their
        # updates are then not left pending into the backward pass.
        for lid, done in enumerate(self.begun):
            if not done:
                _check("dear_forward_begin", self.lib.dear_forward_begin(self.ctx, lid))
        self.begun = [False] * len(self.layers)
        self._raise_update_error()

    def _grad_ready(self, t):
        def hook(*_):
            if not self.in_backward:
                self.in_backward = True
                torch.autograd.Variable._execution_engine.queue_callback(self._backward_end)
            if t in self.seen:
                return
            self.seen.add(t)
            lid = self.layer_of[t]
            self.pending[lid] -= 1
            if self.pending[lid] == 0:
                _check("dear_backward_done", self.lib.dear_backward_done(self.ctx, lid))
        return hook

    def _backward_end(self):
        self.in_backward = False
        for lid, (_, ts) in enumerate(self.layers):
            if self.pending[lid] == 0:
                continue
            for t in ts:   # no gradient this iteration: contribute zeros (the arena holds them)
                if t not in self.seen:
                    _check("dear_no_grad", self.lib.dear_no_grad(self.ctx, t))
            _check("dear_backward_done", self.lib.dear_backward_done(self.ctx, lid))
        self.pending = [len(ts) for _, ts in self.layers]
        self.seen = set()
        # The hyper-parameters this iteration's gradients are applied with: under dear they are
        # applied during the next forward, after a scheduler may have stepped.
        self.hyper[self.iteration] = [{k: v for k, v in g.items() if k != "params"} for g in self.opt.param_groups]
        self.hyper.pop(self.iteration - 2, None)
        self.iteration += 1
        _check("dear_backward_end", self.lib.dear_backward_end(self.ctx))
        self._raise_update_error()

    def _update(self, info_p):
        try:
            info = info_p.contents
            t = info.tensor
            p = self.params[t]
            g = self.group_of.get(t)
            if g is not None:
                groups = self.opt.param_groups
                saved = [(grp["params"], {k: v for k, v in grp.items() if k != "params"}) for grp in groups]
                for grp in groups:
                    grp["params"] = []
                groups[g]["params"] = [p]
                then = self.hyper.get(info.iteration)
                if then is not None:
                    groups[g].update(then[g])
                try:
                    type(self.opt).step(self.opt)
                finally:
                    for grp, (params, hyper) in zip(groups, saved):
                        grp["params"] = params
                        grp.update(hyper)
            self.views[t].zero_()   # the next backward accumulates afresh
            return 0
        except BaseException as e:   # an exception must not cross the C frames
            self.error = e
            return 1

    def _raise_update_error(self):
        if self.error is not None:
            e, self.error = self.error, None
            raise e

    def flush(self):
        _check("dear_flush", self.lib.dear_flush(self.ctx))
        self._raise_update_error()

    def close(self):
        if self.ctx:
            for h in self.handles:
                h.remove()
            st = self.lib.dear_finalize(ctypes.byref(self.ctx))
            self.ctx = ctypes.c_void_p()
            _check("dear_finalize", st)


def _no_step(self, *args, **kwargs):
    return None


def wrap(model, optimizer, comm=None, find_unused=False):
    """Register model's trainable parameters with libdear and make optimizer's steps run in its
    update callbacks. Collective over comm (default MPI.COMM_WORLD): every rank wraps the same
    model. Returns (model, optimizer), the same objects, hooked."""
    if hasattr(model, "_dear"):
        raise DearError("dear.wrap", -2, "this model is already wrapped")
    w = _Wrapped(model, optimizer, comm, find_unused)
    model._dear = w
    # Bound methods (a learning-rate scheduler wraps optimizer.step and needs its __self__).
    optimizer.step = types.MethodType(_no_step, optimizer)     # steps run in libdear's updates
    optimizer.zero_grad = types.MethodType(_no_step, optimizer)  # gradients are zeroed once applied
    return model, optimizer


def flush(model):
    """Complete all communication and run every pending update (before a checkpoint or exit)."""
    model._dear.flush()


def close(model):
    """Flush, meet the other ranks and free libdear's context; the hooks are removed."""
    model._dear.close()


def schedule(model):
    """The schedule in force: 'dear', 'wfbp' or 'sync'."""
    return model._dear.lib.dear_schedule(model._dear.ctx).decode()
