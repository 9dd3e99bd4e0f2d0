"""The course's ``apps/simple_ml.py`` training loops, for needle's default (cycle-free) graph mode.

- MNIST (hw1/hw2): :func:`parse_mnist`, :func:`softmax_loss`, :func:`nn_epoch` (the two-layer
  network trained by hand with needle's autograd), :func:`loss_err`; and the MLP ResNet's
  :func:`epoch`, :func:`train_mnist`, :func:`evaluate_mnist` (from :mod:`.mlp_resnet`).
- PTB language modelling: :func:`epoch_general_ptb`, :func:`train_ptb`, :func:`evaluate_ptb`.
- CIFAR-10 image classification: :func:`epoch_general_cifar10`, :func:`train_cifar10`,
  :func:`evaluate_cifar10` (the hw4 versions).

Signatures, defaults, RNG use (``np.random.seed(4)`` at the start of every epoch) and return
values ``(accuracy, loss)`` follow the course. Differences:

- No ``gc.collect()`` and no ``del`` of the batch's tensors: in needle's default graph mode a
  step's graph is freed by reference counting as soon as the loop rebinds its names, so device
  memory stays flat without the collector (the course needed both to keep VRAM in check).
- The returned loss is a Python float (the course returned a 1-element NumPy array).
- Evaluation (``opt=None``) runs under ``ndl.no_grad()``: same numbers, no graph recorded.
- ``clip`` works with every optimizer (``clip_grad_norm`` exists on all of them here).
- ``progress`` shows the step, the batch loss and ``ndl.memory.memory_allocated(device)``:
  None (nothing), True (a tqdm bar when tqdm is installed, else a line every few steps on
  stderr) or a callable ``progress(step, loss, allocated_bytes)`` called after every step
  (step counts from 1 within the epoch, loss is the batch's mean loss as a float).
"""

import contextlib
import sys

import numpy as np

import needle as ndl
from needle import nn, optim
from needle.data import get_batch
from needle.data.datasets.mnist_dataset import parse_mnist as _parse_idx
from needle.memory import _format_bytes as format_bytes  # train_ptb imports it from here

from .mlp_resnet import epoch, evaluate_mnist, train_mnist  # noqa: F401
from .models import *  # noqa: F401,F403  (the course's simple_ml imports apps.models)

device = ndl.cpu()


# --------------------------------------------------------------------------
# progress reporting
# --------------------------------------------------------------------------


class _LinePrinter:
    """Prints 'desc step i/total loss ... allocated ...' on the first step, every ``every``
    steps and on the last step."""

    def __init__(self, total, desc, stream=None):
        self.total = total
        self.desc = desc
        self.every = max(1, total // 10)
        self.stream = stream if stream is not None else sys.stderr

    def __call__(self, step, loss, allocated):
        if step == 1 or step % self.every == 0 or step == self.total:
            print(
                f"{self.desc} step {step}/{self.total}  loss {loss:.4f}  "
                f"allocated {format_bytes(allocated)}",
                file=self.stream,
                flush=True,
            )

    def close(self):
        pass


class _TqdmBar:
    """A tqdm bar whose postfix shows the batch loss and the allocated device memory."""

    def __init__(self, tqdm, total, desc):
        self.bar = tqdm(total=total, desc=desc, unit="batch", leave=False)

    def __call__(self, step, loss, allocated):
        self.bar.set_postfix(loss=f"{loss:.4f}", mem=format_bytes(allocated), refresh=False)
        self.bar.update(1)

    def close(self):
        self.bar.close()


def _make_progress(progress, total, desc):
    """(report, close): report(step, loss, allocated_bytes) or None, and a close callable."""
    if progress is None or progress is False:
        return None, lambda: None
    if progress is True:
        try:
            from tqdm.auto import tqdm
        except ImportError:
            reporter = _LinePrinter(total, desc)
        else:
            reporter = _TqdmBar(tqdm, total, desc)
        return reporter, reporter.close
    if callable(progress):
        return progress, lambda: None
    raise TypeError(
        f"progress must be None, True or a callable(step, loss, allocated_bytes), "
        f"got {type(progress).__name__}"
    )


# --------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------


def _loss_instance(loss_fn):
    """``loss_fn`` itself, or an instance when it is a class (the course passes classes to
    train/evaluate and instances to the epoch function)."""
    return loss_fn() if isinstance(loss_fn, type) else loss_fn


def _detach(h):
    """``h`` cut from its graph: None, a Tensor, or a tuple/list of them (LSTM's (h, c))."""
    if h is None:
        return None
    if isinstance(h, (tuple, list)):
        return tuple(_detach(e) for e in h)
    return h.detach()


def _scalar(loss):
    """The loss Tensor's value as a Python float (needle's sum gives shape (1,))."""
    return float(np.asarray(loss.numpy()).reshape(-1)[0])


def _num_correct(logits, y):
    """How many rows of logits (N, C) have their argmax equal to the labels y (N,)."""
    return int(np.sum(np.argmax(logits.numpy(), axis=1) == y.numpy().reshape(-1)))


# --------------------------------------------------------------------------
# MNIST (hw1 / hw2)
# --------------------------------------------------------------------------


def parse_mnist(image_filesname, label_filename):
    """Reads MNIST's IDX image and label files (gzip-compressed or not).

    Returns ``(X, y)``: X float32 (N, rows*cols) with pixels scaled to [0, 1] (divided by
    255), y uint8 (N,). (The course's argument is spelled ``image_filesname``.)"""
    X, y, _ = _parse_idx(image_filesname, label_filename)
    return X, y


def softmax_loss(Z, y_one_hot):
    """Mean softmax (cross-entropy) loss of logits Z (N, k) against one-hot labels (N, k),
    both Tensors; a Tensor. The course's ``log(sum(exp(Z)))`` is computed as ``logsumexp`` (the
    same value, without overflow for large logits)."""
    lse = ndl.logsumexp(Z, axes=(1,))
    return (lse.sum() - (Z * y_one_hot).sum()) / Z.shape[0]


def _one_hot(y, k):
    y = np.asarray(y).astype(np.int64).reshape(-1)
    out = np.zeros((y.shape[0], k), dtype=np.float32)
    out[np.arange(y.shape[0]), y] = 1
    return out


def nn_epoch(X, y, W1, W2, lr=0.1, batch=100):
    """One epoch of minibatch SGD on the two-layer network ``relu(X W1) W2`` with
    :func:`softmax_loss`, in order over the rows of X (NumPy (N, n)), labels y (NumPy (N,)).
    W1 (n, hidden) and W2 (hidden, k) are Tensors; returns the updated ``(W1, W2)`` (new
    Tensors, as the course's)."""
    k = W2.shape[1]
    for start in range(0, X.shape[0], batch):
        Xb = ndl.Tensor(X[start : start + batch], device=W1.device, requires_grad=False)
        yb = _one_hot(y[start : start + batch], k)
        yb = ndl.Tensor(yb, device=W1.device, requires_grad=False)
        loss = softmax_loss(ndl.relu(Xb @ W1) @ W2, yb)
        loss.backward()
        W1 = ndl.Tensor(W1.realize_cached_data() - lr * W1.grad.realize_cached_data())
        W2 = ndl.Tensor(W2.realize_cached_data() - lr * W2.grad.realize_cached_data())
    return W1, W2


def loss_err(h, y):
    """``(softmax loss as a NumPy value, error rate)`` of logits h (Tensor (N, k)) against
    labels y (NumPy (N,))."""
    y_ = ndl.Tensor(_one_hot(y, h.shape[-1]), device=h.device, requires_grad=False)
    return softmax_loss(h, y_).numpy(), np.mean(h.numpy().argmax(axis=1) != np.asarray(y))


# --------------------------------------------------------------------------
# CIFAR-10 (hw4)
# --------------------------------------------------------------------------


def _num_batches(dataloader):
    """Batches per epoch of ``dataloader`` (0 when unknown)."""
    try:
        return len(dataloader)
    except TypeError:
        dataset = getattr(dataloader, "dataset", None)
        bs = getattr(dataloader, "batch_size", None)
        if dataset is None or not bs:
            return 0
        return -(-len(dataset) // bs)


def epoch_general_cifar10(dataloader, model, loss_fn=nn.SoftmaxLoss(), opt=None, progress=None):
    """One pass over ``dataloader``: trains when ``opt`` is given, evaluates otherwise.

    Seeds NumPy's RNG with 4, sets train/eval mode, and for each batch (X, y) computes
    logits = model(X) and loss_fn(logits, y) (then reset_grad, backward, step when training).

    Returns (avg_acc, avg_loss): Python floats, the fraction of correctly classified samples
    and the mean loss per sample, both over N = len(dataloader.dataset).
    """
    np.random.seed(4)
    loss_fn = _loss_instance(loss_fn)
    training = opt is not None
    if training:
        model.train()
    else:
        model.eval()
    total_loss, correct, seen = 0.0, 0, 0
    report, close = _make_progress(
        progress, _num_batches(dataloader), "train" if training else "eval"
    )
    grad_mode = contextlib.nullcontext() if training else ndl.no_grad()
    try:
        with grad_mode:
            for step, batch in enumerate(dataloader, 1):
                X, y = batch[0], batch[1]
                logits = model(X)
                loss = loss_fn(logits, y)
                if training:
                    opt.reset_grad()
                    loss.backward()
                    opt.step()
                batch_loss = _scalar(loss)
                total_loss += batch_loss * y.shape[0]
                correct += _num_correct(logits, y)
                seen += y.shape[0]
                if report is not None:
                    report(step, batch_loss, ndl.memory.memory_allocated(X.device))
    finally:
        close()
    n = len(dataloader.dataset) if hasattr(dataloader, "dataset") else seen
    if n == 0:
        raise ValueError("epoch_general_cifar10: the data loader yielded no samples")
    return correct / n, total_loss / n


def train_cifar10(
    model,
    dataloader,
    n_epochs=1,
    optimizer=optim.Adam,
    lr=0.001,
    weight_decay=0.001,
    loss_fn=nn.SoftmaxLoss,
    progress=None,
):
    """Trains ``model`` for ``n_epochs`` epochs with ``optimizer(model.parameters(), lr=,
    weight_decay=)``.

    Returns (avg_acc, avg_loss) of the last epoch (Python floats, per sample).
    """
    if n_epochs < 1:
        raise ValueError(f"train_cifar10: n_epochs must be >= 1, got {n_epochs}")
    np.random.seed(4)
    opt = optimizer(model.parameters(), lr=lr, weight_decay=weight_decay)
    for _ in range(n_epochs):
        avg_acc, avg_loss = epoch_general_cifar10(
            dataloader, model, loss_fn=_loss_instance(loss_fn), opt=opt, progress=progress
        )
    return avg_acc, avg_loss


def evaluate_cifar10(model, dataloader, loss_fn=nn.SoftmaxLoss, progress=None):
    """Evaluates ``model`` over ``dataloader`` once (eval mode, no graph recorded).

    Returns (avg_acc, avg_loss): Python floats, per sample.
    """
    np.random.seed(4)
    return epoch_general_cifar10(
        dataloader, model, loss_fn=_loss_instance(loss_fn), opt=None, progress=progress
    )


# --------------------------------------------------------------------------
# PTB language modelling (hw4_extra)
# --------------------------------------------------------------------------


def epoch_general_ptb(
    data,
    model,
    seq_len=40,
    loss_fn=nn.SoftmaxLoss(),
    opt=None,
    clip=None,
    device=None,
    dtype="float32",
    progress=None,
):
    """One pass over batchified token ids: trains when ``opt`` is given, evaluates otherwise.

    data: NumPy array (nbatch, bs) from ``ndl.data.batchify``. The pass walks
    ``i = 0, seq_len, 2*seq_len, ... < nbatch - 1``; each step takes
    ``X, y = get_batch(data, i, seq_len)`` (X (L, bs), y (L*bs,), L <= seq_len, the last one
    possibly shorter), cuts the carried hidden state from the previous graph (each element of
    LSTM's (h, c) tuple), runs ``logits, h = model(X, h)`` and ``loss_fn(logits, y)``, and when
    training: ``opt.reset_grad()``, ``loss.backward()``, ``opt.clip_grad_norm(clip)`` if clip,
    ``opt.step()``. Seeds NumPy's RNG with 4 first. Uses no gc.collect(): each step's graph
    is freed when the next step rebinds the names.

    ``model`` may be a ``needle.distributed.DistributedDataParallel`` with ``data`` this rank's
    columns (``needle.distributed.ptb_rank_columns``): its ``backward()`` averages the gradients
    over the ranks, as any DDP model's does, and the returned figures are over every rank's
    tokens (so N ranks at batch B/N report what one process at batch B does).

    Returns (avg_acc, avg_loss): Python floats, the next-token accuracy and the mean loss per
    token over all L*bs target tokens of the pass. Raises ValueError when ``data`` has fewer
    than 2 rows (no batch to take).
    """
    np.random.seed(4)
    loss_fn = _loss_instance(loss_fn)
    training = opt is not None
    if training:
        model.train()
    else:
        model.eval()
    nbatch = data.shape[0]
    starts = range(0, nbatch - 1, seq_len)
    if len(starts) == 0:
        raise ValueError(
            f"epoch_general_ptb: data has {nbatch} row(s) of shape {tuple(data.shape)}; at least 2 "
            f"are needed (use a smaller batch size or more text)"
        )
    report, close = _make_progress(progress, len(starts), "train" if training else "eval")
    grad_mode = contextlib.nullcontext() if training else ndl.no_grad()
    # A DistributedDataParallel model averages its gradients inside backward(); the figures
    # returned cover every rank's tokens (sum_across_ranks, below).
    total_loss, correct, tokens = 0.0, 0, 0
    h = None
    try:
        with grad_mode:
            for step, i in enumerate(starts, 1):
                X, y = get_batch(data, i, seq_len, device=device, dtype=dtype)
                h = _detach(h)
                logits, h = model(X, h)
                loss = loss_fn(logits, y)
                if training:
                    opt.reset_grad()
                    loss.backward()
                    if clip:
                        opt.clip_grad_norm(clip)
                    opt.step()
                n = y.shape[0]
                batch_loss = _scalar(loss)
                total_loss += batch_loss * n
                correct += _num_correct(logits, y)
                tokens += n
                if report is not None:
                    report(step, batch_loss, ndl.memory.memory_allocated(device))
    finally:
        close()
    sum_across_ranks = getattr(model, "sum_across_ranks", None)
    if sum_across_ranks is not None:
        total_loss, correct, tokens = sum_across_ranks([total_loss, correct, tokens])
    return correct / tokens, total_loss / tokens


def train_ptb(
    model,
    data,
    seq_len=40,
    n_epochs=1,
    optimizer=optim.SGD,
    lr=4.0,
    weight_decay=0.0,
    loss_fn=nn.SoftmaxLoss,
    clip=None,
    device=None,
    dtype="float32",
    progress=None,
):
    """Trains ``model`` on ``data`` (NumPy (nbatch, bs) from batchify) for ``n_epochs`` epochs
    of :func:`epoch_general_ptb`, with ``optimizer(model.parameters(), lr=, weight_decay=)``.

    Returns (avg_acc, avg_loss) of the last epoch: Python floats, per token.
    """
    if n_epochs < 1:
        raise ValueError(f"train_ptb: n_epochs must be >= 1, got {n_epochs}")
    np.random.seed(4)
    opt = optimizer(model.parameters(), lr=lr, weight_decay=weight_decay)
    for _ in range(n_epochs):
        avg_acc, avg_loss = epoch_general_ptb(
            data,
            model,
            seq_len=seq_len,
            loss_fn=_loss_instance(loss_fn),
            opt=opt,
            clip=clip,
            device=device,
            dtype=dtype,
            progress=progress,
        )
    return avg_acc, avg_loss


def evaluate_ptb(
    model, data, seq_len=40, loss_fn=nn.SoftmaxLoss, device=None, dtype="float32", progress=None
):
    """Evaluates ``model`` on ``data`` (NumPy (nbatch, bs) from batchify) once: eval mode, no
    graph recorded, hidden state carried across batches as in training.

    Returns (avg_acc, avg_loss): Python floats, per token.
    """
    np.random.seed(4)
    return epoch_general_ptb(
        data,
        model,
        seq_len=seq_len,
        loss_fn=_loss_instance(loss_fn),
        opt=None,
        device=device,
        dtype=dtype,
        progress=progress,
    )
