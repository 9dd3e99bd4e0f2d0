"""Tests for ``needle.optim.Adam(capturable=True)`` (PyTorch's flag, for CUDA graphs): the
step counter and the learning rate live in device memory ([t, lr], float64, one array per
device), ``step()`` queues only device work that reads them, and each parameter is updated
in place. Capturable and non-capturable steps must give the same bits (the same formula,
the same double arithmetic for the bias corrections on the host and in the kernel), with
weight decay, mixed dtypes, strided parameters and a learning rate changed mid-run; on
CUDA a captured step replayed N times must equal N eager steps bit for bit, and a
non-capturable step inside a capture is refused (needle.DeviceError naming capturable=True)
with the capture abandoned cleanly. Bad input raises TypeError / ValueError.
"""

import numpy as np
import pytest

import needle as ndl
import needle_c

from cuda_check import cuda_test
from devices import DEVICES

# (3, 300): more than one block of ND_CUDA_THREADS on a GPU (each computes the coefficients).
SHAPES = [(4, 3), (5,), (2, 3, 2), (3, 300)]


def _params(device, seed, dtype="float32", shapes=SHAPES):
    rng = np.random.default_rng(seed)
    return [
        ndl.Tensor(
            rng.standard_normal(s).astype(dtype), device=device, dtype=dtype, requires_grad=True
        )
        for s in shapes
    ]


def _grads(rng, params):
    """One gradient per parameter, of its shape, dtype and device."""
    return [
        ndl.Tensor(rng.standard_normal(p.shape).astype(p.dtype), device=p.device, dtype=p.dtype)
        for p in params
    ]


def _run(device, capturable, dtype, steps=5, wd=0.0, lr_change=None, seed=0):
    """Adam over `steps` steps of seeded gradients; lr_change=(step, lr) sets opt.lr before
    that step. Returns the parameters' and moments' values and the optimizer."""
    params = _params(device, seed, dtype)
    opt = ndl.optim.Adam(params, lr=0.1, weight_decay=wd, capturable=capturable)
    rng = np.random.default_rng(seed + 100)
    for i in range(steps):
        for p, g in zip(params, _grads(rng, params)):
            p.grad = g
        if lr_change is not None and i == lr_change[0]:
            opt.lr = lr_change[1]
        opt.step()
    values = [(p.numpy(), opt.m[p].numpy(), opt.v[p].numpy()) for p in params]
    return values, opt


def _assert_bit_equal(a, b):
    for x, y in zip(a, b):
        for u, w in zip(x, y):
            np.testing.assert_array_equal(np.asarray(u, np.float64), np.asarray(w, np.float64))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", ["float32", "float16", "float64"])
@pytest.mark.parametrize("wd", [0.0, 0.01])
def test_capturable_equals_non_capturable_bit_for_bit(device, dtype, wd):
    plain, opt_plain = _run(device, False, dtype, wd=wd)
    cap, opt_cap = _run(device, True, dtype, wd=wd)
    _assert_bit_equal(plain, cap)
    assert opt_plain.t == opt_cap.t == 5
    assert opt_cap.capturable and not opt_plain.capturable
    # The parameters moved: the comparison is not of two untouched copies.
    start = [p.numpy() for p in _params(device, 0, dtype)]
    assert all(not np.array_equal(s, c[0]) for s, c in zip(start, cap))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_learning_rate_changed_mid_run(device, dtype):
    plain, _ = _run(device, False, dtype, lr_change=(2, 0.03))
    cap, opt = _run(device, True, dtype, lr_change=(2, 0.03))
    _assert_bit_equal(plain, cap)
    assert opt.lr == 0.03
    # The new lr reached the device: without the change the run ends elsewhere.
    unchanged, _ = _run(device, True, dtype)
    assert not np.array_equal(unchanged[0][0], cap[0][0])


@pytest.mark.parametrize("device", DEVICES)
def test_mixed_dtypes_in_one_capturable_optimizer(device):
    """float16, bfloat16 and float64 parameters beside float32 ones, some with gradients of
    another dtype: the dtype island path, written back in place."""
    results = []
    for capturable in (False, True):
        rng = np.random.default_rng(3)
        params = [
            ndl.Tensor(rng.standard_normal((3, 4)), device=device, dtype=dt, requires_grad=True)
            for dt in ("float32", "float16", "bfloat16", "float64")
        ]
        opt = ndl.optim.Adam(params, lr=0.05, weight_decay=0.01, capturable=capturable)
        grng = np.random.default_rng(4)
        grad_dtypes = ("float16", "float32", "float32", "float32")
        for _ in range(3):
            for p, gdt in zip(params, grad_dtypes):
                p.grad = ndl.Tensor(grng.standard_normal((3, 4)), device=device, dtype=gdt)
            opt.step()
        assert [p.dtype for p in params] == ["float32", "float16", "bfloat16", "float64"]
        results.append([(p.numpy(), opt.m[p].numpy(), opt.v[p].numpy()) for p in params])
    _assert_bit_equal(*results)


@pytest.mark.parametrize("device", DEVICES)
def test_capturable_updates_the_parameter_in_place(device):
    p = _params(device, 5, shapes=[(3, 4)])[0]
    opt = ndl.optim.Adam([p], lr=0.1, capturable=True)
    data = p.data
    before = data.numpy().copy()
    p.grad = ndl.Tensor(np.ones((3, 4), np.float32), device=device)
    opt.step()
    after = p.numpy()
    np.testing.assert_array_equal(data.numpy(), after)  # the old data saw the update
    assert not np.array_equal(after, before)
    assert p.op is None and p.requires_grad


@pytest.mark.parametrize("device", DEVICES)
def test_strided_parameter_is_written_back_into_its_view(device):
    """A transposed parameter: updated through a contiguous copy written back in place."""
    base = np.random.default_rng(6).standard_normal((3, 4)).astype(np.float32)
    results = []
    for capturable in (False, True):
        p = ndl.Tensor(base, device=device, requires_grad=True)
        p.cached_data = ndl.Tensor(base.T.copy(), device=device).cached_data.permute((1, 0))
        np.testing.assert_array_equal(p.numpy(), base)
        assert not p.cached_data.is_compact()
        view = p.cached_data
        opt = ndl.optim.Adam([p], lr=0.1, capturable=capturable)
        for k in range(3):
            p.grad = ndl.Tensor(np.full((3, 4), 0.5 * (k + 1), np.float32), device=device)
            opt.step()
        results.append(p.numpy())
        if capturable:  # the view itself holds the new values
            assert p.cached_data is view
            np.testing.assert_array_equal(view.numpy(), results[-1])
    np.testing.assert_array_equal(results[0], results[1])
    assert not np.array_equal(results[1], base)


@pytest.mark.parametrize("device", DEVICES)
def test_t_reads_and_writes_the_device_step(device):
    plain, opt_plain = _run(device, False, "float32", steps=2)
    cap, opt_cap = _run(device, True, "float32", steps=2)
    assert opt_cap.t == 2
    for opt in (opt_plain, opt_cap):
        opt.t = 40  # e.g. restored from a checkpoint: the bias corrections follow it
    rng = np.random.default_rng(9)
    grads = _grads(rng, opt_plain.params)
    for opt in (opt_plain, opt_cap):
        for p, g in zip(opt.params, grads):
            p.grad = ndl.Tensor(g.numpy(), device=device)
        opt.step()
    assert opt_plain.t == opt_cap.t == 41
    for a, b in zip(opt_plain.params, opt_cap.params):
        np.testing.assert_array_equal(a.numpy(), b.numpy())


@pytest.mark.parametrize("device", DEVICES)
def test_step_without_gradients_still_counts(device):
    params = _params(device, 7)
    opt = ndl.optim.Adam(params, capturable=True)
    before = [p.numpy() for p in params]
    opt.step()
    assert opt.t == 1
    for p, b in zip(params, before):
        np.testing.assert_array_equal(p.numpy(), b)


def test_one_state_per_device():
    """Parameters on several devices: each device's [t, lr] counts every step."""
    devices = [ndl.cpu()] + ([ndl.cuda()] if ndl.cuda.unavailable_reason() is None else [])
    params = [_params(d, 8 + i, shapes=[(2, 3)])[0] for i, d in enumerate(devices)]
    opt = ndl.optim.Adam(params, lr=0.2, capturable=True)
    assert len(opt._device_states) == len(devices)
    for k in range(3):
        for p in params:
            p.grad = ndl.Tensor(np.full((2, 3), k + 1.0, np.float32), device=p.device)
        opt.step()
    opt.lr = 0.1
    for state in opt._device_states.values():
        np.testing.assert_array_equal(state.numpy(), [3.0, 0.1])
    assert opt.t == 3


@pytest.mark.parametrize("device", DEVICES)
def test_bad_input(device):
    p = _params(device, 10, shapes=[(2, 3)])[0]
    for bad in (1, 0, "yes", None, 1.0):
        with pytest.raises(TypeError, match="capturable must be a bool"):
            ndl.optim.Adam([p], capturable=bad)
    opt = ndl.optim.Adam([p], capturable=True)
    with pytest.raises(AttributeError):
        opt.capturable = False
    with pytest.raises(ValueError, match="Invalid lr"):
        opt.lr = -1.0
    with pytest.raises(TypeError, match="lr must be a real number"):
        opt.lr = "0.1"
    with pytest.raises(ValueError, match="Invalid t"):
        opt.t = -1
    with pytest.raises(TypeError, match="t must be an int"):
        opt.t = 1.5
    assert opt.lr == 0.01 and opt.t == 0  # the refused values changed nothing


@pytest.mark.parametrize("device", DEVICES)
def test_engine_call_with_a_state_rejects_bad_input(device):
    def arr(a, dtype="float32"):
        return ndl.NDArray(np.asarray(a, dtype), device=device, dtype=dtype)

    p, g = arr(np.ones((2, 3))), arr(np.full((2, 3), 0.5))
    m, v = arr(np.zeros((2, 3))), arr(np.zeros((2, 3)))
    state = arr([1.0, 0.1], "float64")
    hyper = (0.9, 0.999, 1e-8, 0.0)
    cases = [
        ((p, g, m, v, 0.1, *hyper, None, state), TypeError, "lr must be None"),
        ((p, g, m, v, None, *hyper, 1, state), TypeError, "step must be None"),
        ((p, g, m, v, None, *hyper, None, arr([1.0, 0.1])), ValueError, "float64 array"),
        ((p, g, m, v, None, *hyper, None, arr([1.0, 0.1, 0], "float64")), ValueError, "(2,)"),
        ((p, g, m, v, None, *hyper, None, p), ValueError, "float64"),
        ((p, p, m, v, None, *hyper, None, state), ValueError, "updates in place"),
        ((p, g, m, v, None, *hyper, None, "state"), TypeError, "state must be an NDArray"),
    ]
    if device != ndl.cpu():
        other = ndl.NDArray(np.array([1.0, 0.1]), device=ndl.cpu(), dtype="float64")
        cases.append(((p, g, m, v, None, *hyper, None, other), ndl.DeviceError, "step state"))
    for args, exc, match in cases:
        with pytest.raises(exc, match=match):
            needle_c.adam_update(*args)
    np.testing.assert_array_equal(p.numpy(), np.ones((2, 3)))  # nothing was written
    np.testing.assert_array_equal(m.numpy(), np.zeros((2, 3)))
    np.testing.assert_array_equal(state.numpy(), [1.0, 0.1])
    with pytest.raises(ValueError, match="float64 array"):
        needle_c.adam_count_step(arr([1.0, 0.1]))
    with pytest.raises(TypeError, match="state must be an NDArray"):
        needle_c.adam_count_step(3)
    assert needle_c.adam_update(p, g, m, v, None, *hyper, None, state) is None
    assert not np.array_equal(p.numpy(), np.ones((2, 3)))
    needle_c.adam_count_step(state)
    np.testing.assert_array_equal(state.numpy(), [2.0, 0.1])


def _graph_setup(dtype, capturable=True):
    """Two runs start from this: parameters, fixed gradients (static, as a captured step
    needs) and one eager warm-up step, as PyTorch asks before a capture."""
    device = ndl.cuda()
    params = _params(device, 20, dtype)
    for p, g in zip(params, _grads(np.random.default_rng(21), params)):
        p.grad = g
    opt = ndl.optim.Adam(params, lr=0.05, weight_decay=0.01, capturable=capturable)
    opt.step()
    return params, opt


def _state_values(params, opt):
    return [(p.numpy(), opt.m[p].numpy(), opt.v[p].numpy()) for p in params]


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@cuda_test
def test_captured_step_replays_equal_eager_steps(dtype):
    params, opt = _graph_setup(dtype)
    g = ndl.cuda.CUDAGraph()
    with ndl.cuda.graph(g):
        opt.step()
    # One t += 1, one update per parameter (float16: plus the island's conversions).
    assert g.num_nodes >= 1 + len(params)
    for _ in range(3):
        g.replay()
    eager_params, eager = _graph_setup(dtype)
    for _ in range(3):
        eager.step()
    _assert_bit_equal(_state_values(params, opt), _state_values(eager_params, eager))
    assert opt.t == eager.t == 4
    plain_params, plain = _graph_setup(dtype, capturable=False)
    for _ in range(3):
        plain.step()
    _assert_bit_equal(_state_values(params, opt), _state_values(plain_params, plain))
    # A new lr, written outside the capture, is read by the next replays.
    opt.lr = eager.lr = plain.lr = 0.01
    for _ in range(2):
        g.replay()
        eager.step()
        plain.step()
    _assert_bit_equal(_state_values(params, opt), _state_values(eager_params, eager))
    _assert_bit_equal(_state_values(params, opt), _state_values(plain_params, plain))
    assert opt.t == 6


@cuda_test
def test_non_capturable_step_in_a_capture_is_refused():
    params, opt = _graph_setup("float32", capturable=False)
    before = _state_values(params, opt)
    g = ndl.cuda.CUDAGraph()
    with pytest.raises(ndl.DeviceError, match="pass capturable=True"):
        with ndl.cuda.graph(g):
            opt.step()
    # Abandoned cleanly: no capture left running, no graph, nothing written, t unchanged.
    assert not ndl.cuda.is_current_stream_capturing()
    assert g.num_nodes == 0
    assert opt.t == 1
    _assert_bit_equal(before, _state_values(params, opt))
    # The optimizer and the device go on: an eager step is the second step...
    opt.step()
    ref_params, ref = _graph_setup("float32", capturable=False)
    ref.step()
    _assert_bit_equal(_state_values(params, opt), _state_values(ref_params, ref))
    # ...and the same CUDAGraph captures a capturable step afterwards.
    cap_params, cap = _graph_setup("float32")
    with ndl.cuda.graph(g):
        cap.step()
    g.replay()
    _assert_bit_equal(_state_values(cap_params, cap), _state_values(ref_params, ref))
