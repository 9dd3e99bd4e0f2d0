"""Gradient checking for needle's Tensor ops.

``check_op`` runs a needle function under both graph modes, compares the
forward value with a NumPy reference, and compares the gradients of
``sum(fn(*tensors) * w)`` (``w`` a fixed random weight, so the seed gradient
is not all ones) with central finite differences of the same weighted sum
taken on the NumPy reference in float64. It also checks that the two graph
modes give the same gradients, and the graph-mode contract of ``.grad``
(``op is None`` in "cycle_free" mode).
"""

import numpy as np

import needle as ndl

MODES = ndl.autograd.GRAPH_MODES


def _as_tuple(value):
    if isinstance(value, (tuple, list)):
        return tuple(value)
    return (value,)


def _outputs(out):
    """The list of Tensors of a needle result (a Tensor or a TensorTuple)."""
    if isinstance(out, ndl.TensorTuple):
        return [out[i] for i in range(len(out))]
    assert isinstance(out, ndl.Tensor), f"expected a Tensor or TensorTuple, got {type(out)!r}"
    return [out]


def _weights(ref_outputs, seed):
    rng = np.random.default_rng(seed)
    return [rng.uniform(0.5, 1.5, size=np.shape(r)).astype(np.float32) for r in ref_outputs]


def _weighted_sum64(reference, arrays64, weights):
    outs = _as_tuple(reference(*arrays64))
    return sum(
        float(np.sum(np.asarray(o, dtype=np.float64) * w.astype(np.float64)))
        for o, w in zip(outs, weights)
    )


def numerical_gradient(f, arrays, index, eps):
    """Central differences of the scalar ``f(*arrays)`` w.r.t. ``arrays[index]``, in float64.

    The one finite-difference implementation of the tests: ``check_op`` (here) and
    ``nn_check.check_module`` both use it. Returns an array of ``arrays[index]``'s shape.
    """
    arrays = [np.array(a, dtype=np.float64) for a in arrays]
    x = arrays[index]
    g = np.zeros_like(x)
    flat = x.reshape(-1)
    gflat = g.reshape(-1)
    for j in range(flat.size):
        old = flat[j]
        flat[j] = old + eps
        fp = f(*arrays)
        flat[j] = old - eps
        fm = f(*arrays)
        flat[j] = old
        gflat[j] = (fp - fm) / (2 * eps)
    return g


def numerical_gradients(reference, arrays, weights, wrt, eps):
    """Central differences of ``sum(reference(*x) * w)`` in float64, one per index in ``wrt``."""

    def weighted_sum(*arrays64):
        return _weighted_sum64(reference, arrays64, weights)

    return [numerical_gradient(weighted_sum, arrays, i, eps) for i in wrt]


def run_needle(
    fn, arrays, device, weights, wrt, mode, backward=True, check_shape=True, ref_shapes=None
):
    """Forward (and backward) of ``fn`` under ``mode``; returns (outputs, grads)."""
    with ndl.autograd.graph_mode(mode):
        assert ndl.autograd.get_graph_mode() == mode
        tensors = [
            ndl.Tensor(a, device=device, requires_grad=(i in wrt)) for i, a in enumerate(arrays)
        ]
        out = fn(*tensors)
        outs = _outputs(out)
        values = []
        for k, o in enumerate(outs):
            assert o.dtype == "float32"
            assert o.device == device, f"output {k} on {o.device!r}, expected {device!r}"
            if ref_shapes is not None:
                if check_shape:
                    assert tuple(o.shape) == tuple(ref_shapes[k]), (
                        f"output {k}: shape {o.shape}, expected {ref_shapes[k]}"
                    )
                else:
                    assert int(np.prod(o.shape)) == int(np.prod(ref_shapes[k]))
            v = o.numpy()
            assert isinstance(v, np.ndarray) and v.dtype == np.float32
            assert tuple(v.shape) == tuple(o.shape)
            values.append(v)
        if not backward:
            return values, None
        loss = None
        for o, w in zip(outs, weights):
            wt = ndl.Tensor(w.reshape(o.shape), device=device, requires_grad=False)
            term = (o * wt).sum()
            loss = term if loss is None else loss + term
        loss.backward()
        grads = []
        for i in wrt:
            g = tensors[i].grad
            assert g is not None, f"input {i} has no .grad after backward ({mode} mode)"
            assert isinstance(g, ndl.Tensor)
            assert tuple(g.shape) == tuple(tensors[i].shape), (
                f"grad of input {i} has shape {g.shape}, expected {tensors[i].shape}"
            )
            assert g.device == device
            if mode == "cycle_free":
                assert g.op is None, "cycle_free mode: every .grad must be detached"
            grads.append(g.numpy())
        for i, t in enumerate(tensors):
            if i not in wrt and mode == "cycle_free":
                assert t.grad is None, "cycle_free mode: a leaf without requires_grad got a .grad"
        return values, grads


def check_op(
    fn,
    *arrays,
    device,
    reference,
    rtol=1e-4,
    atol=1e-4,
    eps=1e-3,
    grad_rtol=1e-3,
    grad_atol=1e-3,
    backward=True,
    wrt=None,
    check_shape=True,
    seed=1234,
    modes_atol=1e-7,
):
    """Check ``fn`` (Tensors -> Tensor or TensorTuple) against ``reference`` (NumPy).

    ``arrays`` are the inputs (converted to float32); ``wrt`` lists the indices of
    inputs to differentiate (default: all); the others get ``requires_grad=False``.
    ``reference`` takes float64 arrays and returns an array or a tuple of arrays.
    Runs under every graph mode and checks that the gradients agree across modes (to
    rtol 1e-6 and ``modes_atol``: an op whose recorded gradient is composed of other ops
    than its fused one agrees to rounding only). Returns ``{mode: (values, grads)}``.
    """
    arrays = [np.asarray(a, dtype=np.float32) for a in arrays]
    if wrt is None:
        wrt = tuple(range(len(arrays)))
    wrt = tuple(wrt)
    ref_outs = [
        np.asarray(r, dtype=np.float64)
        for r in _as_tuple(reference(*[a.astype(np.float64) for a in arrays]))
    ]
    weights = _weights(ref_outs, seed)
    results = {}
    for mode in MODES:
        values, grads = run_needle(
            fn,
            arrays,
            device,
            weights,
            wrt,
            mode,
            backward=backward,
            check_shape=check_shape,
            ref_shapes=[r.shape for r in ref_outs],
        )
        assert len(values) == len(ref_outs)
        for k, (v, r) in enumerate(zip(values, ref_outs)):
            np.testing.assert_allclose(
                v.reshape(r.shape),
                r,
                rtol=rtol,
                atol=atol,
                err_msg=f"forward output {k} ({mode} mode)",
            )
        results[mode] = (values, grads)
    if backward:
        num = numerical_gradients(reference, arrays, weights, wrt, eps)
        for mode in MODES:
            for i, g, n in zip(wrt, results[mode][1], num):
                np.testing.assert_allclose(
                    g,
                    n,
                    rtol=grad_rtol,
                    atol=grad_atol,
                    err_msg=f"gradient of input {i} ({mode} mode)",
                )
        for i, ga, gb in zip(wrt, results[MODES[0]][1], results[MODES[1]][1]):
            np.testing.assert_allclose(
                ga,
                gb,
                rtol=1e-6,
                atol=modes_atol,
                err_msg=f"gradient of input {i} differs between modes",
            )
    return results
