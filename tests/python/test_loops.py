"""Training loops as people write them for DDP, run unchanged through dear.wrap (tests/python/torch.sh).

One loop function serves both: wrapped in DistributedDataParallel (gloo) and in dear.wrap, under
every DEAR_SCHEDULE, on the same data and initial parameters; the parameters and whatever the loop
records (clip_grad_norm_'s result, gradient norms for logging, evaluation outputs, a state_dict
checksum) must agree within 1e-5 relative. Each case adds one habit: clip_grad_norm_ and
clip_grad_value_ between backward and step, reading and scaling p.grad, torch._foreach_* on the
gradients (an unscale as GradScaler's), views of the gradients made once (.data, .detach().view,
slices, split) and read after every later backward, gradients inside containers as the first read
after backward (a keyword's list, parameters_to_vector, numpy()), GradScaler itself, no_sync() accumulation,
zero_grad(set_to_none=True), a scheduler made before wrap, state_dict()/load_state_dict() of model
and optimizer mid-training, model.eval() evaluation mid-training, clip_norm= against
clip_grad_norm_, a backward pass that raises and is skipped, and two backward passes through one
forward (against DDP's one of twice the loss: DDP refuses the second). Then the errors: an optimizer
that raises (the original error, once, on every rank; the wrapper goes on), and the refusals (a
closure, two steps for one backward, a parameter group added after wrap). Sharded (shard=True): the
habits that do not read a parameter's gradient (it is averaged only on each rank's slices) give
DDP's parameters, and a second backward pass through one forward is refused. Sharded steps run at
backward's end from the second iteration (shard_steps): SGD with momentum, AdamW, a scheduler,
no_sync() accumulation, clip_norm=, a state_dict round trip, a step skipped on an inf gradient's norm
and evaluation give DDP's parameters and bitwise those of shard='at_step' (the steps at opt.step());
the optimizer state is 1/P; a warm-up between backward and opt.step() keeps the steps at opt.step();
a later change of the hyper-parameters, or a skipped step, after the steps ran is refused.

With DEAR_TEST_DEVICE=cuda (tests/python/torch.sh sets it where torch sees a GPU) the loops run
on each rank's GPU (rank modulo the GPUs), DDP's gradients over gloo, dear's over
DEAR_CUDA_TRANSPORT, and GradScaler is CUDA's own.
"""
import copy
import math
import os
import sys
import warnings

import torch
import torch.nn as nn
from torch.nn.utils import clip_grad_norm_, clip_grad_value_

import dear
import test_torch as T
from mpi4py import MPI

COMM, RANK, SIZE = T.COMM, T.RANK, T.SIZE
check = T.check
ITERS = 8
SCALE = 1024.0   # a power of two: scaling and unscaling are exact
DEVICE = torch.device("cpu")
if os.environ.get("DEAR_TEST_DEVICE", "cpu") == "cuda":
    DEVICE = torch.device("cuda", RANK % torch.cuda.device_count())
    torch.cuda.set_device(DEVICE)
TRIP = [False]
EARLY = [None]   # whether run_dear's last sharded run stepped at backward's end


class Trip(torch.autograd.Function):
    """Identity whose backward raises while TRIP[0] is set: a backward pass that fails midway."""

    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g):
        if TRIP[0]:
            raise RuntimeError("tripwire in backward")
        return g


class TripCNN(T.CNN):
    def forward(self, x):
        x = T.F.max_pool2d(T.F.relu(self.conv1(x)), 2)
        x = Trip.apply(T.F.relu(self.conv2(x)))
        x = T.F.adaptive_avg_pool2d(x, 4).flatten(1)
        return self.fc2(T.F.relu(self.fc1(x)))


def make(kind, opt_name):
    torch.manual_seed(7)
    model = (TripCNN() if kind == "cnn" else T.Transformer()).to(DEVICE)
    if opt_name == "sgd":
        opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, weight_decay=1e-4)
    else:
        opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.1)
    return model, opt


def make_scaler():
    if DEVICE.type == "cuda":
        return torch.cuda.amp.GradScaler(init_scale=SCALE)
    if hasattr(torch, "amp") and hasattr(torch.amp, "GradScaler"):   # torch >= 2.3: CPU too
        return torch.amp.GradScaler("cpu", init_scale=SCALE)
    return torch.cuda.amp.GradScaler(enabled=False)   # torch 1.13: CUDA only, the calls pass through


def loop(net, module, opt, sched, kind, feat, data, is_ddp):
    """The loop of a DDP user; feat is the habit under test. Returns what it recorded."""
    rec, snap, cached = [], None, None
    params = list(module.parameters())
    scaler = make_scaler() if feat == "scaler" else None
    xv = data[0][0]
    for i, (x, y) in enumerate(data):
        if feat == "backward_raises" and i == 3 and is_ddp:
            continue   # DDP's reference skips the batch whose backward dear's loop sees fail
        if feat == "set_to_none":
            opt.zero_grad(set_to_none=True)
            rec.append(float(all(p.grad is None for p in params)))
        elif feat == "sched_before":   # zero_grad first, as many loops do
            opt.zero_grad()
        if feat == "accumulate":
            half = x.shape[0] // 2
            with net.no_sync():
                (T.loss_of(kind, net(x[:half]), y[:half]) / 2).backward()
            (T.loss_of(kind, net(x[half:]), y[half:]) / 2).backward()
        else:
            loss = T.loss_of(kind, net(x), y)
            if feat == "backward_raises":
                TRIP[0] = i == 3
                try:
                    loss.backward()
                except RuntimeError as e:
                    check("tripwire" in str(e), "backward_raises: %s" % e)
                    opt.zero_grad()
                    continue
                finally:
                    TRIP[0] = False
            elif feat == "scaler":
                scaler.scale(loss).backward()
            elif feat == "skip_inf" and i == 4:
                (loss * float("inf")).backward()   # a gradient GradScaler would skip its step on
            elif feat == "two_backward" and is_ddp:
                (2 * loss).backward()   # DDP refuses a second backward pass through one forward
            elif feat == "two_backward":
                loss.backward(retain_graph=True)   # two losses from one forward, say
                loss.backward()
            else:
                (loss * SCALE if feat == "foreach" else loss).backward()
        if feat == "clip_grad_norm_":
            rec.append(clip_grad_norm_(module.parameters(), 0.5).item())
        elif feat == "clip_grad_value_":
            clip_grad_value_(module.parameters(), 0.01)
        elif feat == "grad_io":
            rec.append(sum(p.grad.norm() ** 2 for p in params).item())   # a logged gradient norm
            params[0].grad.mul_(0.5)                                        # custom scaling
            params[1].grad.data.mul_(2.0)
            rec.append(clip_grad_norm_(params[-2:], 0.01).item())          # clipping a subset
            rec.append(params[2].grad.detach().abs().max().item())
        elif feat == "foreach":
            torch._foreach_mul_([p.grad for p in params], 1.0 / SCALE)     # an unscale, as GradScaler's
            rec.append(torch.stack([torch.norm(p.grad) for p in params]).norm().item())
        elif feat == "cached_views":   # made once and read after every later backward, as fused
            if cached is None:         # optimizers and gradient loggers keep them
                cached = ([p.grad.data for p in params], [p.grad.detach().view(-1) for p in params],
                          [p.grad[:2] for p in params], list(params[0].grad.split(1)))
            data, flat, heads, rows = cached
            rec.append(torch.cat([v.reshape(-1) for v in data]).norm().item())
            rec.append(sum(v.abs().sum().item() for v in flat))
            rec.append(sum(h.abs().sum().item() for h in heads))
            rec.append(sum(r.abs().sum().item() for r in rows))
        elif feat == "nested_reads":   # gradients inside containers, as the first read after backward
            rec.append(torch.cat(tensors=[p.grad for p in params if p.dim() == 1]).norm().item())
            rec.append(torch.stack(tensors=[p.grad.norm() for p in params]).sum().item())
            rec.append(torch.nn.utils.parameters_to_vector([p.grad for p in params]).norm().item())
            if DEVICE.type == "cpu":
                a = params[0].grad.numpy()
                rec.append(float(abs(a).sum()))
                if isinstance(params[0].grad, dear._Grad):   # gradients still travelling: a copy, not the
                    check(not a.flags.writeable,             # arena, and a write to it fails loudly
                          "nested_reads: p.grad.numpy() while its gradient travels can be written")
        if feat == "scaler":
            scaler.unscale_(opt)
            rec.append(clip_grad_norm_(module.parameters(), 0.5).item())
            scaler.step(opt)
            scaler.update()
        elif feat == "clip_norm" and is_ddp:
            rec.append(clip_grad_norm_(module.parameters(), 0.5).item())
            opt.step()
        elif feat == "skip_inf":   # the skip decided on the global norm (a clip_norm of 1e30 only reports it)
            norm = clip_grad_norm_(module.parameters(), 1e30).item() if is_ddp else dear.grad_norm(net)
            rec.append(norm if math.isfinite(norm) else -1.0)
            if math.isfinite(norm):
                opt.step()
        else:
            opt.step()
        if feat in ("cached_views", "nested_reads"):
            opt.zero_grad(set_to_none=False)   # the gradient tensors stay, as the cached views need
        elif feat not in ("set_to_none", "sched_before"):
            opt.zero_grad()
        sched.step()
        if feat == "eval" and i % 3 == 1:
            net.eval()
            with torch.no_grad():
                rec += net(xv).flatten().tolist()[:16]
            net.train()
        elif feat == "eval" and i % 3 == 2:   # evaluation without no_grad, as some write it
            net.eval()
            rec += net(xv).flatten().tolist()[:16]
            net.train()
        if feat == "state_dict":
            if i == 3:
                snap = ({k: v.clone() for k, v in module.state_dict().items()}, copy.deepcopy(opt.state_dict()))
                rec += [v.double().sum().item() for v in snap[0].values()]
                rec += [s["exp_avg"].double().sum().item() for s in snap[1]["state"].values()]
            if i == 5:   # roll back to iteration 3's state, as a restart from a checkpoint does
                module.load_state_dict(snap[0])
                opt.load_state_dict(snap[1])
    return rec


# habit -> (model, optimizer); SGD where a wrong gradient scale would show (Adam hides it)
CASES = {"clip_grad_norm_": ("cnn", "sgd"), "clip_grad_value_": ("cnn", "sgd"), "grad_io": ("cnn", "sgd"),
         "foreach": ("cnn", "sgd"), "scaler": ("cnn", "sgd"), "accumulate": ("cnn", "sgd"),
         "set_to_none": ("cnn", "adamw"), "sched_before": ("cnn", "adamw"), "state_dict": ("cnn", "adamw"),
         "eval": ("cnn", "adamw"), "clip_norm": ("transformer", "sgd"), "backward_raises": ("cnn", "adamw"),
         "two_backward": ("cnn", "sgd"), "cached_views": ("cnn", "sgd"), "nested_reads": ("cnn", "sgd")}


# Loops that only the sharded tests run: plain SGD with momentum, a step skipped on an inf gradient.
SHARD_CASES = {"plain": ("cnn", "sgd"), "skip_inf": ("cnn", "sgd")}


def case(feat):
    return CASES[feat] if feat in CASES else SHARD_CASES[feat]


def data_for(kind):
    return [(x.to(DEVICE), y.to(DEVICE)) for x, y in T.batches(kind, ITERS)]


def run_ddp(feat):
    kind, opt_name = case(feat)
    model, opt = make(kind, opt_name)
    ddp = nn.parallel.DistributedDataParallel(model, broadcast_buffers=False)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=3, gamma=0.5)
    rec = loop(ddp, model, opt, sched, kind, feat, data_for(kind), True)
    return [p.detach().clone() for p in model.parameters()], rec


def run_dear(feat, schedule, shard=False, **plan):
    kind, opt_name = case(feat)
    model, opt = make(kind, opt_name)
    if feat == "sched_before":
        sched = torch.optim.lr_scheduler.StepLR(opt, step_size=3, gamma=0.5)
    clip = {"clip_norm": 0.5, "skip_inf": 1e30}.get(feat)
    model, opt = dear.wrap(model, opt, schedule=schedule, clip_norm=clip, shard=shard, **plan)
    if feat != "sched_before":
        sched = torch.optim.lr_scheduler.StepLR(opt, step_size=3, gamma=0.5)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        rec = loop(model, model, opt, sched, kind, feat, data_for(kind), False)
    for w in caught:   # a scheduler that lost count of the steps says so
        check("optimizer.step()" not in str(w.message), "%s %s: warning: %s" % (feat, schedule, w.message))
    EARLY[0] = getattr(model._dear, "early", None)
    out = [p.detach().clone() for p in model.parameters()]   # parameters() alone does not flush
    if feat == "clip_norm":
        dear.flush(model)
        out = [p.detach().clone() for p in model.parameters()]
        rec = [dear.grad_norm(model)]
    elif schedule == "dear":   # the last step runs in the next forward: until then the old parameters
        dear.flush(model)
        out = [p.detach().clone() for p in model.parameters()]
    dear.close(model)
    return out, rec


def rec_diff(a, b):
    """As T.rel_diff: the largest difference relative to the largest value (a sum near zero has
    no relative precision of its own)."""
    if len(a) != len(b):
        return float("inf")
    return max([abs(x - y) for x, y in zip(a, b)] or [0.0]) / (max([abs(y) for y in b] or [0.0]) + 1e-12)


def loops_against_ddp():
    for feat in CASES:
        ref, ref_rec = run_ddp(feat)
        if feat == "clip_norm":
            ref_rec = ref_rec[-1:]   # dear.grad_norm: the last iteration's norm
        for schedule in ("dear", "wfbp", "sync"):
            got, rec = run_dear(feat, schedule)
            d, r = T.rel_diff(got, ref), rec_diff(rec, ref_rec)
            what = "%s %s np %d" % (feat, schedule, SIZE)
            check(d <= T.TOL, "%s: parameters differ from DDP by %.3g relative" % (what, d))
            check(r <= T.TOL, "%s: recorded values differ from DDP's by %.3g relative (%s against %s)" %
                  (what, r, rec[:4], ref_rec[:4]))
            if RANK == 0:
                print("ok: %s: parameters %.2g, recorded values (%d) %.2g from DDP's" % (what, d, len(rec), r),
                      flush=True)


def shard_loops():
    """shard=True in the habits that keep to the optimizer (the state dict is per rank: only the
    parameters compare); a second backward pass through one forward is refused."""
    runs = [(f, "dear") for f in ("set_to_none", "sched_before", "accumulate", "eval", "clip_norm", "state_dict",
                                  "backward_raises")] + [("accumulate", "wfbp"), ("clip_norm", "sync")]
    refs = {}
    for feat, schedule in runs:
        if feat not in refs:
            refs[feat] = run_ddp(feat)
        ref, ref_rec = refs[feat]
        got, rec = run_dear(feat, schedule, shard=True)
        d = T.rel_diff(got, ref)
        r = 0.0 if feat == "state_dict" else rec_diff(rec, ref_rec[-1:] if feat == "clip_norm" else ref_rec)
        what = "sharded %s %s np %d" % (feat, schedule, SIZE)
        check(d <= T.TOL and r <= T.TOL, "%s: differs from DDP by %.3g (parameters), %.3g (recorded)" % (what, d, r))
        if RANK == 0:
            print("ok: %s: parameters %.2g, recorded values %.2g from DDP's" % (what, d, r), flush=True)
    model, opt = make("cnn", "sgd")
    model, opt = dear.wrap(model, opt, shard=True)
    x, y = T.batches("cnn", 1)[0]
    loss = T.loss_of("cnn", model(x), y)
    loss.backward(retain_graph=True)
    T.expect_error("a second backward through one forward, sharded", "second backward pass through one forward",
                   loss.backward)
    opt.step()
    dear.close(model)


# One plan for both runs of a bitwise comparison, of several buckets: auto's would follow timing.
FIXED_PLAN = {"fusion": "threshold", "bucket_cap_mb": 16 / 1024}


def shard_steps():
    """shard=True steps each slice when backward ends, before opt.step(), which is then a no-op:
    every loop gives DDP's parameters, and what shard='at_step' (the steps at opt.step()) gives under
    the same fixed plan, bitwise on 1 and 2 ranks (auto's plan would follow timing, and the norm's
    rounding the plan's buckets; on more ranks a sum's rounding follows the algorithm too); the
    steps run before opt.step() from the second iteration, with small buckets in several batches;
    the optimizer state is 1/P; a first iteration that changes the hyper-parameters or writes the
    gradients between backward and opt.step() falls back to 'at_step'; a later change, write or
    skipped step, once the steps ran, is refused."""
    feats = ("plain", "set_to_none", "sched_before", "accumulate", "clip_norm", "state_dict", "skip_inf", "eval")
    for feat in feats:
        ref, ref_rec = run_ddp(feat)
        for schedule in ("dear", "wfbp") if feat in ("plain", "skip_inf") else ("dear",):
            got, rec = run_dear(feat, schedule, shard=True, **FIXED_PLAN)
            check(EARLY[0] is True, "sharded steps, %s %s: the steps did not move to backward's end" % (feat, schedule))
            held, held_rec = run_dear(feat, schedule, shard="at_step", **FIXED_PLAN)
            d = T.rel_diff(got, ref)
            r = 0.0 if feat == "state_dict" else rec_diff(rec, ref_rec[-1:] if feat == "clip_norm" else ref_rec)
            same = all(torch.equal(a, b) for a, b in zip(got, held)) and rec == held_rec
            what = "sharded steps at backward's end, %s %s np %d" % (feat, schedule, SIZE)
            check(d <= T.TOL and r <= T.TOL, "%s: differs from DDP by %.3g (parameters), %.3g (recorded)" %
                  (what, d, r))
            # On more than 2 ranks a sum's rounding follows the algorithm, which timing may pick: close, then.
            close = T.rel_diff(got, held) <= T.TOL and rec_diff(rec, held_rec) <= T.TOL
            check(same or (SIZE > 2 and close), "%s: not %s what shard='at_step' gives" %
                  (what, "bitwise" if SIZE <= 2 else "within %g of" % T.TOL))
            if RANK == 0:
                print("ok: %s: parameters %.2g, recorded values %.2g from DDP's, %s shard='at_step'" %
                      (what, d, r, "bitwise" if same else "close to"), flush=True)

    # Where the steps run, and the state they keep: 4 KiB buckets, so that the slices come in many
    # buckets and step in several batches, bitwise as all of them at opt.step().
    ends, batches = {}, []
    early_batch = dear._Wrapped._early_batch

    def counted(w):
        batches.append(len(w.shard_fired))
        early_batch(w)
    dear._Wrapped._early_batch = counted
    try:
        for shard in (True, "at_step"):
            model, opt = make("cnn", "adamw")
            total = sum(p.numel() for p in model.parameters())
            model, opt = dear.wrap(model, opt, shard=shard, fusion="threshold", bucket_cap_mb=4 / 1024)
            counts = []
            for i, (x, y) in enumerate(T.batches("cnn", 3)):
                before = [p.detach().clone() for p in model.parameters()]
                batches.clear()
                T.loss_of("cnn", model(x), y).backward()
                counts.append(sorted({int(s["step"]) for s in opt.state.values()}))
                moved = any(not torch.equal(a, b) for a, b in zip(before, model.parameters()))
                opt.step()
                counts[-1] += sorted({int(s["step"]) for s in opt.state.values()})
                opt.zero_grad()
            dear.flush(model)
            ends[shard] = [p.detach().clone() for p in model.parameters()]
            mine = sum(s["exp_avg"].numel() + s["exp_avg_sq"].numel() for s in opt.state.values())
            nslices = len(model._dear.slices)
            dear.close(model)
            if shard is True:
                check(moved, "sharded steps: the parameters had not moved when backward returned")
                check(counts == [[1], [2, 2], [3, 3]], "sharded steps: AdamW's step counts after backward, after "
                      "opt.step(): %s, expected [[1], [2, 2], [3, 3]] (the first at opt.step(), then at backward's "
                      "end)" % (counts,))
                last, early_counts = list(batches), counts
                check(len(last) >= 2 and sum(last) == nslices, "sharded steps: the last backward stepped %s of its "
                      "%d slices in batches of %s, expected all in two or more" % (sum(last), nslices, last))
    finally:
        dear._Wrapped._early_batch = early_batch
    check(all(torch.equal(a, b) for a, b in zip(ends[True], ends["at_step"])) or
          (SIZE > 2 and T.rel_diff(ends[True], ends["at_step"]) <= T.TOL),
          "sharded steps in batches: not %s the steps at opt.step()" % ("bitwise" if SIZE <= 2 else "close to"))
    everyone = COMM.allreduce(mine, op=MPI.SUM)
    check(everyone == 2 * total and mine <= 2 * (total // SIZE + len(list(model.parameters()))),
          "sharded steps: this rank keeps %d state floats, all %d, for %d parameters on %d ranks" %
          (mine, everyone, total, SIZE))
    if RANK == 0:
        print("ok: sharded steps: AdamW steps %s (after backward, after opt.step()), the last backward's in batches "
              "of %s slices, bitwise the steps at opt.step(); state %d of %d floats here" %
              (early_counts, last, mine, 2 * total), flush=True)

    # A first iteration that sets the learning rate between backward and opt.step() (a warm-up written
    # there), or scales the gradients there (an unscale, as GradScaler's walks the optimizer's groups:
    # the slices, sharded), keeps the steps at opt.step(), and gives what DDP's loop gives.
    for habit in ("a warm-up", "an unscale"):
        outs = []
        for shard in (None, True):
            model, opt = make("cnn", "sgd")
            net = nn.parallel.DistributedDataParallel(model, broadcast_buffers=False) if shard is None else \
                dear.wrap(model, opt, shard=True)[0]
            for i, (x, y) in enumerate(T.batches("cnn", 4)):
                T.loss_of("cnn", net(x.to(DEVICE)), y.to(DEVICE)).backward()
                for g in opt.param_groups:
                    if habit == "a warm-up":
                        g["lr"] = 0.05 * (i + 1) / 4
                    else:
                        torch._foreach_mul_([p.grad for p in g["params"]], 0.5)
                opt.step()
                opt.zero_grad()
            if shard:
                dear.flush(model)
                check(model._dear.early is False, "sharded steps: %s between backward and opt.step() still "
                      "stepped at backward's end" % habit)
            outs.append([p.detach().clone() for p in model.parameters()])
            if shard:
                dear.close(model)
        d = T.rel_diff(outs[1], outs[0])
        check(d <= T.TOL, "sharded steps, %s between backward and opt.step(): %.3g from DDP" % (habit, d))
        if RANK == 0:
            print("ok: sharded steps, %s between backward and opt.step(): steps at opt.step(), %.2g from DDP" %
                  (habit, d), flush=True)

    # Once the steps run at backward's end, a later change of them, a write to the gradients or a
    # skipped step is refused.
    for late in ("lr", "write", "skip"):
        model, opt = make("cnn", "sgd")
        model, opt = dear.wrap(model, opt, shard=True)
        batches = T.batches("cnn", 3)
        for x, y in batches[:2]:
            T.loss_of("cnn", model(x), y).backward()
            opt.step()
            opt.zero_grad()
        x, y = batches[2]
        T.loss_of("cnn", model(x), y).backward()
        if late == "lr":
            opt.param_groups[0]["lr"] = 0.01
            T.expect_error("sharded steps, the learning rate set after they ran", "the hyper-parameters changed",
                           opt.step)
        elif late == "write":
            opt.param_groups[0]["params"][0].grad.mul_(0.5)
            T.expect_error("sharded steps, a gradient scaled after they ran", "the gradients were written", opt.step)
        else:
            T.expect_error("sharded steps, opt.step() skipped after they ran", "opt.step() did not follow",
                           lambda: model(x))
        dear.close(model)
    model, opt = make("cnn", "sgd")
    T.expect_error("shard='yes'", "accepted: False, True", lambda: dear.wrap(model, opt, shard="yes"))


class Fragile(torch.optim.SGD):
    """SGD that raises while armed: an optimizer failing in the middle of training."""
    armed = False

    def step(self, closure=None):
        if Fragile.armed:
            raise ValueError("fragile optimizer failed")
        return super().step(closure)


def optimizer_raises():
    """The optimizer's own error, once, on every rank, where the step runs; the wrapper goes on.
    Sharded, the steps run at backward's end from the second iteration: backward() raises it."""
    for schedule, shard in (("dear", False), ("wfbp", False), ("sync", False), ("dear", True)):
        torch.manual_seed(7)
        model = T.CNN()
        opt = Fragile(model.parameters(), lr=0.05, momentum=0.9)
        model, opt = dear.wrap(model, opt, schedule=schedule, shard=shard)
        seen = []
        for i, (x, y) in enumerate(T.batches("cnn", ITERS)):
            try:
                T.loss_of("cnn", model(x), y).backward()
                Fragile.armed = Fragile.armed or i == 3   # until it has failed, wherever the step runs
                opt.step()
                opt.zero_grad()
            except ValueError as e:
                Fragile.armed = False
                seen.append((i, str(e)))
        dear.flush(model)
        flat = torch.cat([p.detach().flatten() for p in model.parameters()])
        dear.close(model)
        what = "optimizer raises, %s%s np %d" % (schedule, " sharded" if shard else "", SIZE)
        # under dear a step runs in the next forward (the first one excepted), sharded in the next backward
        check(len(seen) == 1 and seen[0][0] in ((3, 4) if schedule == "dear" else (3,)) and
              seen[0][1] == "fragile optimizer failed", "%s: caught %s" % (what, seen))
        same = COMM.allreduce(int(torch.equal(flat, COMM.bcast(flat, root=0))), op=MPI.MIN)
        check(same == 1 and torch.isfinite(flat).all(), "%s: ranks differ afterwards" % what)
        if RANK == 0:
            print("ok: %s: ValueError at iteration %d, training went on, ranks agree" % (what, seen[0][0] if seen
                                                                                        else -1), flush=True)


def refusals():
    model, opt = make("cnn", "sgd")
    model, opt = dear.wrap(model, opt, schedule="dear")
    x, y = T.batches("cnn", 1)[0]
    T.loss_of("cnn", model(x), y).backward()
    T.expect_error("a closure", "a closure re-evaluates the model", lambda: opt.step(lambda: 0.0))
    opt.step()
    T.expect_error("two steps for one backward", "no synchronised backward pass since the last step", opt.step)
    opt.add_param_group({"params": [nn.Parameter(torch.zeros(2))]})
    T.loss_of("cnn", model(x), y).backward()
    T.expect_error("a parameter group added after wrap", "parameter groups changed after dear.wrap", opt.step)
    opt.param_groups.pop()
    T.expect_error("a copy of a wrapped model", "cannot be copied or pickled", lambda: copy.deepcopy(model))
    dear.close(model)


def public_hook_path():
    """torch >= 2.1's register_post_accumulate_grad_hook, which the binding prefers: where torch
    lacks it, a stand-in with its documented contract (hook(param) after the gradient is
    accumulated, a handle with remove()) built on the AccumulateGrad node, so that the binding's
    code for it runs; the real one is torch's to test."""
    real = hasattr(torch.Tensor, "register_post_accumulate_grad_hook")
    if not real:
        def stand_in(self, hook):
            self._dear_test_acc = self.expand_as(self).grad_fn.next_functions[0][0]   # kept alive
            return self._dear_test_acc.register_hook(lambda *_: hook(self))
        torch.Tensor.register_post_accumulate_grad_hook = stand_in
    try:
        ref, ref_rec = run_ddp("clip_grad_norm_")
        for schedule in ("dear", "wfbp"):
            got, rec = run_dear("clip_grad_norm_", schedule)
            d, r = T.rel_diff(got, ref), rec_diff(rec, ref_rec)
            what = "register_post_accumulate_grad_hook (%s) %s np %d" % ("torch's" if real else "stand-in",
                                                                        schedule, SIZE)
            check(d <= T.TOL and r <= T.TOL, "%s: differs from DDP by %.3g, %.3g" % (what, d, r))
            if RANK == 0:
                print("ok: %s: parameters %.2g, norms %.2g from DDP's" % (what, d, r), flush=True)
    finally:
        if not real:
            del torch.Tensor.register_post_accumulate_grad_hook


def keywords():
    """A keyword wins over its DEAR_* variable, for its own context only."""
    os.environ["DEAR_SCHEDULE"] = "sync"
    model, opt = make("cnn", "sgd")
    model, opt = dear.wrap(model, opt, schedule="wfbp", find_unused=False, bucket_cap_mb=1)
    check(dear.schedule(model) == "wfbp", "schedule='wfbp' gave %s" % dear.schedule(model))
    check(os.environ.get("DEAR_SCHEDULE") == "sync" and "DEAR_FIND_UNUSED" not in os.environ,
          "wrap's keywords leaked into the environment")
    dear.close(model)
    del os.environ["DEAR_SCHEDULE"]
    if RANK == 0:
        print("ok: keywords win over DEAR_* for their context", flush=True)


if __name__ == "__main__":
    # --cases A,B: only those loops (cuda/gpu-check.sh's cut-down list for a short GPU slot);
    # --ddp-backend nccl: DDP over NCCL (one rank per GPU).
    import argparse
    ap = argparse.ArgumentParser()
    ap.add_argument("--cases", help="comma-separated: " + ",".join(CASES))
    ap.add_argument("--ddp-backend", choices=["gloo", "nccl"], default="gloo")
    ap.add_argument("--tests", help="comma-separated test functions to run alone, e.g. shard_steps,shard_loops")
    a = ap.parse_args()
    if a.tests:
        sys.exit(T.run_tests(*[globals()[n] for n in a.tests.split(",")], backend=a.ddp_backend))
    if a.cases:
        unknown = [c for c in a.cases.split(",") if c not in CASES]
        if unknown:
            ap.error("unknown case(s) %s: expected some of %s" % (",".join(unknown), ",".join(CASES)))
        CASES = {c: CASES[c] for c in a.cases.split(",")}
    if DEVICE.type == "cuda" or a.cases:
        sys.exit(T.run_tests(loops_against_ddp, backend=a.ddp_backend))
    sys.exit(T.run_tests(loops_against_ddp, optimizer_raises, refusals, public_hook_path, keywords, shard_loops,
                         shard_steps, backend=a.ddp_backend))
