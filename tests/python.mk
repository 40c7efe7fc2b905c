# tests/python.mk: the Python binding (python/dear).
#   tests/python/torch.sh   dear.wrap against torch DDP (gloo) at np 1, 2, 4: CNN and transformer,
#                           SGD with momentum and AdamW with a schedule, every DEAR_SCHEDULE;
#                           compress="fp16"/"bf16" against DDP in float32 and against DDP's
#                           fp16_compress_hook; checkpoint and resume; unused and frozen parameters; the errors;
#                           DDP's training loops unchanged (test_loops.py: clipping, p.grad,
#                           no_sync, set_to_none, schedulers, state_dict, eval, GradScaler,
#                           exceptions); shard=True: DDP's parameters (the unsharded wrap's bit
#                           for bit at np 1-2), 1/P of the optimizer state, state cut at wrap,
#                           gradient reads refused, steps at backward's end (those at opt.step()
#                           bit for bit at np 1-2) or at opt.step() where the loop needs it; one
#                           rank failing ends the job
#                           (abort_torch.py); apps/torch/train.py learns in 60 iterations
SH_TESTS += tests/python/torch.sh
EXTRA_DIST += tests/python/test_torch.py tests/python/test_loops.py \
    tests/python/abort_torch.py apps/torch/train.py
