"""Tests of the differentiable cast (``Tensor.astype``, ``ops.cast``), of gradients of ops on
mixed dtypes (each comes back in its input's dtype), and of automatic mixed precision
(``ndl.autocast``, needle/_autocast.py): which dtype each op runs in under autocast, master
weights' float32 gradients, nesting, exceptions, threads and bad arguments; and the course's
PTB transformer trained under autocast(bfloat16) and autocast(float16) + GradScaler.

Values are chosen representable in every dtype (small multiples of powers of two), so casts and
their gradients are compared exactly.
"""

import threading

import numpy as np
import pytest

import needle as ndl
from needle import nn, optim
from needle.apps.models import LanguageModel
from needle.data import Corpus, batchify, get_batch, write_synthetic_corpus

from devices import dev

GRAPH_MODES = ("cycle_free", "needle")
NARROW = ("float16", "bfloat16")
ALL_DTYPES = ("float32", "float16", "bfloat16", "float64")
graph_modes = pytest.mark.parametrize("mode", GRAPH_MODES)

EXACT = np.array([[1.5, -2.0, 0.25], [3.0, -0.5, 8.0]], dtype=np.float32)


def tensor(values, device, dtype="float32", requires_grad=True):
    return ndl.Tensor(
        np.asarray(values, np.float32), device=device, dtype=dtype, requires_grad=requires_grad
    )


def as_np(t):
    return np.asarray(t.numpy(), np.float64)


# ------------------------------------------------------------------ cast


@dev
@graph_modes
@pytest.mark.parametrize("src", ALL_DTYPES)
@pytest.mark.parametrize("dst", ALL_DTYPES)
def test_cast_forward_and_gradient_dtype(device, mode, src, dst):
    x = tensor(EXACT, device, src)
    with ndl.autograd.graph_mode(mode):
        y = x.astype(dst)
        assert y.dtype == dst
        np.testing.assert_array_equal(as_np(y), EXACT)
        if src == dst:
            assert y is x  # no node
            return
        assert isinstance(y.op, ndl.ops.Cast) and y.op.dtype == dst
        seed = ndl.Tensor(2 * EXACT, device=device, dtype=dst, requires_grad=False)
        y.backward(seed)
    assert x.grad.dtype == src
    np.testing.assert_array_equal(as_np(x.grad), 2 * EXACT)


@dev
def test_ops_cast_and_cast_op_object(device):
    x = tensor(EXACT, device)
    assert ndl.ops.cast(x, ndl.float32) is x
    y = ndl.ops.cast(x, ndl.bfloat16)
    assert y.dtype == "bfloat16" and y.inputs == [x]
    # The op object called directly makes a node even for the same dtype (as any op does).
    z = ndl.ops.Cast("float32")(x)
    assert z.dtype == "float32" and z is not x
    np.testing.assert_array_equal(z.numpy(), EXACT)
    assert repr(ndl.ops.Cast("float16")) == "Cast()"
    assert ndl.ops.EWiseAdd().dtype is None
    assert x.astype(np.float16).dtype == "float16"  # a NumPy dtype
    assert ndl.cast is ndl.ops.cast


@dev
@graph_modes
def test_cast_then_float32_ops_gradient(device, mode):
    """A float16 leaf read through a cast to float32: its gradient comes back float16."""
    x = tensor(EXACT, device, "float16")
    with ndl.autograd.graph_mode(mode):
        y = x.astype("float32")
        (y * y).sum().backward()
    assert x.grad.dtype == "float16"
    np.testing.assert_array_equal(as_np(x.grad), 2 * EXACT)


@dev
def test_cast_rounds_as_the_engine(device):
    # 1 + 2**-10 is a float16 but not a bfloat16 (8 bits of mantissa): round to nearest even.
    v = np.array([1 + 2**-10, 65504.0, 70000.0], np.float32)
    x = ndl.Tensor(v, device=device)
    np.testing.assert_array_equal(as_np(x.astype("bfloat16"))[:1], [1.0])
    h = as_np(x.astype("float16"))
    assert h[0] == 1 + 2**-10 and h[1] == 65504.0 and np.isinf(h[2])


# --------------------------------------------------- mixed-dtype gradients


@dev
@graph_modes
@pytest.mark.parametrize("narrow", NARROW)
def test_mixed_binary_gradients_in_input_dtypes(device, mode, narrow):
    a_np = EXACT
    b_np = np.array([[0.5, 2.0, -1.0]], np.float32)  # broadcast over a's rows
    with ndl.autograd.graph_mode(mode):
        for op in ("add", "mul", "div", "sub"):
            a = tensor(a_np, device, "float32")
            b = tensor(b_np, device, narrow)
            z = {
                "add": lambda: a + b,
                "mul": lambda: a * b,
                "div": lambda: a / b,
                "sub": lambda: a - b,
            }[op]()
            assert z.dtype == "float32"  # the engine's promotion
            z.sum().backward()
            assert a.grad.dtype == "float32", op
            assert b.grad.dtype == narrow, op
            assert b.grad.shape == (1, 3)
            ga, gb = {
                "add": (np.ones_like(a_np), np.full((1, 3), 2.0)),
                "sub": (np.ones_like(a_np), np.full((1, 3), -2.0)),
                "mul": (np.broadcast_to(b_np, a_np.shape), a_np.sum(0, keepdims=True)),
                "div": (
                    np.broadcast_to(1 / b_np, a_np.shape),
                    -(a_np / b_np**2).sum(0, keepdims=True),
                ),
            }[op]
            np.testing.assert_allclose(as_np(a.grad), ga, rtol=0, atol=0)
            np.testing.assert_allclose(as_np(b.grad), gb, rtol=1e-2)


@dev
@graph_modes
def test_matmul_mixed_gradients(device, mode):
    a = tensor(EXACT, device, "float32")
    w = tensor(np.eye(3, dtype=np.float32) * 2, device, "bfloat16")
    with ndl.autograd.graph_mode(mode):
        (a @ w).sum().backward()
    assert a.grad.dtype == "float32" and w.grad.dtype == "bfloat16"
    np.testing.assert_array_equal(as_np(a.grad), np.full(EXACT.shape, 2.0))
    np.testing.assert_array_equal(as_np(w.grad), np.repeat(EXACT.sum(0)[:, None], 3, axis=1))


@dev
@graph_modes
@pytest.mark.parametrize("narrow", NARROW)
def test_contributions_summed_in_node_dtype(device, mode, narrow):
    """A narrow leaf used by two float32 ops: both contributions arrive cast to the leaf's
    dtype and sum there."""
    b = tensor([[1.0, 2.0, 4.0]], device, narrow)
    a = tensor(EXACT, device, "float32", requires_grad=False)
    with ndl.autograd.graph_mode(mode):
        ((a + b) + (a * b)).sum().backward()
    assert b.grad.dtype == narrow
    np.testing.assert_array_equal(as_np(b.grad), 2 + EXACT.sum(0, keepdims=True))


@dev
def test_python_op_gradient_cast_to_input_dtype(device):
    """A TensorOp written in Python whose gradient returns float32 for a float16 input."""

    class Twice(ndl.autograd.TensorOp):
        def compute(self, a):
            return a.astype("float32") * 2

        def gradient(self, out_grad, node):
            return out_grad * 2

    x = tensor(EXACT, device, "float16")
    y = Twice()(x)
    assert y.dtype == "float32"
    y.sum().backward()
    assert x.grad.dtype == "float16"
    np.testing.assert_array_equal(as_np(x.grad), np.full(EXACT.shape, 2.0))


@dev
def test_backward_seed_takes_output_dtype(device):
    x = tensor(EXACT, device, "float32")
    y = x.astype("bfloat16")
    y.backward()
    assert x.grad.dtype == "float32"
    np.testing.assert_array_equal(x.grad.numpy(), np.ones_like(EXACT))


# ------------------------------------------------------------- autocast


def params(device, din=4, dout=3):
    rng = np.random.default_rng(0)
    x = tensor(rng.integers(-4, 4, (2, din)) / 4, device, requires_grad=False)
    w = tensor(rng.integers(-4, 4, (din, dout)) / 4, device)
    b = tensor(rng.integers(-4, 4, (1, dout)) / 4, device)
    return x, w, b


@dev
@pytest.mark.parametrize("narrow", NARROW)
def test_autocast_narrow_list(device, narrow):
    x, w, b = params(device)
    with ndl.autocast(device, dtype=narrow):
        assert (x @ w).dtype == narrow
        assert ndl.ops.matmul_bias(x, w, b).dtype == narrow
        x3 = ndl.ops.reshape(x, (1, 2, 4))
        w3 = ndl.ops.broadcast_to(ndl.ops.reshape(w, (1, 4, 3)), (1, 4, 3))
        assert (x3 @ w3).dtype == narrow  # batched
        lin = nn.Linear(4, 3, device=device)
        out = lin(x)
        assert out.dtype == narrow
        img = tensor(np.ones((1, 4, 4, 2)) / 4, device, requires_grad=False)
        ker = tensor(np.ones((3, 3, 2, 2)) / 8, device)
        assert ndl.ops.conv(img, ker, padding=1).dtype == narrow
        y = ndl.ops.relu(x @ w)
        assert y.dtype == narrow  # the rest: widest input dtype
        assert (y + b).dtype == "float32"
    # parameters stay float32
    assert w.dtype == b.dtype == lin.weight.dtype == "float32"


@dev
@pytest.mark.parametrize("narrow", NARROW)
def test_autocast_float32_list(device, narrow):
    x, w, b = params(device, 4, 4)
    h = x.astype(narrow)
    labels = ndl.Tensor(np.array([1, 3], np.float32), device=device, requires_grad=False)
    with ndl.autocast(device, dtype=narrow):
        assert h.sum().dtype == "float32"
        assert h.sum(axes=(1,)).dtype == "float32"
        assert ndl.ops.exp(h).dtype == "float32"
        assert ndl.ops.log(ndl.ops.exp(h)).dtype == "float32"
        assert (h**2).dtype == "float32"
        assert ndl.ops.logsumexp(h, axes=(1,)).dtype == "float32"
        assert ndl.ops.LogSoftmax()(h).dtype == "float32"
        assert nn.LayerNorm1d(4, device=device)(h).dtype == "float32"
        # The fused ones take the narrow input itself (no Cast node: the graph keeps no
        # float32 copy) and compute in float32 inside the engine.
        h = tensor(h.numpy(), device, dtype=narrow)  # a leaf that requires grad
        loss = nn.SoftmaxLoss()(h, labels)
        assert loss.dtype == "float32" and loss.inputs[0] is h
        normed = ndl.ops.layer_norm(h, w[0, :], b[0, :])
        assert normed.dtype == "float32" and normed.inputs[0] is h
        att = ndl.ops.reshape(h, (1, 1, 2, 4))
        probs = ndl.ops.attention_softmax(att, 2.0, causal=True)
        assert probs.dtype == narrow and probs.inputs[0] is att
    # float64 is never narrowed nor widened
    x64 = x.astype("float64")
    with ndl.autocast(device, dtype=narrow):
        assert x64.sum().dtype == "float64"


@dev
@pytest.mark.parametrize("narrow", NARROW)
@pytest.mark.parametrize("mode", GRAPH_MODES)
def test_autocast_master_weights_get_float32_grads(device, narrow, mode):
    x, w, b = params(device)
    labels = ndl.Tensor(np.array([0, 2], np.float32), device=device, requires_grad=False)
    with ndl.autograd.graph_mode(mode):
        with ndl.autocast(device, dtype=narrow):
            logits = ndl.ops.matmul_bias(x, w, b)
            loss = nn.SoftmaxLoss()(logits, labels)
        assert loss.dtype == "float32"
        loss.backward()
    assert w.grad.dtype == "float32" and b.grad.dtype == "float32"
    # the same in float32, to the narrow type's precision
    w32 = tensor(w.numpy(), device)
    b32 = tensor(b.numpy(), device)
    nn.SoftmaxLoss()(ndl.ops.matmul_bias(x, w32, b32), labels).backward()
    tol = 1e-2 if narrow == "bfloat16" else 2e-3
    np.testing.assert_allclose(w.grad.numpy(), w32.grad.numpy(), atol=tol)
    np.testing.assert_allclose(b.grad.numpy(), b32.grad.numpy(), atol=tol)


@dev
def test_autocast_nested_disable_and_restore(device):
    x, w, _ = params(device)
    assert not ndl.amp.is_autocast_enabled("cpu")
    with ndl.autocast(device, dtype=ndl.float16):
        assert (x @ w).dtype == "float16"
        with ndl.autocast(device, enabled=False):
            assert (x @ w).dtype == "float32"
            with ndl.amp.autocast(device, dtype="bfloat16"):
                assert (x @ w).dtype == "bfloat16"
            assert (x @ w).dtype == "float32"
        assert (x @ w).dtype == "float16"
    assert (x @ w).dtype == "float32"


def test_autocast_device_types_are_separate():
    x, w, _ = params(ndl.cpu())
    with ndl.autocast("cuda"):
        assert ndl.amp.is_autocast_enabled("cuda")
        assert not ndl.amp.is_autocast_enabled("cpu")
        assert (x @ w).dtype == "float32"  # a cpu op
    with ndl.autocast("cpu", dtype="float16"):
        assert ndl.amp.get_autocast_dtype("cpu") == "float16"
        assert (x @ w).dtype == "float16"


def test_autocast_survives_exceptions_and_reentry():
    x, w, _ = params(ndl.cpu())
    ctx = ndl.autocast("cpu")
    with pytest.raises(ZeroDivisionError):
        with ctx:
            with ctx:  # the same object nests
                assert ndl.amp.is_autocast_enabled("cpu")
                1 / 0
    assert not ndl.amp.is_autocast_enabled("cpu")
    assert ndl.amp.get_autocast_dtype("cpu") == "bfloat16"
    assert (x @ w).dtype == "float32"
    with pytest.raises(TypeError):  # an op failing inside autocast
        with ndl.autocast("cpu"):
            x @ 3
    assert not ndl.amp.is_autocast_enabled("cpu")


def test_autocast_decorator():
    x, w, _ = params(ndl.cpu())

    @ndl.autocast("cpu", dtype="float16")
    def forward(a, b):
        """doc"""
        return a @ b

    assert forward(x, w).dtype == "float16"
    assert forward.__doc__ == "doc"
    assert not ndl.amp.is_autocast_enabled("cpu")


def test_autocast_is_per_thread():
    seen = []
    x, w, _ = params(ndl.cpu())
    with ndl.autocast("cpu"):
        t = threading.Thread(target=lambda: seen.append((x @ w).dtype))
        t.start()
        t.join()
        assert (x @ w).dtype == "bfloat16"
    assert seen == ["float32"]


def test_backward_runs_with_autocast_suspended():
    seen = []

    class Probe(ndl.autograd.TensorOp):
        def compute(self, a):
            return a

        def gradient(self, out_grad, node):
            seen.append(ndl.amp.is_autocast_enabled("cpu"))
            seen.append((node.inputs[0] @ w).dtype)
            return out_grad

    x = tensor(EXACT, ndl.cpu())
    w = tensor(np.ones((3, 2)), ndl.cpu())
    with ndl.autocast("cpu"):
        Probe()(x).sum().backward()
        assert ndl.amp.is_autocast_enabled("cpu")
    assert seen == [False, "float32"]


def test_python_ops_run_as_given():
    """A TensorOp written in Python is not autocast (its compute decides)."""

    class PyMatMul(ndl.autograd.TensorOp):
        def compute(self, a, b):
            return a @ b

        def gradient(self, out_grad, node):
            a, b = node.inputs
            return out_grad @ b.transpose(), a.transpose() @ out_grad

    x, w, _ = params(ndl.cpu())
    with ndl.autocast("cpu"):
        assert PyMatMul()(x, w).dtype == "float32"
        assert ndl.ops.MatMul()(x, w).dtype == "bfloat16"


@pytest.mark.parametrize(
    "kwargs, exc, match",
    [
        (dict(device="tpu"), ValueError, "'cpu', 'cuda'"),
        (dict(device=3), TypeError, "needle Device"),
        (dict(device="cpu", dtype="float32"), ValueError, "float16 or bfloat16"),
        (dict(device="cpu", dtype=ndl.float64), ValueError, "float16 or bfloat16"),
        (dict(device="cpu", dtype="float8"), ValueError, "float16 or bfloat16"),
        (dict(device="cpu", dtype=object()), TypeError, "float16 or bfloat16"),
        (dict(device="cpu", enabled="yes"), TypeError, "bool"),
    ],
)
def test_autocast_bad_arguments(kwargs, exc, match):
    with pytest.raises(exc, match=match):
        ndl.autocast(**kwargs)
    assert not ndl.amp.is_autocast_enabled("cpu")


# Every spelling of the narrow types that the Tensor constructor reads.
NARROW_SPELLINGS = [
    ("half", "float16"),
    ("float16", "float16"),
    (ndl.float16, "float16"),
    (np.float16, "float16"),
    (np.dtype("float16"), "float16"),
    ("f2", "float16"),
    ("bfloat16", "bfloat16"),
    (ndl.bfloat16, "bfloat16"),
]


@pytest.mark.parametrize("spelling, name", NARROW_SPELLINGS, ids=repr)
def test_autocast_takes_every_spelling_the_tensor_constructor_takes(spelling, name):
    x, w, _ = params(ndl.cpu())
    assert ndl.Tensor(np.ones(2, np.float32), dtype=spelling).dtype == name
    with ndl.autocast("cpu", dtype=spelling) as ctx:
        assert ctx.fast_dtype == name
        assert ndl.amp.get_autocast_dtype("cpu") == name
        assert (x @ w).dtype == name
    assert not ndl.amp.is_autocast_enabled("cpu")


@pytest.mark.parametrize("spelling", ["float", "double", np.float64, "int32", np.uint8], ids=repr)
def test_autocast_refuses_wide_and_integer_dtypes_in_any_spelling(spelling):
    with pytest.raises(ValueError, match="autocast dtype must be float16 or bfloat16"):
        ndl.autocast("cpu", dtype=spelling)


def test_autocast_exit_without_enter_is_a_runtime_error():
    ctx = ndl.autocast("cpu", dtype="float16")
    with pytest.raises(RuntimeError, match=r"autocast.__exit__ without a matching __enter__"):
        ctx.__exit__(None, None, None)
    assert not ndl.amp.is_autocast_enabled("cpu")
    # one exit per enter: the second exit of a `with` that ran is the same misuse
    with ctx:
        assert ndl.amp.is_autocast_enabled("cpu")
    with pytest.raises(RuntimeError, match="without a matching __enter__"):
        ctx.__exit__(None, None, None)
    assert not ndl.amp.is_autocast_enabled("cpu")
    assert ndl.amp.get_autocast_dtype("cpu") == "bfloat16"


def test_the_policy_is_pythons_lists():
    import needle_c
    from needle import _autocast

    want = dict.fromkeys(_autocast.NARROW_OPS, "narrow") | dict.fromkeys(
        _autocast.FLOAT32_OPS, "float32"
    )
    assert needle_c._autocast_policy() == want
    assert want["MatMulBias"] == "narrow" and want["Summation"] == "float32"


def test_a_policy_change_takes_effect_and_a_bad_one_changes_nothing():
    import needle_c

    before = needle_c._autocast_policy()
    x = ndl.Tensor(np.ones((2, 3), np.float32), dtype="bfloat16")
    try:
        needle_c._autocast_set_policy({"Exp": "narrow"})
        with ndl.autocast("cpu"):
            assert x.exp().dtype == "bfloat16"  # Exp no longer widens
            assert (x.astype("float32") @ x.astype("float32").transpose()).dtype == "float32"
        for bad, match in [
            ({"NoSuchOp": "narrow"}, "not a built-in op"),
            ({"Exp": "half"}, "expected 'narrow' or 'float32'"),
            ({1: "narrow"}, "not a built-in op"),
        ]:
            with pytest.raises(ValueError, match=match):
                needle_c._autocast_set_policy(bad)
            assert needle_c._autocast_policy() == {"Exp": "narrow"}
        with pytest.raises(TypeError, match="dict"):
            needle_c._autocast_set_policy([("Exp", "narrow")])

        # A key whose repr (run by the error message) empties the dict it is read from.
        class Hostile:
            def __repr__(self):
                policy.clear()
                return "Hostile()"

        policy = {Hostile(): "narrow"}
        with pytest.raises(ValueError, match=r"Hostile\(\) is not a built-in op"):
            needle_c._autocast_set_policy(policy)
        assert needle_c._autocast_policy() == {"Exp": "narrow"}
    finally:
        needle_c._autocast_set_policy(before)
    assert needle_c._autocast_policy() == before
    with ndl.autocast("cpu"):
        assert x.exp().dtype == "float32"


def test_autocast_numpy_dtype_and_bad_cast():
    with ndl.autocast("cpu", dtype=np.float16) as ctx:
        assert ctx.fast_dtype == "float16"
    x = tensor(EXACT, ndl.cpu())
    for bad in ("float8", "int32", 3):
        with pytest.raises(TypeError):
            x.astype(bad)
        with pytest.raises(TypeError):
            ndl.ops.Cast(bad)
    with pytest.raises(TypeError, match="dtype"):
        ndl.ops.Cast()
    with pytest.raises(ValueError, match="'cpu' or 'cuda'"):
        ndl._c._autocast_set("gpu", True, "float16")
    with pytest.raises(ValueError, match="float16 or bfloat16"):
        ndl._c._autocast_set("cpu", True, "float32")
    assert not ndl.amp.is_autocast_enabled("cpu")


@dev
def test_live_tensor_report_shows_dtype(device):
    x = ndl.Tensor(EXACT, device=device, dtype="bfloat16")
    records = [r for r in ndl.memory.live_tensors(device) if r["shape"] == (2, 3)]
    assert any(r["dtype"] == "bfloat16" and r["bytes"] == 12 for r in records)
    assert x.dtype == "bfloat16"


# -------------------------------------------------- training under autocast

STEPS = 100


@pytest.fixture(scope="module")
def ptb(tmp_path_factory):
    path = tmp_path_factory.mktemp("autocast_ptb")
    write_synthetic_corpus(str(path), num_words=6_000, seed=0, vocab_size=150)
    corpus = Corpus(str(path))
    return corpus, batchify(corpus.train, 8, None, "float32")


def train_transformer(device, ptb, amp=None, scaler=None, steps=STEPS, seq_len=8):
    corpus, data = ptb
    np.random.seed(0)
    model = LanguageModel(16, len(corpus.dictionary), 16, seq_model="transformer", device=device)
    opt = optim.Adam(model.parameters(), lr=1e-2)
    loss_fn = nn.SoftmaxLoss()
    losses = []
    nrows = data.shape[0] - 1
    for step in range(steps):
        i = (step * seq_len) % (nrows - seq_len)
        X, y = get_batch(data, i, seq_len, device=device)
        opt.reset_grad()
        if amp is None:
            loss = loss_fn(model(X)[0], y)
        else:
            with ndl.autocast(device, dtype=amp):
                loss = loss_fn(model(X)[0], y)
        assert loss.dtype == "float32"
        if scaler is None:
            loss.backward()
            opt.step()
        else:
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
        losses.append(float(loss.numpy().reshape(-1)[0]))
    return model, losses


@dev
def test_transformer_trains_under_autocast(device, ptb):
    _, ref = train_transformer(device, ptb)
    _, bf16 = train_transformer(device, ptb, amp="bfloat16")
    _, fp16 = train_transformer(device, ptb, amp="float16", scaler=ndl.amp.GradScaler())
    final = {"f32": np.mean(ref[-10:]), "bf16": np.mean(bf16[-10:]), "f16": np.mean(fp16[-10:])}
    assert final["f32"] < np.mean(ref[:10]) - 0.3, final  # it trained
    for name in ("bf16", "f16"):
        assert abs(final[name] - final["f32"]) <= 0.02 * final["f32"], final


@dev
def test_float16_overflow_is_skipped_and_scale_backs_off(device, ptb):
    corpus, data = ptb
    np.random.seed(0)
    model = LanguageModel(16, len(corpus.dictionary), 16, seq_model="transformer", device=device)
    opt = optim.Adam(model.parameters(), lr=1e-2)
    # 2**40 overflows float16's 65504 once the scaled gradient reaches a float16 matmul.
    scaler = ndl.amp.GradScaler(init_scale=2.0**40)
    X, y = get_batch(data, 0, 8, device=device)
    before = [p.numpy().copy() for p in model.parameters()]
    with ndl.autocast(device, dtype="float16"):
        loss = nn.SoftmaxLoss()(model(X)[0], y)
    opt.reset_grad()
    scaler.scale(loss).backward()
    # the float16 gradients overflowed (the float32 master weights' grads hold the infs)
    assert any(not np.isfinite(p.grad.numpy()).all() for p in model.parameters())
    scaler.step(opt)
    scaler.update()
    assert scaler.get_scale() == 2.0**39
    for p, old in zip(model.parameters(), before):
        np.testing.assert_array_equal(p.numpy(), old)
