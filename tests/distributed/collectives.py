"""Run under mpiexec -n 2 by tests/test_distributed.py: every collective against NumPy on
every rank, on the devices named in argv (cpu, cuda), then the errors ranks must agree on.
``--nccl``: the NCCL backend (CUDA arrays only; bench/gpu_validate.sh runs it on one rank).

Prints one "ok NAME" line per check on rank 0 and "done" at the end; any failure raises (and
so aborts the job, naming the rank)."""

import sys

import numpy as np

import needle as ndl
import needle.distributed as dist

args = sys.argv[1:]
backend = "nccl" if "--nccl" in args else "mpi"
devices = [a for a in args if a != "--nccl"]
dist.init_process_group(backend=backend)
rank, size = dist.get_rank(), dist.get_world_size()
assert size >= 1 and 0 <= rank < size, (rank, size)


def ok(name):
    if rank == 0:
        print("ok", name, flush=True)


def values(shape, r, salt=0):
    """Rank r's values: distinct per rank and per element, exact in float32."""
    n = int(np.prod(shape))
    return (np.arange(n, dtype=np.float32).reshape(shape) * (r + 1) + 100 * r + salt).astype(
        np.float32
    )


def expect(got, want, name):
    np.testing.assert_array_equal(got, want, err_msg=f"rank {rank}: {name}")


for device_name in devices:
    device = ndl.cpu() if device_name == "cpu" else ndl.cuda()
    for shape in [(7,), (3, 5), (1,), (0,), (2, 0, 3), (257, 3)]:
        every = [values(shape, r) for r in range(size)]
        a = ndl.NDArray(every[rank], device=device)
        dist.all_reduce(a)
        expect(a.numpy(), np.sum(every, axis=0), f"sum {shape}")
        a = ndl.NDArray(every[rank], device=device)
        dist.all_reduce(a, op="avg")
        np.testing.assert_allclose(a.numpy(), np.mean(every, axis=0), rtol=1e-6)
        src = size - 1
        b = ndl.NDArray(every[rank], device=device)
        dist.broadcast(b, src=src)
        expect(b.numpy(), every[src], f"broadcast {shape}")
        outs = [ndl.NDArray(np.full(shape, -1, np.float32), device=device) for _ in range(size)]
        dist.all_gather(outs, ndl.NDArray(every[rank], device=device))
        for r in range(size):
            expect(outs[r].numpy(), every[r], f"all_gather {shape} from {r}")
    ok(f"{device_name} shapes")

    # Non-compact views, written in place through the view: the base outside it untouched.
    base_values = values((4, 6), rank)
    base = ndl.NDArray(base_values, device=device)
    view = base.permute((1, 0))[1:5, ::2]
    before = base_values.T[1:5, ::2]
    dist.all_reduce(view)
    want = np.sum([values((4, 6), r).T[1:5, ::2] for r in range(size)], axis=0)
    expect(view.numpy(), want, "view sum")
    outside = base.numpy().copy()
    outside.T[1:5, ::2] = 0
    inside_removed = base_values.copy()
    inside_removed.T[1:5, ::2] = 0
    expect(outside, inside_removed, "outside the view")
    assert not np.array_equal(before, want) or size == 1
    view = ndl.NDArray(values((5, 4), rank), device=device).permute((1, 0))
    dist.broadcast(view, src=0)
    expect(view.numpy(), values((5, 4), 0).T, "view broadcast")
    ok(f"{device_name} views")

    # Tensors: their data, in place; requires_grad is fine and nothing is recorded.
    t = ndl.Tensor(values((3, 4), rank), device=device, requires_grad=True)
    dist.all_reduce(t, op=dist.ReduceOp.AVG)
    np.testing.assert_allclose(
        t.numpy(), np.mean([values((3, 4), r) for r in range(size)], axis=0), rtol=1e-6
    )
    assert t.is_leaf and t.requires_grad
    outs = [ndl.Tensor(np.zeros((2,), np.float32), device=device) for _ in range(size)]
    dist.all_gather(outs, ndl.Tensor(values((2,), rank), device=device))
    for r in range(size):
        expect(outs[r].numpy(), values((2,), r), "tensor all_gather")
    ok(f"{device_name} tensors")

    # async_op: a Work to wait on.
    a = ndl.NDArray(values((9,), rank), device=device)
    work = dist.all_reduce(a, async_op=True)
    assert work.wait() is True and work.is_completed()
    expect(a.numpy(), np.sum([values((9,), r) for r in range(size)], axis=0), "async sum")
    ok(f"{device_name} async")

# Errors every rank meets together, after which the group still works; on the group's device
# (NCCL's is the GPU).
home = dist.get_device()
try:
    dist.all_reduce(ndl.NDArray(np.ones(3 + rank, np.float32), device=home))
except dist.DistributedError as e:
    message = str(e)
    assert size > 1, message
    assert "rank 0 called all_reduce(sum) on shape (3,)" in message, message
    assert "rank 1 called all_reduce(sum) on shape (4,)" in message, message
else:
    assert size == 1, "mismatched shapes were not caught"
try:
    dist.broadcast(ndl.NDArray(np.ones(2, np.float32), device=home), src=rank)
except dist.DistributedError as e:
    assert "rank 0 called broadcast(src=0)" in str(e) and "broadcast(src=1)" in str(e), str(e)
else:
    assert size == 1
for bad, kind in [
    (
        lambda: dist.all_reduce(ndl.NDArray(np.ones(2, np.float32), device=home), op="max"),
        ValueError,
    ),
    (
        lambda: dist.broadcast(ndl.NDArray(np.ones(2, np.float32), device=home), src=size),
        ValueError,
    ),
    (lambda: dist.all_reduce(np.ones(2, np.float32)), TypeError),
    (
        lambda: dist.all_gather(
            [ndl.NDArray(np.ones(2, np.float32), device=home)] * (size + 1),
            ndl.NDArray(np.ones(2, np.float32), device=home),
        ),
        ValueError,
    ),
    (
        lambda: dist.all_gather(
            [ndl.NDArray(np.ones(3, np.float32), device=home)] * size,
            ndl.NDArray(np.ones(2, np.float32), device=home),
        ),
        ValueError,
    ),
    (lambda: dist.init_process_group(), dist.DistributedError),
]:
    try:
        bad()
    except kind:
        pass
    else:
        raise AssertionError(f"rank {rank}: no {kind.__name__}")
a = ndl.NDArray(np.full(2, rank + 1.0, np.float32), device=home)
dist.all_reduce(a)
expect(a.numpy(), np.full(2, size * (size + 1) / 2, np.float32), "after the errors")
ok("errors")
dist.barrier()
dist.destroy_process_group()
assert not dist.is_initialized()
try:
    dist.barrier()
except dist.DistributedError as e:
    assert "init_process_group() first" in str(e), str(e)
else:
    raise AssertionError("barrier after destroy")
ok("destroy")
if rank == 0:
    print("done", flush=True)
