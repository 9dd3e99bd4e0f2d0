"""Run under mpiexec -n 2 by tests/test_collectives_dtypes.py: all_reduce (sum, avg, async),
broadcast and all_gather of float32, float16, bfloat16 and float64 arrays and Tensors on the
devices named in argv (cpu, cuda), each result in the array's own dtype, against values
computed here with NumPy; then the dtype mismatches every rank must see together.

Values: float64 ones a float32 would round (0.1 + 1e-12), so a narrowing shows; narrow ones
whose float32 sums are ties, so the one rounding to nearest even shows (and a sum of raw bits
would be far off); inf, -inf, NaN and -0.0 travel bit for bit.

Prints one "ok NAME" line per check on rank 0 and "done" at the end; any failure raises (and
so aborts the job, naming the rank)."""

import sys

import numpy as np

import needle as ndl
import needle.distributed as dist

# float16 sums past 65504 are inf on purpose.
np.seterr(over="ignore")

dist.init_process_group(timeout=60)
rank, size = dist.get_rank(), dist.get_world_size()
assert size == 2, f"this script checks two ranks' exact sums, got {size}"
DTYPES = ("float32", "float16", "bfloat16", "float64")


def ok(name):
    if rank == 0:
        print("ok", name, flush=True)


def bf16_round(wide):
    """float32 values rounded to the nearest bfloat16 (ties to even), as float32."""
    bits = np.asarray(wide, np.float32).view(np.uint32).astype(np.uint64)
    rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) << 16
    return rounded.astype(np.uint32).view(np.float32)


def narrow(values, dtype):
    """``values`` (float64) rounded once to ``dtype``, as NumPy's array of what numpy() gives
    for that dtype (float32 for bfloat16)."""
    if dtype == "bfloat16":
        return bf16_round(np.asarray(values, np.float32))
    return np.asarray(values, dtype)


# Each rank's operands for the sums: (rank 0, rank 1, the exact sum rounded once), all
# representable in the dtype.
SUMS = {
    "float32": ([1.0, 2.0**-24, -7.5, 1e-3], [2.0**-24, 1.0, 0.25, 2e-3]),
    # 1 + 2^-11 ties to 1; (1 + 2^-10) + 2^-11 ties to 1 + 2^-9.
    "float16": ([1.0, 1.0 + 2.0**-10, 60000.0, -0.5], [2.0**-11, 2.0**-11, 10000.0, 0.125]),
    # 1 + 2^-8 ties to 1; (1 + 2^-7) + 2^-8 ties to 1 + 2^-6; 2^100 + 2^90 stays 2^100.
    "bfloat16": ([1.0, 1.0 + 2.0**-7, 2.0**100, 3.0], [2.0**-8, 2.0**-8, 2.0**90, -0.5]),
    "float64": ([0.1 + 1e-12, 1.0 + 2.0**-40, -3.3, 1e300], [0.2 + 1e-12, 2.0**-52, 1.1, 1e300]),
}
# The sums above, rounded by hand to each dtype where the rounding is the point.
HAND = {
    "float16": [1.0, 1.0 + 2.0**-9, np.inf, -0.375],  # 70000 overflows float16
    "bfloat16": [1.0, 1.0 + 2.0**-6, 2.0**100, 2.5],
}
SPECIAL = [np.inf, -np.inf, np.nan, -0.0, 0.0, 1.5]


def operands(dtype, r):
    return np.array(SUMS[dtype][r], np.float64)


def expected_sum(dtype):
    a, b = operands(dtype, 0), operands(dtype, 1)
    if dtype == "float64":
        return a + b
    wide = narrow(a, dtype).astype(np.float32) + narrow(b, dtype).astype(np.float32)
    return narrow(wide, dtype)


def same(got, want, name):
    """Bit-for-bit equality (NaN equal to NaN, -0.0 not equal to 0.0) in want's dtype."""
    got, want = np.asarray(got), np.asarray(want)
    assert got.dtype == want.dtype, f"rank {rank}: {name}: dtype {got.dtype} != {want.dtype}"
    np.testing.assert_array_equal(got, want, err_msg=f"rank {rank}: {name}")
    assert np.array_equal(np.signbit(got), np.signbit(want)), f"rank {rank}: {name}: signs"


def host_dtype(dtype):
    return np.float32 if dtype == "bfloat16" else np.dtype(dtype)


def make(values, dtype, device):
    return ndl.NDArray(np.asarray(values, np.float64), device=device, dtype=dtype)


for device_name in sys.argv[1:]:
    device = ndl.cpu() if device_name == "cpu" else ndl.cuda()
    for dtype in DTYPES:
        want = expected_sum(dtype)
        if dtype in HAND:
            same(want, np.asarray(HAND[dtype], host_dtype(dtype)), f"{dtype} hand sums")
        a = make(operands(dtype, rank), dtype, device)
        dist.all_reduce(a)
        assert a.dtype == dtype, a.dtype
        same(a.numpy(), want, f"{dtype} sum")
        if dtype == "float64":
            # A float32 staging would have given this instead.
            narrowed = operands(dtype, 0).astype(np.float32) + operands(dtype, 1).astype(np.float32)
            assert not np.array_equal(want[:3], narrowed[:3].astype(np.float64))

        # AVG: the sum divided by 2 before the one rounding (exact here: halving).
        a = make(operands(dtype, rank), dtype, device)
        dist.all_reduce(a, op=dist.ReduceOp.AVG)
        half = expected_sum(dtype).astype(np.float64) / 2
        if dtype != "float64":
            wide = narrow(operands(dtype, 0), dtype).astype(np.float32) + narrow(
                operands(dtype, 1), dtype
            ).astype(np.float32)
            half = narrow(wide / np.float32(2), dtype)
        same(a.numpy(), np.asarray(half, host_dtype(dtype)), f"{dtype} avg")

        # A non-compact view, reduced through a copy and written back through the view.
        base = make(np.arange(12.0).reshape(3, 4) + 0.1 * rank, dtype, device)
        view = base.permute((1, 0))[1:3, :]
        dist.all_reduce(view)
        grid = [narrow(np.arange(12.0).reshape(3, 4) + 0.1 * r, dtype) for r in range(2)]
        if dtype == "float64":
            sums = grid[0] + grid[1]
        else:
            sums = narrow(grid[0].astype(np.float32) + grid[1].astype(np.float32), dtype)
        same(view.numpy(), sums.T[1:3, :], f"{dtype} view sum")
        untouched = base.numpy()
        untouched.T[1:3, :] = 0
        kept = grid[rank].copy()
        kept.T[1:3, :] = 0
        same(untouched, kept, f"{dtype} outside the view")

        # async, AVG, on a Tensor that requires grad.
        t = ndl.Tensor(
            make(operands(dtype, rank), dtype, device), device=device, requires_grad=True
        )
        work = dist.all_reduce(t, op="avg", async_op=True)
        assert work.wait() is True
        assert t.dtype == dtype and t.is_leaf
        same(t.numpy(), np.asarray(half, host_dtype(dtype)), f"{dtype} async tensor avg")

        # broadcast: rank 1's values, specials included, bit for bit; both directions.
        for src in (0, 1):
            mine = SPECIAL + list(operands(dtype, rank))
            b = make(mine, dtype, device)
            dist.broadcast(b, src=src)
            theirs = SPECIAL + list(operands(dtype, src))
            same(b.numpy(), narrow(theirs, dtype), f"{dtype} broadcast from {src}")
        view = make(np.arange(6.0).reshape(2, 3) + 0.1 + rank, dtype, device).permute((1, 0))
        dist.broadcast(view, src=1)
        same(view.numpy(), narrow(np.arange(6.0).reshape(2, 3) + 1.1, dtype).T, f"{dtype} bview")

        # all_gather: every rank's values, specials included, into arrays and Tensors.
        for kind in ("arrays", "tensors"):
            mine = np.array(SPECIAL + list(operands(dtype, rank)))
            outs = [make(np.full(mine.shape, -1.0), dtype, device) for _ in range(size)]
            if kind == "tensors":
                outs = [ndl.Tensor(o, device=device) for o in outs]
            dist.all_gather(outs, make(mine, dtype, device))
            for r in range(size):
                assert outs[r].dtype == dtype
                theirs = np.array(SPECIAL + list(operands(dtype, r)))
                same(outs[r].numpy(), narrow(theirs, dtype), f"{dtype} all_gather {kind} {r}")
        outs = [make(np.zeros((0, 2)), dtype, device) for _ in range(size)]
        dist.all_gather(outs, make(np.zeros((0, 2)), dtype, device))
        empty = make(np.zeros((0,)), dtype, device)
        dist.all_reduce(empty)
        dist.broadcast(empty, src=1)
        ok(f"{device_name} {dtype}")

# Dtype mismatches: every rank raises, naming each rank's dtype; the group still works.
home = dist.get_device()
for mine, other in [("float32", "float16"), ("bfloat16", "float64"), ("float16", "bfloat16")]:
    dtype = mine if rank == 0 else other
    x = make([1.0, 2.0], dtype, home)
    calls = [
        ("all_reduce(sum)", lambda: dist.all_reduce(x)),
        ("broadcast(src=0)", lambda: dist.broadcast(x, src=0)),
        ("all_gather", lambda: dist.all_gather([make([0.0, 0.0], dtype, home)] * size, x)),
    ]
    for what, call in calls:
        try:
            call()
        except dist.DistributedError as e:
            text = str(e)
            assert f"rank {rank}: {what}: the ranks disagree on the dtype" in text, text
            assert f"(rank 0: {mine}, rank 1: {other})" in text, text
            assert f"rank 0 called {what} on shape (2,) {mine}" in text, text
            assert f"rank 1 called {what} on shape (2,) {other}" in text, text
        else:
            raise AssertionError(f"rank {rank}: {what}: {mine} vs {other} not caught")
ok("mismatched dtypes")

# Shape and dtype both differ: the dtypes are named, and so are the shapes.
try:
    dist.all_reduce(make(np.ones(2 + rank), ("float64", "float16")[rank], home))
except dist.DistributedError as e:
    text = str(e)
    assert "(rank 0: float64, rank 1: float16)" in text, text
    assert "on shape (2,) float64" in text and "on shape (3,) float16" in text, text
else:
    raise AssertionError("shape and dtype mismatch not caught")
# A dtype that differs only in all_gather's outputs is each rank's own ValueError.
for out_dtype in ("float16", "float64"):
    try:
        dist.all_gather([make([0.0], out_dtype, home)] * size, make([1.0], "bfloat16", home))
    except ValueError as e:
        assert f"is {out_dtype} of shape (1,)" in str(e), str(e)
        assert "expected bfloat16 of shape (1,)" in str(e), str(e)
    else:
        raise AssertionError(f"all_gather into {out_dtype} outputs accepted")
a = make([rank + 0.1, 1e-12], "float64", home)
dist.all_reduce(a)
same(a.numpy(), np.array([0.1 + 1.1, 2e-12]), "after the errors")
ok("errors")


# DDP: one bucket per dtype, each gradient averaged in its parameter's dtype and left in it.
class Model(ndl.nn.Module):
    def __init__(self, dtypes):
        super().__init__()
        self.params = [
            ndl.nn.Parameter(ndl.Tensor(np.full((3,), 1.0 + i), dtype=d, device=home))
            for i, d in enumerate(dtypes)
        ]


GRADS = {  # rank 0's and rank 1's gradient of each dtype, and their mean rounded once
    "float64": ([0.1 + 1e-12, 1.0, -2.0], [0.3 + 1e-12, 2.0**-40, 4.0]),
    "float32": ([0.5, 1.0, 2.0**-24], [0.25, 2.0**-24, 1.0]),
    "float16": ([1.0, 3.0, -0.5], [2.0**-10, 1.0, 0.25]),
    "bfloat16": ([1.0, 2.0**-7, 5.0], [2.0**-7, 1.0, -1.0]),
}
for dtypes in (["float64"], ["float16", "float64", "bfloat16"], ["float32", "float16"]):
    model = Model(dtypes)
    ddp = dist.DistributedDataParallel(model, aligned=False)
    # Reversed order; a new bucket at each dtype change; a float32 one for the flags when the
    # last is narrow (reduction order: the last parameter's first).
    want_buckets = [3] * len(dtypes) + ([0] if dtypes[0] in ("float16", "bfloat16") else [])
    assert ddp.bucket_sizes == want_buckets, (dtypes, ddp.bucket_sizes)
    # sum(p * g) has the gradient g exactly, in p's dtype: the backward averages it
    loss = None
    for p, d in zip(model.params, dtypes):
        term = (p * ndl.Tensor(np.array(GRADS[d][rank]), dtype=d, device=home)).sum()
        term = term.astype("float64")
        loss = term if loss is None else loss + term
    loss.backward()
    for p, d in zip(model.params, dtypes):
        assert p.grad.dtype == d, (d, p.grad.dtype)
        a, b = (narrow(np.array(GRADS[d][r]), d) for r in range(2))
        if d == "float64":
            want = (a + b) / 2
        else:
            want = narrow((a.astype(np.float32) + b.astype(np.float32)) / np.float32(2), d)
        same(p.grad.numpy(), want, f"ddp {dtypes} {d}")
ok("ddp dtypes")
dist.destroy_process_group()
if rank == 0:
    print("done", flush=True)
