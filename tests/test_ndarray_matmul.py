"""NDArray matmul checked against NumPy: 2-D sizes around the kernel tiles, view operands,
and N-D batched products with broadcast batch dimensions."""

import numpy as np
import pytest

from needle import backend_ndarray as nd

from devices import DEVICES
from ndarray_check import _c, check_result, make_views, rand_data, shape_id

# --------------------------------------------------------------------------
# matmul
# --------------------------------------------------------------------------


def _check_matmul(nda, ndb, npa, npb, device, msg):
    exp = np.matmul(npa.astype(np.float64), npb.astype(np.float64))
    k = npa.shape[-1]
    for name, res in [
        ("@", nda @ ndb),
        ("matmul", nda.matmul(ndb)),
        ("nd.matmul", nd.matmul(nda, ndb)),
    ]:
        assert res.shape == exp.shape, f"{msg} {name}: {res.shape} vs {exp.shape}"
        assert res.is_compact()
        check_result(res, exp, device, f"{msg} {name}", rtol=1e-4, atol=1e-5 * max(1, k))


MATMUL_2D = [
    (1, 1, 1),
    (1, 5, 1),
    (2, 3, 4),
    (3, 1, 2),
    (7, 9, 5),
    (8, 8, 8),
    (9, 7, 13),
    (15, 17, 16),
    (16, 16, 16),
    (31, 33, 29),
    (32, 1, 40),
    (64, 64, 64),
    (65, 127, 130),
    (130, 3, 7),
    (1, 130, 1),
    (257, 129, 65),
    (0, 3, 4),
    (3, 0, 4),
    (3, 4, 0),
]


@pytest.mark.parametrize("m,k,n", MATMUL_2D, ids=[f"{m}x{k}x{n}" for m, k, n in MATMUL_2D])
@pytest.mark.parametrize("device", DEVICES)
def test_matmul_2d(m, k, n, device):
    rng = np.random.default_rng(71 + m + k + n)
    x = rand_data(rng, (m, k), "any") / 2
    y = rand_data(rng, (k, n), "any") / 2
    a = nd.array(x, device=device)
    b = nd.array(y, device=device)
    _check_matmul(a, b, x, y, device, f"{m}x{k}x{n}")
    # transposed operands (views)
    at = nd.array(_c(x.T), device=device).permute((1, 0))
    bt = nd.array(_c(y.T), device=device).permute((1, 0))
    _check_matmul(at, b, x, y, device, "A transposed")
    _check_matmul(a, bt, x, y, device, "B transposed")
    _check_matmul(at, bt, x, y, device, "both transposed")


@pytest.mark.parametrize("device", DEVICES)
def test_matmul_view_operands(device):
    rng = np.random.default_rng(72)
    x = rand_data(rng, (6, 5))
    y = rand_data(rng, (5, 4))
    va = make_views(x, device, seed=5)
    vb = make_views(y, device, seed=6)
    for ka, npa, nda in va:
        _check_matmul(nda, vb[0][2], npa, vb[0][1], device, f"A {ka}")
    for kb, npb, ndb in vb[1:]:
        _check_matmul(va[0][2], ndb, va[0][1], npb, device, f"B {kb}")
    for (ka, npa, nda), (kb, npb, ndb) in zip(va, vb):
        _check_matmul(nda, ndb, npa, npb, device, f"A {ka} B {kb}")


MATMUL_ND = [
    ((4,), (4, 5)),
    ((3, 4), (4,)),
    ((4,), (4,)),
    ((1,), (1,)),
    ((2, 3, 4), (2, 4, 5)),
    ((2, 1, 3, 4), (5, 4, 6)),
    ((3, 4, 5), (5, 2)),
    ((4, 5), (3, 5, 2)),
    ((5,), (3, 5, 2)),
    ((3, 4, 5), (5,)),
    ((1, 3, 4), (7, 4, 2)),
    ((2, 1, 1, 3, 4), (1, 3, 1, 4, 2)),
    ((0, 3, 4), (4, 2)),
    ((2, 3, 0), (2, 0, 5)),
    ((4, 17, 33), (4, 33, 9)),
]


@pytest.mark.parametrize(
    "sa,sb", MATMUL_ND, ids=[f"{shape_id(a)}@{shape_id(b)}" for a, b in MATMUL_ND]
)
@pytest.mark.parametrize("device", DEVICES)
def test_matmul_nd(sa, sb, device):
    rng = np.random.default_rng(73)
    x = rand_data(rng, sa)
    y = rand_data(rng, sb)
    va = make_views(x, device, seed=7)
    vb = make_views(y, device, seed=8)
    for ka, npa, nda in va:
        _check_matmul(nda, vb[0][2], npa, vb[0][1], device, f"{sa}@{sb} A {ka}")
    for kb, npb, ndb in vb[1:]:
        _check_matmul(va[0][2], ndb, va[0][1], npb, device, f"{sa}@{sb} B {kb}")


def test_matmul_documented_batch_shape():
    a = nd.array(np.ones((2, 1, 3, 4), np.float32))
    b = nd.array(np.ones((5, 4, 6), np.float32))
    r = a @ b
    assert r.shape == (2, 5, 3, 6)
    np.testing.assert_array_equal(r.numpy(), np.full((2, 5, 3, 6), 4.0, np.float32))
