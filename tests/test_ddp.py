"""DistributedDataParallel and the rank samplers (needle.distributed.ddp / .sampler).

The process-group cases run once, in tests/ddp_worker.py under ``mpiexec -n 2`` (one MPI start
for all of them), and are checked here from the JSON each rank writes: two ranks at batch B/2
against one process at batch B for the course's PTB transformer and LSTM in both graph modes,
in the course's loop and in the loop PyTorch code writes (``zero_grad``, ``backward``, ``step``:
the averaging happens inside ``backward()``), with SGD and Adam; ``no_sync()`` accumulation;
steps on gradients that were not averaged (refused); parameters without gradients with and
without ``find_unused_parameters``; a user's gradient hook under DDP; DDP with autocast and
GradScaler; the broadcast at wrap, several buckets and BatchNorm's running statistics. Bad
input, the compatible no-ops, ``state_dict`` and the samplers run in this process.
"""

import json
import os

import numpy as np
import pytest

import needle as ndl
import needle.distributed as dist
from needle import nn
from needle.distributed import DistributedSampler, ptb_rank_columns

from devices import DEVICES
from mpi_run import launch, needs_mpi, require_mpi

HERE = os.path.dirname(os.path.abspath(__file__))
WORKER = os.path.join(HERE, "ddp_worker.py")
EQUIVALENCE_CASES = [
    f"{loop}/{model}/{mode}"
    for loop in ("course", "torch")
    for model in ("transformer", "lstm")
    for mode in ("cycle_free", "needle")
]


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    """The two ranks' results of tests/ddp_worker.py (a list of two dicts)."""
    require_mpi()
    outdir = tmp_path_factory.mktemp("ddp")
    done, _ = launch(WORKER, str(outdir))
    assert done.returncode == 0, f"the job failed ({done.returncode}):\n{done.stdout}"
    results = []
    for rank in (0, 1):
        with open(os.path.join(outdir, f"rank{rank}.json")) as f:
            results.append(json.load(f))
    assert [r["world_size"] for r in results] == [2, 2]
    return results


def _arrays(params):
    return [np.asarray(p, dtype=np.float32) for p in params]


@pytest.mark.parametrize("case", EQUIVALENCE_CASES)
def test_two_ranks_train_like_one_process(ranks, case):
    r0, r1 = ranks[0][case], ranks[1][case]
    # the replicas stay identical: same averaged gradients, same updates (rank 1 was built from
    # another seed, so this also shows the wrap's broadcast)
    for a, b in zip(_arrays(r0["params"]), _arrays(r1["params"])):
        np.testing.assert_array_equal(a, b)
    for ref, got in zip(_arrays(r0["ref_params"]), _arrays(r0["params"])):
        np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5)
    # each rank's loss is the mean over its half of the batch: their mean is the batch's
    step_losses = (np.asarray(r0["losses"]) + np.asarray(r1["losses"])) / 2
    np.testing.assert_allclose(step_losses, r0["ref_losses"], rtol=1e-5)
    assert not np.allclose(r0["losses"], r1["losses"])  # the ranks did see different data
    # one averaging per backward, inside it: nothing else was called
    assert r0["reductions"] == r1["reductions"] == len(r0["losses"])
    if case.startswith("course/"):
        # epoch_general_ptb's figures cover both ranks' tokens
        for r in (r0, r1):
            assert r["loss"] == pytest.approx(r0["ref_loss"], rel=1e-5)
            assert r["acc"] == pytest.approx(r0["ref_acc"], abs=1e-9)


def test_bucket_layout(ranks):
    for case in EQUIVALENCE_CASES:
        got = ranks[0][case]
        assert sum(got["buckets"]) == got["grad_elements"]
        assert got["buckets"] == ranks[1][case]["buckets"]
    # a tiny bucket_cap_mb splits the model; 25 MiB holds it whole
    assert len(ranks[0]["course/transformer/needle"]["buckets"]) > 3
    assert len(ranks[0]["course/lstm/cycle_free"]["buckets"]) > 3
    assert len(ranks[0]["course/transformer/cycle_free"]["buckets"]) == 1


def test_no_sync_accumulation_equals_one_process(ranks):
    """Two micro-batches a step, the first under no_sync(): one process accumulating the two
    micro-batches at twice the size trains the same parameters (SGD and Adam)."""
    for optimizer in ("sgd", "adam"):
        r0, r1 = ranks[0]["no_sync"][optimizer], ranks[1]["no_sync"][optimizer]
        for a, b in zip(_arrays(r0["params"]), _arrays(r1["params"])):
            np.testing.assert_array_equal(a, b)
        for ref, got in zip(_arrays(r0["ref_params"]), _arrays(r0["params"])):
            np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5)
    # one averaging per step: the backward under no_sync() ran none
    assert ranks[0]["no_sync"]["reductions"] == 3


def test_steps_on_unaveraged_gradients_are_refused(ranks):
    for r in ranks:
        got = r["unaveraged"]
        for key in ("after_no_sync", "clip_after_no_sync"):
            assert got[key].startswith(
                "RuntimeError: DistributedDataParallel: the gradients "
                "were accumulated under no_sync() and never averaged"
            )
        assert got["unchanged_1"] and got["unchanged_2"]
        assert got["backward_error"] == "ValueError: a hook failed"
        assert "a backward did not finish averaging the gradients" in got["after_raise"]
        assert got["complete"] is None and got["after_reset"] is None
    assert ranks[0]["unaveraged"]["params"] == ranks[1]["unaveraged"]["params"]


def test_unused_parameters_without_find_unused_raise_on_every_rank(ranks):
    for r in ranks:
        got = r["unused"]
        assert got["error"].startswith(
            "RuntimeError: DistributedDataParallel: the backward gave no gradient to 2 "
            "parameter(s) (#4 (3, 2), #5 (1, 2))"
        )
        assert "find_unused_parameters=True" in got["error"]
        assert "the gradients were not averaged" in got["step_error"]
        assert got["after"] == [2.0, 2.0, 2.0]  # the group still works


def test_a_gradient_hook_under_ddp(ranks):
    for r in ranks:
        got = r["hooks"]
        plain, hooked = np.asarray(got["plain"]), np.asarray(got["hooked"])
        np.testing.assert_allclose(hooked, 3 * plain, rtol=1e-6)
        np.testing.assert_array_equal(got["removed"], plain)
        assert not np.allclose(got["local"], plain)  # the rank's own gradient was averaged
    np.testing.assert_array_equal(ranks[0]["hooks"]["plain"], ranks[1]["hooks"]["plain"])


def test_autocast_and_grad_scaler_under_ddp(ranks):
    """Against one process over the same half-batches (bfloat16 rounds per half there too)."""
    r0, r1 = ranks[0]["autocast"], ranks[1]["autocast"]
    assert r0["scale"] == r1["scale"] == r0["ref_scale"] == 1024.0
    for a, b in zip(_arrays(r0["params"]), _arrays(r1["params"])):
        np.testing.assert_array_equal(a, b)
    for ref, got in zip(_arrays(r0["ref_params"]), _arrays(r0["params"])):
        np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-6)


# -- in this process: bad input and samplers ---------------------------------------------------


@needs_mpi
def test_ddp_bad_input_and_the_compatible_no_ops():
    dist.init_process_group(timeout=30)
    try:
        for name in ("aligned", "broadcast_buffers", "find_unused_parameters"):
            with pytest.raises(TypeError, match=name):
                dist.DistributedDataParallel(nn.Linear(2, 2), **{name: 1})
        model = nn.Linear(3, 2)
        ddp = dist.DistributedDataParallel(model, aligned=False)
        opt = ndl.optim.SGD(ddp.parameters(), lr=0.1)
        assert ddp.wrap_optimizer(opt) is opt and ddp.sync_gradients() is None
        assert ddp.module is model and ddp.parameters() == model.parameters()
        x = ndl.Tensor(np.ones((4, 3), np.float32))
        ddp(x).sum().backward()
        grads = [p.grad.numpy().copy() for p in model.parameters()]
        ddp.sync_gradients()  # the averaging happened in backward: nothing changes
        for p, g in zip(model.parameters(), grads):
            np.testing.assert_array_equal(p.grad.numpy(), g)
        assert ddp.reduction_stats["reductions"] == 1
        # a backward outside any DDP forward still averages (the hooks are the parameters')
        model(x).sum().backward()
        assert ddp.reduction_stats["reductions"] == 2
        # a dropped wrapper stops averaging: its hooks hold it weakly
        del ddp, opt
        import gc

        gc.collect()
        model.weight.grad = None
        model(x).sum().backward()
        np.testing.assert_array_equal(model.weight.grad.numpy(), grads[0])
    finally:
        dist.destroy_process_group()


def test_ddp_bad_input():
    with pytest.raises(TypeError, match="nn.Module"):
        dist.DistributedDataParallel(object())
    with pytest.raises(ValueError, match="bucket_cap_mb"):
        dist.DistributedDataParallel(nn.Linear(2, 2), bucket_cap_mb=0)
    with pytest.raises(TypeError, match="bucket_cap_mb"):
        dist.DistributedDataParallel(nn.Linear(2, 2), bucket_cap_mb="25")


def test_ddp_needs_a_process_group():
    if dist.is_initialized():
        pytest.skip("a process group is up in this process")
    with pytest.raises(dist.DistributedError, match="init_process_group"):
        dist.DistributedDataParallel(nn.Linear(2, 2), aligned=False)
    assert nn.DistributedDataParallel is dist.DistributedDataParallel


def test_ptb_rank_columns_split_the_batch():
    batches = ndl.data.batchify(list(range(60)), 6, None, "float32")  # (10, 6)
    parts = [ptb_rank_columns(batches, rank=r, world_size=3) for r in range(3)]
    assert all(p.shape == (10, 2) and p.flags["C_CONTIGUOUS"] for p in parts)
    np.testing.assert_array_equal(np.concatenate(parts, axis=1), batches)
    np.testing.assert_array_equal(parts[1], batches[:, 2:4])


@pytest.mark.parametrize(
    "kwargs, error",
    [
        (dict(rank=0, world_size=4), ValueError),  # 6 columns over 4 ranks
        (dict(rank=2, world_size=2), ValueError),
        (dict(rank=-1, world_size=2), ValueError),
        (dict(rank=0, world_size=0), ValueError),
        (dict(rank=0.5, world_size=2), TypeError),
    ],
)
def test_ptb_rank_columns_bad_input(kwargs, error):
    batches = np.zeros((5, 6), dtype=np.float32)
    with pytest.raises(error):
        ptb_rank_columns(batches, **kwargs)


def test_ptb_rank_columns_needs_2d():
    with pytest.raises(ValueError, match="shape"):
        ptb_rank_columns(np.zeros(12, dtype=np.float32), rank=0, world_size=2)


def test_distributed_sampler_pads_and_drops():
    data = list(range(10))
    padded = [list(DistributedSampler(data, 3, r, shuffle=False)) for r in range(3)]
    assert padded == [[0, 3, 6, 9], [1, 4, 7, 0], [2, 5, 8, 1]]
    dropped = [
        list(DistributedSampler(data, 3, r, shuffle=False, drop_last=True)) for r in range(3)
    ]
    assert dropped == [[0, 3, 6], [1, 4, 7], [2, 5, 8]]
    assert len(DistributedSampler(data, 3, 0, drop_last=True)) == 3


def test_distributed_sampler_shuffles_alike_on_every_rank():
    data = list(range(17))
    samplers = [DistributedSampler(data, 2, r, seed=5, drop_last=True) for r in range(2)]
    first = [list(s) for s in samplers]
    assert sorted(first[0] + first[1]) == sorted(
        np.random.default_rng(5).permutation(17)[:16].tolist()
    )
    assert not set(first[0]) & set(first[1])
    for s in samplers:
        s.set_epoch(1)
    second = [list(s) for s in samplers]
    assert second != first
    assert not set(second[0]) & set(second[1])


def test_distributed_sampler_subset_feeds_the_dataloader():
    xs = np.arange(12, dtype=np.float32).reshape(6, 2)
    dataset = ndl.data.NDArrayDataset(xs)
    sampler = DistributedSampler(dataset, 2, 1, shuffle=False)
    loader = ndl.data.DataLoader(sampler.subset(), batch_size=3)
    (batch,) = next(iter(loader))
    np.testing.assert_array_equal(batch.numpy(), xs[[1, 3, 5]])


def test_distributed_sampler_bad_input():
    with pytest.raises(ValueError, match="empty"):
        DistributedSampler([], 2, 0)
    with pytest.raises(ValueError):
        DistributedSampler([1, 2], 2, 2)
    with pytest.raises(TypeError):
        DistributedSampler([1, 2], 2, 0, seed=1.5)


@needs_mpi
@pytest.mark.parametrize("device", DEVICES)
def test_ddp_in_a_group_of_one_on_every_device(device):
    """The whole path on the device (buckets, the all-reduce through the staging, the views
    handed back as .grad) in a group of one in this process: the gradients are unchanged and
    live on the device; aligned=True takes Python's collector over until destroy."""
    import gc

    dist.init_process_group(timeout=30)
    try:
        np.random.seed(0)
        model = nn.Sequential(
            nn.Linear(5, 4, device=device), nn.ReLU(), nn.Linear(4, 3, device=device)
        )
        x = ndl.Tensor(np.random.randn(6, 5).astype(np.float32), device=device)
        model(x).sum().backward()
        plain = [p.grad.numpy() for p in model.parameters()]
        for p in model.parameters():
            p.grad = None
        ddp = dist.DistributedDataParallel(model, bucket_cap_mb=64 / 2**20)  # several buckets
        assert not gc.isenabled()
        ddp(x).sum().backward()
        for p, expected in zip(model.parameters(), plain):
            assert p.grad.device == device
            np.testing.assert_allclose(p.grad.numpy(), expected, rtol=1e-6)
    finally:
        dist.destroy_process_group()
    assert gc.isenabled()
