"""The course's hw1/hw2 MNIST code: ``needle.apps.simple_ml``'s ``parse_mnist``,
``softmax_loss``, ``nn_epoch``, ``loss_err``, and ``needle.apps.mlp_resnet``'s
``ResidualBlock``, ``MLPResNet``, ``epoch``, ``train_mnist`` (also re-exported by simple_ml, with
``evaluate_mnist``), plus the course-layout shims in ``needle.apps.COURSE_LAYOUT_DIR``.

Data: small generated files in MNIST's real IDX format, gzip-compressed, with the course's
file names. References are NumPy in float64.
"""

import gzip
import os
import pathlib
import struct
import subprocess
import sys

import numpy as np
import pytest

import needle as ndl
from needle import nn
from needle.apps import mlp_resnet, simple_ml

REPO = pathlib.Path(__file__).resolve().parents[1]


def _write_mnist(directory, prefix, n, seed):
    rng = np.random.default_rng(seed)
    images = rng.integers(0, 256, size=(n, 28, 28), dtype=np.uint8)
    labels = rng.integers(0, 10, size=n, dtype=np.uint8)
    img = directory / f"{prefix}-images-idx3-ubyte.gz"
    lbl = directory / f"{prefix}-labels-idx1-ubyte.gz"
    with gzip.open(img, "wb") as f:
        f.write(struct.pack(">IIII", 2051, n, 28, 28) + images.tobytes())
    with gzip.open(lbl, "wb") as f:
        f.write(struct.pack(">II", 2049, n) + labels.tobytes())
    return str(img), str(lbl), images, labels


@pytest.fixture
def mnist_dir(tmp_path):
    _write_mnist(tmp_path, "train", 60, 1)
    _write_mnist(tmp_path, "t10k", 30, 2)
    return tmp_path


def _softmax64(z):
    e = np.exp(z - z.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def _one_hot(y, k):
    out = np.zeros((len(y), k))
    out[np.arange(len(y)), y] = 1
    return out


# --------------------------------------------------------------------------
# hw1: parse_mnist, softmax_loss, nn_epoch, loss_err
# --------------------------------------------------------------------------


def test_parse_mnist(tmp_path):
    img, lbl, images, labels = _write_mnist(tmp_path, "train", 7, 3)
    X, y = simple_ml.parse_mnist(img, lbl)
    assert X.dtype == np.float32 and X.shape == (7, 784)
    assert y.dtype == np.uint8 and y.shape == (7,)
    np.testing.assert_allclose(X, images.reshape(7, 784) / 255.0, rtol=1e-6)
    np.testing.assert_array_equal(y, labels)


@pytest.mark.parametrize("scale", [1.0, 100.0])
def test_softmax_loss(scale):
    rng = np.random.default_rng(4)
    Z = rng.normal(size=(8, 10)) * scale
    y = rng.integers(0, 10, size=8)
    got = simple_ml.softmax_loss(ndl.Tensor(Z), ndl.Tensor(_one_hot(y, 10)))
    assert isinstance(got, ndl.Tensor)
    lse = np.log(np.exp(Z - Z.max(1, keepdims=True)).sum(1)) + Z.max(1)
    want = np.mean(lse - Z[np.arange(8), y])
    np.testing.assert_allclose(np.asarray(got.numpy()).reshape(-1)[0], want, rtol=1e-5)


def _nn_epoch64(X, y, W1, W2, lr, batch):
    for i in range(0, X.shape[0], batch):
        Xb, yb = X[i : i + batch], y[i : i + batch]
        Z1 = np.maximum(Xb @ W1, 0)
        G2 = _softmax64(Z1 @ W2) - _one_hot(yb, W2.shape[1])
        G1 = (Z1 > 0) * (G2 @ W2.T)
        W1 = W1 - lr * Xb.T @ G1 / Xb.shape[0]
        W2 = W2 - lr * Z1.T @ G2 / Xb.shape[0]
    return W1, W2


@pytest.mark.parametrize("batch", [50, 15])
def test_nn_epoch_matches_numpy(batch):
    np.random.seed(0)
    X = np.random.randn(50, 5).astype(np.float32)
    y = np.random.randint(3, size=(50,)).astype(np.uint8)
    W1 = np.random.randn(5, 10).astype(np.float32) / np.sqrt(10)
    W2 = np.random.randn(10, 3).astype(np.float32) / np.sqrt(3)
    got1, got2 = simple_ml.nn_epoch(X, y, ndl.Tensor(W1), ndl.Tensor(W2), lr=1.0, batch=batch)
    assert isinstance(got1, ndl.Tensor) and isinstance(got2, ndl.Tensor)
    want1, want2 = _nn_epoch64(
        X.astype(np.float64), y, W1.astype(np.float64), W2.astype(np.float64), 1.0, batch
    )
    np.testing.assert_allclose(got1.numpy(), want1, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(got2.numpy(), want2, rtol=1e-4, atol=1e-5)


def test_loss_err():
    rng = np.random.default_rng(5)
    h = rng.normal(size=(12, 4))
    y = rng.integers(0, 4, size=12).astype(np.uint8)
    loss, err = simple_ml.loss_err(ndl.Tensor(h), y)
    lse = np.log(np.exp(h).sum(1))
    np.testing.assert_allclose(
        np.asarray(loss).reshape(-1)[0], np.mean(lse - h[np.arange(12), y]), rtol=1e-5
    )
    assert err == pytest.approx(np.mean(h.argmax(1) != y))


# --------------------------------------------------------------------------
# hw2: the MLP ResNet
# --------------------------------------------------------------------------


def test_mlp_resnet_parameters_follow_the_course():
    np.random.seed(0)
    model = mlp_resnet.MLPResNet(784, hidden_dim=100)
    params = model.parameters()
    # Linear(784,100), 3 x [Linear(100,50), BN(50), Linear(50,100), BN(100)], Linear(100,10)
    shapes = [(784, 100), (1, 100)]
    for _ in range(3):
        shapes += [(100, 50), (1, 50), (50,), (50,), (50, 100), (1, 100), (100,), (100,)]
    shapes += [(100, 10), (1, 10)]
    assert [tuple(p.shape) for p in params] == shapes
    assert sum(int(np.prod(s)) for s in shapes) == 110860
    # The first draw is Linear(784, 100)'s weight: kaiming_uniform, one np.random.rand call.
    np.random.seed(0)
    bound = np.sqrt(2.0) * np.sqrt(3.0 / 784)
    want = np.random.rand(784, 100).astype(np.float32) * (2 * bound) - bound
    np.testing.assert_allclose(params[0].numpy(), want, rtol=1e-5, atol=1e-7)


def test_residual_block_structure_and_forward():
    np.random.seed(1)
    block = mlp_resnet.ResidualBlock(6, 4, norm=nn.LayerNorm1d, drop_prob=0.0)
    assert isinstance(block, nn.Sequential) and len(block.modules) == 2
    assert isinstance(block.modules[0], nn.Residual) and isinstance(block.modules[1], nn.ReLU)
    assert len(block.parameters()) == 8
    x = np.random.randn(3, 6).astype(np.float32)
    out = block(ndl.Tensor(x)).numpy()
    lin1, ln1, _, _, lin2, ln2 = block.modules[0].fn.modules

    def layer_norm(v, w, b):
        mu, var = v.mean(1, keepdims=True), v.var(1, keepdims=True)
        return (v - mu) / np.sqrt(var + 1e-5) * w + b

    h = x.astype(np.float64) @ lin1.weight.numpy() + lin1.bias.numpy()
    h = np.maximum(layer_norm(h, ln1.w.numpy(), ln1.b.numpy()), 0)
    h = h @ lin2.weight.numpy() + lin2.bias.numpy()
    want = np.maximum(x + layer_norm(h, ln2.w.numpy(), ln2.b.numpy()), 0)
    np.testing.assert_allclose(out, want, rtol=1e-4, atol=1e-5)


def test_epoch_train_and_evaluate(mnist_dir):
    train = ndl.data.MNISTDataset(
        str(mnist_dir / "train-images-idx3-ubyte.gz"), str(mnist_dir / "train-labels-idx1-ubyte.gz")
    )
    loader = ndl.data.DataLoader(train, batch_size=16)
    np.random.seed(0)
    model = mlp_resnet.MLPResNet(784, hidden_dim=32, num_blocks=1)
    opt = ndl.optim.Adam(model.parameters(), lr=0.01)
    losses = [mlp_resnet.epoch(loader, model, opt)[1] for _ in range(5)]
    assert losses[-1] < losses[0]
    err, loss = simple_ml.evaluate_mnist(model, loader)
    assert 0.0 <= err <= 1.0 and np.isfinite(loss)
    # The evaluation numbers, recomputed by hand.
    model.eval()
    logits = model(ndl.Tensor(train.images)).numpy().astype(np.float64)
    lse = np.log(np.exp(logits - logits.max(1, keepdims=True)).sum(1)) + logits.max(1)
    labels = train.labels.astype(np.int64)
    assert err == pytest.approx(np.mean(logits.argmax(1) != labels))
    assert loss == pytest.approx(np.mean(lse - logits[np.arange(len(labels)), labels]), rel=1e-4)


def test_train_mnist(mnist_dir):
    result = simple_ml.train_mnist(batch_size=20, epochs=2, hidden_dim=16, data_dir=str(mnist_dir))
    assert len(result) == 4
    assert all(np.isfinite(v) for v in result)
    assert 0 <= result[0] <= 1 and 0 <= result[2] <= 1
    again = mlp_resnet.train_mnist(batch_size=20, epochs=2, hidden_dim=16, data_dir=str(mnist_dir))
    np.testing.assert_allclose(again, result)  # seeded: reproducible


def test_course_layout_shims():
    code = (
        "import sys, needle.apps; sys.path.append(needle.apps.COURSE_LAYOUT_DIR); "
        "from mlp_resnet import *; from simple_ml import *; "
        "import numpy as np; np.random.seed(0); "
        "m = MLPResNet(784, 100); print(len(m.parameters()), callable(train_mnist), "
        "callable(nn_epoch), callable(epoch))"
    )
    env = {"PYTHONPATH": str(REPO / "python"), "PATH": "/usr/bin:/bin"}
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["28", "True", "True", "True"]


def test_course_layout_as_the_apps_package(tmp_path):
    # hw4's tests run from the course folder and import `apps.models` and `apps.simple_ml`
    # (apps/ a namespace package); the shims folder linked as apps/ serves them.
    import needle.apps

    (tmp_path / "apps").symlink_to(needle.apps.COURSE_LAYOUT_DIR)
    code = (
        "import sys; sys.path.append('.'); import numpy as np; np.random.seed(0); "
        "from apps.models import ResNet9, LanguageModel; from apps.simple_ml import *; "
        "import needle.apps.models as m; "
        "print(ResNet9 is m.ResNet9, LanguageModel is m.LanguageModel, callable(train_ptb), "
        "len(LanguageModel(4, 10, 6).parameters()))"
    )
    env = {"PYTHONPATH": os.pathsep.join(sys.path), "PATH": "/usr/bin:/bin"}
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["True", "True", "True", "7"]
