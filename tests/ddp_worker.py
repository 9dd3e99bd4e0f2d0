"""Run by tests/test_ddp.py under ``mpiexec -n 2``: every DistributedDataParallel case that needs
a process group, in one MPI start. Each rank writes what it saw to ``OUTDIR/rank<r>.json``;
the test compares the ranks with each other and with the one-process reference that each rank
trains locally (no collectives) at the full batch.

Usage: python tests/ddp_worker.py OUTDIR
"""

import json
import os
import sys

import numpy as np

import needle as ndl
import needle.distributed as dist
import needle.distributed._reducer as reducer_module
import needle.distributed.ddp as ddp_module
from needle import nn, optim
from needle.apps.models import LanguageModel
from needle.apps.simple_ml import epoch_general_ptb
from needle.data import get_batch

# Small sizes: the course's model shapes (course_config.COURSE) scaled down for a quick test.
VOCAB, EMBED, HIDDEN, SEQ_LEN, BATCH, STEPS = 40, 8, 12, 5, 8, 3
# bucket_cap_mb small enough that the models' parameters span several buckets
TINY_BUCKET_MB = 256 / (1024 * 1024)


def _corpus():
    rng = np.random.default_rng(1)
    rows = STEPS * SEQ_LEN + 1
    return rng.integers(0, VOCAB, size=(rows, BATCH)).astype(np.float32)


def _model(seq_model, seed):
    np.random.seed(seed)
    return LanguageModel(EMBED, VOCAB, HIDDEN, num_layers=1, seq_model=seq_model, seq_len=SEQ_LEN)


def _optimizer(model, optimizer, sgd_lr=1.0):
    if optimizer == "adam":
        return optim.Adam(model.parameters(), lr=0.01)
    return optim.SGD(model.parameters(), lr=sgd_lr, momentum=0.5)


def _train(model, data, optimizer, loop):
    """``loop`` "course": epoch_general_ptb; "torch": the loop PyTorch code writes (forward,
    loss, ``opt.zero_grad()``, ``loss.backward()``, ``opt.step()``), with nothing else for
    DDP. Returns (acc, loss, the step losses); the torch loop's acc and loss are its last
    step's loss."""
    # the course loop clips at 0.5, which lr 1.0 needs; the torch loop has no clipping
    opt = _optimizer(model, optimizer, sgd_lr=1.0 if loop == "course" else 0.1)
    losses = []
    if loop == "course":
        acc, loss = epoch_general_ptb(
            data,
            model,
            seq_len=SEQ_LEN,
            opt=opt,
            clip=0.5,
            progress=lambda step, batch_loss, allocated: losses.append(batch_loss),
        )
        return acc, loss, losses
    model.train()
    loss_fn = nn.SoftmaxLoss()
    h = None
    for i in range(0, data.shape[0] - 1, SEQ_LEN):
        X, y = get_batch(data, i, SEQ_LEN)
        h = tuple(t.detach() for t in h) if isinstance(h, tuple) else h and h.detach()
        logits, h = model(X, h)
        loss = loss_fn(logits, y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss.numpy().reshape(-1)[0]))
    return 0.0, losses[-1], losses


def _params(module):
    return [p.numpy().tolist() for p in module.parameters()]


def equivalence(rank, seq_model, mode, bucket_mb, optimizer, loop):
    """Two ranks at batch B/2 against one process at batch B (both on this rank).

    The transformer trains with SGD: its key LayerNorm's bias has a gradient that is zero but
    for rounding (softmax ignores a shift shared by all keys), which Adam would blow up to
    steps of size lr whose sign is the rounding's, in one process as in two."""
    data = _corpus()
    with ndl.autograd.graph_mode(mode):
        reference = _model(seq_model, seed=0)
        ref_acc, ref_loss, ref_losses = _train(reference, data, optimizer, loop)
        # rank 1 starts from other parameters: the wrap's broadcast must make them rank 0's
        local = _model(seq_model, seed=rank)
        ddp = dist.DistributedDataParallel(local, bucket_cap_mb=bucket_mb)
        acc, loss, losses = _train(ddp, dist.ptb_rank_columns(data), optimizer, loop)
        reductions = ddp.reduction_stats["reductions"]
    return {
        "ref_acc": ref_acc,
        "ref_loss": ref_loss,
        "ref_losses": ref_losses,
        "ref_params": _params(reference),
        "acc": acc,
        "loss": loss,
        "losses": losses,
        "params": _params(local),
        "buckets": ddp.bucket_sizes,
        "grad_elements": sum(int(np.prod(p.shape)) for p in local.parameters()),
        "reductions": reductions,
    }


class _Partial(nn.Module):
    """``used`` always gets a gradient; ``rank0_only`` only on rank 0; ``unused`` never;
    ``frozen`` does not require grad."""

    def __init__(self, rank):
        super().__init__()
        self.used = nn.Linear(3, 2)
        self.rank0_only = nn.Linear(3, 2)
        self.unused = nn.Linear(3, 2)
        self.frozen = nn.Linear(3, 2, bias=False)
        self.frozen.weight.requires_grad = False
        self.rank = rank

    def forward(self, x):
        out = self.used(x) + self.frozen(x)
        if self.rank == 0:
            out = out + self.rank0_only(x)
        return out


def partial_grads(rank):
    """Parameters without a gradient on some or all ranks, and a frozen one."""
    np.random.seed(7)
    model = _Partial(rank)
    ddp = dist.DistributedDataParallel(
        model, bucket_cap_mb=TINY_BUCKET_MB, find_unused_parameters=True
    )
    x = ndl.Tensor(np.full((4, 3), rank + 1.0, dtype=np.float32))
    # rank 0's own gradient of rank0_only, without DDP (a copy of the model, no hooks)
    local_rank0_grad = None
    if rank == 0:
        copy = _Partial(rank)
        copy.rank0_only.weight.data = model.rank0_only.weight.data
        copy.used.weight.data = model.used.weight.data
        copy.frozen.weight.data = model.frozen.weight.data
        copy(x).sum().backward()
        local_rank0_grad = copy.rank0_only.weight.grad.numpy().tolist()
    ddp(x).sum().backward()
    grads = {
        name: (None if p.grad is None else p.grad.numpy().tolist())
        for name, p in (
            ("used_weight", model.used.weight),
            ("rank0_only_weight", model.rank0_only.weight),
            ("unused_weight", model.unused.weight),
            ("frozen_weight", model.frozen.weight),
        )
    }
    return {
        "grads": grads,
        "local_rank0_grad": local_rank0_grad,
        "buckets": ddp.bucket_sizes,
    }


def buffers(rank):
    """BatchNorm's running statistics follow rank 0 at the wrap and at each training forward."""
    np.random.seed(3)
    bn = nn.BatchNorm1d(4)
    bn.running_mean = ndl.Tensor(np.full(4, float(rank + 1), dtype=np.float32))
    ddp = dist.DistributedDataParallel(bn, aligned=False)
    at_wrap = bn.running_mean.numpy().tolist()
    x = ndl.Tensor(np.arange(8, dtype=np.float32).reshape(2, 4) * (rank + 1))
    ddp(x)
    with ndl.no_grad():  # training mode: still broadcasts rank 0's statistics first
        ddp(x)
    return {"at_wrap": at_wrap, "after": bn.running_mean.numpy().tolist()}


class _FakeAlignment:
    """Stands in for needle.memory.alignment (num_wants / local_wants / agreed / enable) to
    check what DDP carries: rank 1 wants the first collection, both ranks the second."""

    def __init__(self, rank):
        self.rank = rank
        self.agreed_with = []
        self.enabled = None

    def enable(self, on):
        self.enabled = bool(on)

    def num_wants(self, world_size):
        return 2

    def local_wants(self, rank, world_size):
        assert (rank, world_size) == (self.rank, 2)
        return np.array([float(rank == 1), 1.0], dtype=np.float32)

    def agreed(self, summed):
        self.agreed_with.append(np.asarray(summed).tolist())


def aligned_flags(rank):
    """The wants ride in the last bucket: summed over the ranks, beside averaged gradients."""
    fake = _FakeAlignment(rank)
    saved, ddp_module._alignment = ddp_module._alignment, fake
    reducer_module._alignment = fake
    try:
        np.random.seed(11)
        model = nn.Linear(3, 2)
        ddp = dist.DistributedDataParallel(model, bucket_cap_mb=TINY_BUCKET_MB / 16, aligned=True)
        x = ndl.Tensor(np.full((1, 3), rank + 1.0, dtype=np.float32))
        ddp(x).sum().backward()
    finally:
        ddp_module._alignment = reducer_module._alignment = saved
    return {
        "enabled": fake.enabled,
        "agreed": fake.agreed_with,
        "weight_grad": model.weight.grad.numpy().tolist(),
        "buckets": ddp.bucket_sizes,
    }


def _mlp(seed, dtype="float32"):
    np.random.seed(seed)
    return nn.Sequential(nn.Linear(6, 5, dtype=dtype), nn.ReLU(), nn.Linear(5, 4, dtype=dtype))


def _rows(seed, n, dtype=np.float32):
    return np.random.default_rng(seed).normal(size=(n, 6)).astype(dtype)


def _mlp_loss(model, x):
    # mean over rows of a per-row score: a micro-batch's loss as a data loader would give it
    return (model(ndl.Tensor(x)) ** 2).sum() / x.shape[0]


def no_sync_accumulation(rank):
    """Two micro-batches per step, the first under no_sync(): equal to one process
    accumulating two micro-batches of twice the size (the ranks' halves together)."""
    out = {}
    for optimizer in ("sgd", "adam"):
        ref = _mlp(0)
        ref_opt = _optimizer(ref, optimizer, sgd_lr=0.05)
        model = _mlp(rank)  # rank 1 starts elsewhere: the wrap broadcasts rank 0's
        ddp = dist.DistributedDataParallel(model, bucket_cap_mb=TINY_BUCKET_MB)
        opt = _optimizer(ddp, optimizer, sgd_lr=0.05)
        for step in range(3):
            micro = [_rows(10 * step + k, 8) for k in range(2)]  # each: both ranks' rows
            ref_opt.zero_grad()
            for x in micro:
                _mlp_loss(ref, x).backward()
            ref_opt.step()
            opt.zero_grad()
            with ddp.no_sync():
                _mlp_loss(ddp, micro[0][rank::2]).backward()
            _mlp_loss(ddp, micro[1][rank::2]).backward()
            opt.step()
        out[optimizer] = {"params": _params(model), "ref_params": _params(ref)}
    out["reductions"] = ddp.reduction_stats["reductions"]
    return out


def _error(fn):
    try:
        fn()
    except Exception as e:  # the test checks the type and the message
        return f"{type(e).__name__}: {e}"
    return None


def unaveraged_steps(rank):
    """Steps on gradients that were not averaged are refused, and the parameters stay as they
    were; after zero_grad and a complete backward training goes on."""
    model = _mlp(3)
    ddp = dist.DistributedDataParallel(model)
    opt = optim.SGD(ddp.parameters(), lr=0.1)
    x = _rows(rank, 4)
    before = _params(model)
    out = {}
    # 1. a backward under no_sync(), then step()
    with ddp.no_sync():
        _mlp_loss(ddp, x).backward()
    out["after_no_sync"] = _error(opt.step)
    out["clip_after_no_sync"] = _error(lambda: opt.clip_grad_norm(1.0))
    out["unchanged_1"] = _params(model) == before
    # 2. a backward that raised in a hook (on every rank) before its averaging finished
    opt.zero_grad()
    handle = model.modules[0].weight.register_hook(_raise)
    out["backward_error"] = _error(lambda: _mlp_loss(ddp, x).backward())
    handle.remove()
    out["after_raise"] = _error(opt.step)
    out["unchanged_2"] = _params(model) == before
    # 3. zero_grad and a complete backward: trains, identically on both ranks
    opt.zero_grad()
    _mlp_loss(ddp, x).backward()
    out["complete"] = _error(opt.step)
    out["params"] = _params(model)
    # 4. the course's reset_grad after no_sync drops the local sum: a step has nothing to refuse
    with ddp.no_sync():
        _mlp_loss(ddp, x).backward()
    opt.reset_grad()
    out["after_reset"] = _error(opt.step)
    return out


def _raise(grad):
    raise ValueError("a hook failed")


def unused_parameters(rank):
    """Without find_unused_parameters, a parameter that gets no gradient makes backward raise
    on every rank (naming it), and the group stays usable."""
    model = _Partial(0)  # rank0_only is used on both ranks here; unused is not
    ddp = dist.DistributedDataParallel(model, bucket_cap_mb=TINY_BUCKET_MB)
    x = ndl.Tensor(np.ones((2, 3), dtype=np.float32))
    error = _error(lambda: ddp(x).sum().backward())
    opt = optim.SGD(ddp.parameters(), lr=0.1)
    step_error = _error(opt.step)
    ones = ndl.NDArray(np.ones(3, np.float32))
    dist.all_reduce(ones)  # the group still works
    return {"error": error, "step_error": step_error, "after": ones.numpy().tolist()}


def gradient_hooks(rank):
    """A user's hook on a parameter of a DDP model changes the gradient before the averaging;
    removed, it no longer does."""
    model = _mlp(5)
    ddp = dist.DistributedDataParallel(model)
    weight = model.modules[0].weight
    x = _rows(rank, 4)
    _mlp_loss(ddp, x).backward()
    plain = weight.grad.numpy().tolist()
    weight.grad = None
    handle = weight.register_hook(lambda g: g * 3.0)
    _mlp_loss(ddp, x).backward()
    hooked = weight.grad.numpy().tolist()
    handle.remove()
    weight.grad = None
    _mlp_loss(ddp, x).backward()
    removed = weight.grad.numpy().tolist()
    # the reference: both ranks' rows in one process, no DDP
    ref = _mlp(5)
    _mlp_loss(ref, x).backward()  # this rank's rows alone, to show the averaging happened
    return {
        "plain": plain,
        "hooked": hooked,
        "removed": removed,
        "local": ref.modules[0].weight.grad.numpy().tolist(),
    }


def autocast_scaler(rank):
    """DDP + autocast(bfloat16) + GradScaler on two ranks against one process over the same
    rows: each step's two halves run apart there too (forward and backward in bfloat16 round
    per half), their gradients accumulated, as the two ranks' are averaged."""

    def run(model, steps):
        opt = optim.SGD(model.parameters(), lr=0.05, momentum=0.5)
        scaler = ndl.amp.GradScaler(init_scale=2.0**10)
        for halves in steps:
            opt.zero_grad()
            for x in halves:
                with ndl.autocast("cpu", dtype="bfloat16"):
                    # one process: each half is half of the batch's loss
                    loss = _mlp_loss(model, x) / (2 if len(halves) == 2 else 1)
                scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
        return scaler.get_scale()

    batches = [_rows(20 + k, 8) for k in range(3)]
    ref = _mlp(9)
    ref_scale = run(ref, [(b[0::2], b[1::2]) for b in batches])
    model = _mlp(9 + rank)
    ddp = dist.DistributedDataParallel(model)
    scale = run(ddp, [(b[rank::2],) for b in batches])
    return {
        "params": _params(model),
        "ref_params": _params(ref),
        "scale": scale,
        "ref_scale": ref_scale,
    }


def main(outdir):
    dist.init_process_group(backend="mpi")
    rank = dist.get_rank()
    results = {"world_size": dist.get_world_size()}
    cases = [
        ("transformer", "cycle_free", 25, "sgd"),
        ("transformer", "needle", TINY_BUCKET_MB, "sgd"),
        ("lstm", "cycle_free", TINY_BUCKET_MB, "adam"),
        ("lstm", "needle", 25, "adam"),
    ]
    for loop in ("course", "torch"):
        for seq_model, mode, bucket_mb, optimizer in cases:
            results[f"{loop}/{seq_model}/{mode}"] = equivalence(
                rank, seq_model, mode, bucket_mb, optimizer, loop
            )
    results["partial"] = partial_grads(rank)
    results["no_sync"] = no_sync_accumulation(rank)
    results["unaveraged"] = unaveraged_steps(rank)
    results["unused"] = unused_parameters(rank)
    results["hooks"] = gradient_hooks(rank)
    results["autocast"] = autocast_scaler(rank)
    results["buffers"] = buffers(rank)
    results["aligned"] = aligned_flags(rank)
    dist.barrier()
    dist.destroy_process_group()
    with open(os.path.join(outdir, f"rank{rank}.json"), "w") as f:
        json.dump(results, f)


if __name__ == "__main__":
    main(sys.argv[1])
