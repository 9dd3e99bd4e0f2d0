"""The course's hw2 ``apps/mlp_resnet.py``: an MLP ResNet for MNIST and its training loop.

``ResidualBlock``, ``MLPResNet``, ``epoch`` and ``train_mnist`` have the course's signatures,
module structure (so ``parameters()`` come in the course's order) and NumPy RNG use: building a
model draws the Linear initialisations in creation order, ``epoch`` calls ``np.random.seed(4)``
first (Dropout then draws the course's masks) and ``train_mnist`` seeds 4 before shuffling.
``evaluate_mnist`` is needle's addition, the evaluation half of ``train_mnist``.

Differences from the course's file:

- Importing it does not call ``np.random.seed(0)`` (as ``needle.apps.models``); seed before
  building a model.
- ``epoch`` returns ``(error rate, mean loss)`` as Python floats and runs evaluation under
  ``ndl.no_grad()`` (same numbers, no graph recorded).

Course tests that do ``sys.path.append("./apps"); from mlp_resnet import *`` find it through
the shim in ``needle.apps.COURSE_LAYOUT_DIR`` (used as their ``apps/`` folder).
"""

import os

import numpy as np

import needle as ndl
from needle import nn

__all__ = ["ResidualBlock", "MLPResNet", "epoch", "train_mnist", "evaluate_mnist"]


def ResidualBlock(dim, hidden_dim, norm=nn.BatchNorm1d, drop_prob=0.1):
    """Residual(Linear(dim, hidden) -> norm -> ReLU -> Dropout -> Linear(hidden, dim) -> norm),
    then ReLU."""
    return nn.Sequential(
        nn.Residual(
            nn.Sequential(
                nn.Linear(dim, hidden_dim),
                norm(hidden_dim),
                nn.ReLU(),
                nn.Dropout(drop_prob),
                nn.Linear(hidden_dim, dim),
                norm(dim),
            )
        ),
        nn.ReLU(),
    )


def MLPResNet(
    dim, hidden_dim=100, num_blocks=3, num_classes=10, norm=nn.BatchNorm1d, drop_prob=0.1
):
    """Linear(dim, hidden) -> ReLU -> num_blocks ResidualBlock(hidden, hidden // 2) ->
    Linear(hidden, num_classes)."""
    return nn.Sequential(
        nn.Linear(dim, hidden_dim),
        nn.ReLU(),
        *[ResidualBlock(hidden_dim, hidden_dim // 2, norm, drop_prob) for _ in range(num_blocks)],
        nn.Linear(hidden_dim, num_classes),
    )


def _flatten(X):
    """(N, 28, 28, 1) batches of the MNIST loader become (N, 784)."""
    if len(X.shape) == 2:
        return X
    return X.reshape((X.shape[0], int(np.prod(X.shape[1:]))))


def epoch(dataloader, model, opt=None):
    """One pass over dataloader: training when opt is given (reset_grad, backward, step per
    batch), else evaluation. Returns ``(error rate, mean loss)`` over the dataset."""
    np.random.seed(4)
    loss_fn = nn.SoftmaxLoss()
    model.train() if opt is not None else model.eval()
    errors, total_loss, count = 0.0, 0.0, 0
    for X, y in dataloader:
        X = _flatten(X)
        if opt is None:
            with ndl.no_grad():
                logits = model(X)
                loss = loss_fn(logits, y)
        else:
            logits = model(X)
            loss = loss_fn(logits, y)
            opt.reset_grad()
            loss.backward()
            opt.step()
        labels = y.numpy()
        errors += float(np.sum(logits.numpy().argmax(axis=1) != labels))
        total_loss += float(loss.numpy().reshape(-1)[0]) * labels.shape[0]
        count += labels.shape[0]
    n = len(dataloader.dataset) if hasattr(dataloader, "dataset") else count
    if n == 0:
        raise ValueError("epoch: the data loader yielded no samples")
    return errors / n, total_loss / n


def _mnist_loaders(batch_size, data_dir):
    train_set = ndl.data.MNISTDataset(
        os.path.join(data_dir, "train-images-idx3-ubyte.gz"),
        os.path.join(data_dir, "train-labels-idx1-ubyte.gz"),
    )
    test_set = ndl.data.MNISTDataset(
        os.path.join(data_dir, "t10k-images-idx3-ubyte.gz"),
        os.path.join(data_dir, "t10k-labels-idx1-ubyte.gz"),
    )
    return (
        ndl.data.DataLoader(train_set, batch_size=batch_size, shuffle=True),
        ndl.data.DataLoader(test_set, batch_size=batch_size, shuffle=False),
    )


def train_mnist(
    batch_size=100,
    epochs=10,
    optimizer=ndl.optim.Adam,
    lr=0.001,
    weight_decay=0.001,
    hidden_dim=100,
    data_dir="data",
):
    """Trains MLPResNet(784, hidden_dim) on ``data_dir``'s MNIST files (the course's names:
    ``train-images-idx3-ubyte.gz``, ``t10k-labels-idx1-ubyte.gz``, ...) for ``epochs`` epochs.
    Returns ``(train error, train loss, test error, test loss)``: the last training epoch's and
    one evaluation pass over the test set."""
    np.random.seed(4)
    train_loader, test_loader = _mnist_loaders(batch_size, data_dir)
    model = MLPResNet(784, hidden_dim=hidden_dim)
    opt = optimizer(model.parameters(), lr=lr, weight_decay=weight_decay)
    train_err, train_loss = float("nan"), float("nan")
    for _ in range(epochs):
        train_err, train_loss = epoch(train_loader, model, opt)
    test_err, test_loss = epoch(test_loader, model)
    return train_err, train_loss, test_err, test_loss


def evaluate_mnist(model, dataloader):
    """One evaluation pass (no optimizer): ``(error rate, mean loss)``."""
    return epoch(dataloader, model)
