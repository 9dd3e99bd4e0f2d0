"""Out of memory in the middle of a training step, 100 times: each time the step
raises needle.OutOfMemoryError at a different allocation, the process drops the
step, allocated bytes return to the baseline, and the next step (limit lifted)
trains exactly as if nothing had happened."""

import gc

import numpy as np
import pytest

import needle as ndl
from needle import memory


def _model(seed):
    np.random.seed(seed)
    return ndl.nn.Sequential(ndl.nn.Linear(32, 64), ndl.nn.Tanh(), ndl.nn.Linear(64, 10))


def _step(model, opt, x, y):
    loss = ndl.nn.SoftmaxLoss()(model(x), y)
    opt.reset_grad()
    loss.backward()
    opt.step()
    return float(loss.numpy()[0])


@pytest.mark.parametrize("mode", ndl.autograd.GRAPH_MODES)
def test_a_hundred_out_of_memory_errors_inside_a_step_recover(mode):
    rng = np.random.default_rng(0)
    x = ndl.Tensor(rng.standard_normal((128, 32)).astype(np.float32), requires_grad=False)
    y = ndl.Tensor(rng.integers(0, 10, 128).astype(np.float32), requires_grad=False)
    reference, model = _model(0), _model(0)
    ref_opt = ndl.optim.SGD(reference.parameters(), lr=0.1)
    opt = ndl.optim.SGD(model.parameters(), lr=0.1)
    gc.collect()
    with ndl.autograd.graph_mode(mode):
        baseline = memory.memory_allocated("cpu")
        # One undisturbed step measures how far a step climbs above the baseline.
        memory.reset_peak_memory_stats("cpu")
        expected = [_step(reference, ref_opt, x, y)]
        climb = memory.max_memory_allocated("cpu") - baseline
        got = [_step(model, opt, x, y)]
        opt.reset_grad()
        gc.collect()
        # After a step: the parameters and the optimizer's state, no gradients.
        baseline = memory.memory_allocated("cpu")
        failures = 0
        try:
            for i in range(100):
                # A limit somewhere in the first half of the step's climb: it fails part way
                # (higher up, in "needle" mode, the out-of-memory collection can free enough).
                room = int(climb * (i + 1) / 210)
                memory.empty_cache("cpu")  # the limit counts reserved bytes, cache included
                memory.set_memory_limit("cpu", memory.memory_reserved("cpu") + room)
                with pytest.raises(ndl.OutOfMemoryError):
                    params = [p.numpy() for p in model.parameters()]
                    loss = ndl.nn.SoftmaxLoss()(model(x), y)
                    loss.backward()
                failures += 1
                memory.set_memory_limit("cpu", None)
                loss = None
                for p, before in zip(model.parameters(), params):
                    p.grad = None
                    np.testing.assert_array_equal(p.numpy(), before)
                gc.collect()
                assert memory.memory_allocated("cpu") == baseline, i
        finally:
            memory.set_memory_limit("cpu", None)
        assert failures == 100
        for _ in range(3):
            expected.append(_step(reference, ref_opt, x, y))
            got.append(_step(model, opt, x, y))
    np.testing.assert_allclose(got, expected, rtol=1e-6)
    for p, q in zip(model.parameters(), reference.parameters()):
        np.testing.assert_allclose(p.numpy(), q.numpy(), rtol=1e-6)
