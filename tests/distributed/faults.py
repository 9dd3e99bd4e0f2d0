"""Run under mpiexec -n 2 by tests/test_distributed.py: rank 1 fails in the middle of a step
while rank 0 waits in an all_reduce; the job must end within the timeout, naming rank 1.

argv[1]: "raise" (rank 1 raises an uncaught exception), "kill" (rank 1 SIGKILLs itself with
its all_reduce in flight), "exit" (rank 1 leaves without an exception: rank 0's
all_reduce times out, argv[2] seconds) or "ddp" (a gradient hook raises on rank 1 inside a
DistributedDataParallel backward, while rank 0's backward waits for the buckets' all-reduces)."""

import os
import signal
import sys
import time

import numpy as np

import needle as ndl
import needle.distributed as dist

mode = sys.argv[1]
dist.init_process_group(timeout=float(sys.argv[2]) if len(sys.argv) > 2 else None)
rank = dist.get_rank()
a = ndl.NDArray(np.ones(1000, np.float32))
dist.all_reduce(a)  # a first step both ranks finish
print(f"rank {rank}: step 1 done", flush=True)
if mode == "ddp":
    from needle import nn

    np.random.seed(0)
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 2))
    ddp = dist.DistributedDataParallel(model, bucket_cap_mb=16 / 2**20)
    if rank == 1:

        def fail(grad):
            print(f"rank 1 fails at {time.time():.3f}", flush=True)
            raise RuntimeError("rank 1 fails mid-backward")

        model.modules[0].weight.register_hook(fail)
    ddp(ndl.Tensor(np.ones((3, 4), np.float32))).sum().backward()
    print(f"rank {rank}: backward done (it should not be)", flush=True)
    sys.exit(0)
if rank == 1:
    print(f"rank 1 fails at {time.time():.3f}", flush=True)
    if mode == "raise":
        raise RuntimeError("rank 1 fails mid-step")
    if mode == "kill":
        dist.all_reduce(ndl.NDArray(np.ones(1 << 20, np.float32)), async_op=True)
        os.kill(os.getpid(), signal.SIGKILL)
    if mode == "exit":
        sys.exit(0)
dist.all_reduce(ndl.NDArray(np.ones(1 << 20, np.float32)))
print(f"rank {rank}: step 2 done (it should not be)", flush=True)
