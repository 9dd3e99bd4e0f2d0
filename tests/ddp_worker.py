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
import needle.distributed.ddp as ddp_module
from needle import nn, optim
from needle.apps.models import LanguageModel
from needle.apps.simple_ml import epoch_general_ptb

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


def _train(model, data, optimizer):
    losses = []
    if optimizer == "adam":
        opt = optim.Adam(model.parameters(), lr=0.01)
    else:
        opt = optim.SGD(model.parameters(), lr=1.0, momentum=0.5)
    acc, loss = epoch_general_ptb(
        data,
        model,
        seq_len=SEQ_LEN,
        opt=opt,
        clip=0.5,
        progress=lambda step, batch_loss, allocated: losses.append(batch_loss),
    )
    return acc, loss, losses


def _params(module):
    return [p.numpy().tolist() for p in module.parameters()]


def equivalence(rank, seq_model, mode, bucket_mb, optimizer):
    """Two ranks at batch B/2 against one process at batch B (both on this rank).

    The transformer trains with SGD: its key LayerNorm's bias has a gradient that is zero but
    for rounding (softmax ignores a shift shared by all keys), which Adam would blow up to
    steps of size lr whose sign is the rounding's, in one process as in two."""
    data = _corpus()
    with ndl.autograd.graph_mode(mode):
        reference = _model(seq_model, seed=0)
        ref_acc, ref_loss, ref_losses = _train(reference, data, optimizer)
        # rank 1 starts from other parameters: the wrap's broadcast must make them rank 0's
        local = _model(seq_model, seed=rank)
        ddp = dist.DistributedDataParallel(local, bucket_cap_mb=bucket_mb)
        acc, loss, losses = _train(ddp, dist.ptb_rank_columns(data), optimizer)
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
    ddp = dist.DistributedDataParallel(model, bucket_cap_mb=TINY_BUCKET_MB)
    x = ndl.Tensor(np.full((4, 3), rank + 1.0, dtype=np.float32))
    ddp(x).sum().backward()
    local_rank0_grad = (
        model.rank0_only.weight.grad.numpy().tolist() if model.rank0_only.weight.grad else None
    )
    ddp.sync_gradients()
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
    try:
        np.random.seed(11)
        model = nn.Linear(3, 2)
        ddp = dist.DistributedDataParallel(model, bucket_cap_mb=TINY_BUCKET_MB / 16, aligned=True)
        x = ndl.Tensor(np.full((1, 3), rank + 1.0, dtype=np.float32))
        ddp(x).sum().backward()
        ddp.sync_gradients()
    finally:
        ddp_module._alignment = saved
    return {
        "enabled": fake.enabled,
        "agreed": fake.agreed_with,
        "weight_grad": model.weight.grad.numpy().tolist(),
        "buckets": ddp.bucket_sizes,
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
    for seq_model, mode, bucket_mb, optimizer in cases:
        results[f"{seq_model}/{mode}"] = equivalence(rank, seq_model, mode, bucket_mb, optimizer)
    results["partial"] = partial_grads(rank)
    results["buffers"] = buffers(rank)
    results["aligned"] = aligned_flags(rank)
    dist.barrier()
    dist.destroy_process_group()
    with open(os.path.join(outdir, f"rank{rank}.json"), "w") as f:
        json.dump(results, f)


if __name__ == "__main__":
    main(sys.argv[1])
