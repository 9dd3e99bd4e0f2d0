"""Tests of ``needle.apps``: the LanguageModel and ResNet9 models, the simple_ml training loops
(PTB and CIFAR-10), device memory staying flat over training steps without the garbage
collector, and the ``python -m needle.apps.train_ptb`` script.

Data: needle's own synthetic PTB-format corpus (written to a temporary directory), plus the real
PTB valid/test text at ``../shared/data/ptb`` when that folder exists (skipped otherwise).
"""

import dataclasses
import gc
import math
import os
import pathlib
import shutil
import subprocess
import sys

import numpy as np
import pytest

import needle as ndl
from needle import nn, optim
from needle.apps import simple_ml, train_ptb
from needle.apps.course_config import COURSE
from needle.apps.models import LanguageModel, ResNet9
from needle.data import Corpus, batchify, get_batch, write_synthetic_corpus

PTB_DIR = pathlib.Path(__file__).resolve().parents[2] / "shared" / "data" / "ptb"
REPO = pathlib.Path(__file__).resolve().parents[1]

SEQ_MODELS = ("rnn", "lstm", "transformer")


def n_params(model):
    return sum(int(np.prod(p.shape)) for p in model.parameters())


@pytest.fixture(scope="module")
def corpus_dir(tmp_path_factory):
    """A small synthetic corpus: about 12k training tokens over a vocabulary of <= 300."""
    path = tmp_path_factory.mktemp("synthetic_ptb")
    write_synthetic_corpus(str(path), num_words=14_000, seed=0, vocab_size=300)
    return path


@pytest.fixture(scope="module")
def corpus(corpus_dir):
    return Corpus(str(corpus_dir))


class LossRecorder:
    """A progress callable recording each step's loss and allocated bytes."""

    def __init__(self):
        self.steps, self.losses, self.allocated = [], [], []

    def __call__(self, step, loss, allocated):
        self.steps.append(step)
        self.losses.append(loss)
        self.allocated.append(allocated)


# --------------------------------------------------------------------------
# models
# --------------------------------------------------------------------------


def token_batch(rng, seq_len, bs, vocab):
    return ndl.Tensor(
        rng.integers(0, vocab, size=(seq_len, bs)).astype(np.float32), requires_grad=False
    )


@pytest.mark.parametrize("seq_model", SEQ_MODELS)
def test_language_model_shapes(seq_model):
    rng = np.random.default_rng(0)
    vocab, emb, hidden, layers, seq_len, bs = 30, 8, 12, 2, 5, 3
    model = LanguageModel(emb, vocab, hidden, num_layers=layers, seq_model=seq_model)
    x = token_batch(rng, seq_len, bs, vocab)
    logits, h = model(x)
    assert logits.shape == (seq_len * bs, vocab)
    if seq_model == "rnn":
        assert h.shape == (layers, bs, hidden)
    elif seq_model == "lstm":
        assert isinstance(h, tuple) and len(h) == 2
        assert h[0].shape == (layers, bs, hidden) and h[1].shape == (layers, bs, hidden)
    # the state goes back in (the transformer ignores it)
    logits2, _ = model(token_batch(rng, seq_len, bs, vocab), h)
    assert logits2.shape == (seq_len * bs, vocab)
    assert np.all(np.isfinite(logits2.numpy()))
    # the output layer reads the sequence model's width
    width = emb if seq_model == "transformer" else hidden
    assert model.linear.weight.shape == (width, vocab)
    assert model.emd is model.embedding


@pytest.mark.parametrize("seq_model", SEQ_MODELS)
def test_language_model_creation_order(seq_model):
    """Embedding first (its randn is the first draw), the output Linear last."""
    np.random.seed(0)
    model = LanguageModel(6, 11, 7, seq_model=seq_model)
    np.random.seed(0)
    expected = np.random.randn(11, 6).astype(np.float32)
    params = model.parameters()
    np.testing.assert_array_equal(params[0].numpy(), expected)
    assert params[-2] is model.linear.weight and params[-1] is model.linear.bias


def test_language_model_unknown_seq_model():
    with pytest.raises(ValueError, match="gru"):
        LanguageModel(8, 30, 12, seq_model="gru")


def test_import_does_not_seed_numpy():
    code = (
        "import numpy as np; np.random.seed(5); "
        "import needle.apps.models, needle.apps.simple_ml, needle.apps.train_ptb; "
        "a = np.random.rand(); np.random.seed(5); assert a == np.random.rand(), a"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=120
    )
    assert proc.returncode == 0, proc.stderr


def test_resnet9_parameters_and_shape():
    model = ResNet9()
    assert n_params(model) == 431_946
    x = ndl.Tensor(np.random.default_rng(0).standard_normal((2, 3, 32, 32)).astype(np.float32))
    assert model(x).shape == (2, 10)


def torch_language_model(torch, seq_model, params, x, num_layers, num_head=8, dim_head=32):
    """The LanguageModel's forward written with torch functions on the needle model's
    parameters (torch tensors in needle's creation order and layout); returns the logits."""
    F = torch.nn.functional
    it = iter(params)
    emb = next(it)
    seq, bs = x.shape
    out = emb[x]  # (L, bs, E)
    if seq_model in ("rnn", "lstm"):
        for _ in range(num_layers):
            w_ih, w_hh, b_ih, b_hh = next(it), next(it), next(it), next(it)
            hidden = w_hh.shape[0]
            h = torch.zeros(bs, hidden)
            c = torch.zeros(bs, hidden)
            outs = []
            for t in range(seq):
                pre = out[t] @ w_ih + b_ih + h @ w_hh + b_hh
                if seq_model == "rnn":
                    h = torch.tanh(pre)
                else:
                    i, f, g, o = pre.split(hidden, dim=1)
                    c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
                    h = torch.sigmoid(o) * torch.tanh(c)
                outs.append(h)
            out = torch.stack(outs)
    else:
        pos = next(it)
        x_b = out.transpose(0, 1) + pos[:seq][None]  # (bs, L, E)
        for _ in range(num_layers):
            d = x_b.shape[-1]
            norms = [(next(it), next(it)) for _ in range(3)]
            wq, wk, wv, wo = next(it), next(it), next(it), next(it)

            def heads(t):
                return t.reshape(bs, seq, num_head, dim_head).transpose(1, 2)

            q, k, v = (
                heads(F.layer_norm(x_b, (d,), w, b, 1e-5) @ proj)
                for (w, b), proj in zip(norms, (wq, wk, wv))
            )
            scores = q @ k.transpose(2, 3) / dim_head**0.5
            scores = scores.masked_fill(torch.ones(seq, seq, dtype=torch.bool).triu(1), -1e30)
            att = (torch.softmax(scores, 3) @ v).transpose(1, 2).reshape(bs, seq, -1)
            x_b = x_b + att @ wo
            ln_w, ln_b, w1, b1, w2, b2 = (next(it) for _ in range(6))
            x_b = x_b + torch.relu(F.layer_norm(x_b, (d,), ln_w, ln_b, 1e-5) @ w1 + b1) @ w2 + b2
        out = x_b.transpose(0, 1)
    lin_w, lin_b = next(it), next(it)
    assert next(it, None) is None
    return out.reshape(seq * bs, -1) @ lin_w + lin_b


@pytest.mark.parametrize("seq_model", SEQ_MODELS)
def test_language_model_matches_torch(seq_model):
    """Logits and every parameter's gradient agree with the same model written in PyTorch."""
    torch = pytest.importorskip("torch")
    vocab, emb, hidden, layers, seq_len, bs = 23, 8, 12, 2, 6, 3
    np.random.seed(0)
    model = LanguageModel(emb, vocab, hidden, num_layers=layers, seq_model=seq_model)
    tokens = np.random.default_rng(1).integers(0, vocab, size=(seq_len, bs))
    target = np.random.default_rng(2).integers(0, vocab, size=seq_len * bs)
    logits, _ = model(ndl.Tensor(tokens.astype(np.float32), requires_grad=False))
    loss = nn.SoftmaxLoss()(logits, ndl.Tensor(target.astype(np.float32), requires_grad=False))
    loss.backward()

    t_params = [torch.tensor(p.numpy(), requires_grad=True) for p in model.parameters()]
    t_logits = torch_language_model(torch, seq_model, t_params, torch.from_numpy(tokens), layers)
    t_loss = torch.nn.functional.cross_entropy(t_logits, torch.from_numpy(target))
    t_loss.backward()
    np.testing.assert_allclose(logits.numpy(), t_logits.detach().numpy(), rtol=1e-4, atol=1e-4)
    assert float(loss.numpy().reshape(-1)[0]) == pytest.approx(t_loss.item(), rel=1e-5)
    for p, t in zip(model.parameters(), t_params):
        np.testing.assert_allclose(p.grad.numpy(), t.grad.numpy(), rtol=1e-3, atol=1e-5)


# --------------------------------------------------------------------------
# training loops
# --------------------------------------------------------------------------


def numpy_loss_and_correct(logits, y):
    """Independent cross-entropy (summed) and correct count of logits (N, C) vs labels (N,)."""
    z = logits.astype(np.float64)
    z = z - z.max(axis=1, keepdims=True)
    logp = z - np.log(np.exp(z).sum(axis=1, keepdims=True))
    labels = y.astype(np.int64)
    nll = -logp[np.arange(len(labels)), labels]
    return nll.sum(), int((logits.argmax(axis=1) == labels).sum())


TRAIN_CONFIGS = {
    "rnn": dict(seq_len=10, lr=1e-2, bs=16),
    "lstm": dict(seq_len=10, lr=1e-2, bs=16),
    "transformer": dict(seq_len=10, lr=1e-2, bs=16),
}


@pytest.mark.parametrize("seq_model", SEQ_MODELS)
def test_training_lowers_loss(seq_model, corpus):
    cfg = TRAIN_CONFIGS[seq_model]
    data = batchify(corpus.train, cfg["bs"], None, "float32")
    steps = 48
    data = data[: steps * cfg["seq_len"] + 1]
    np.random.seed(0)
    model = LanguageModel(16, len(corpus.dictionary), 32, seq_model=seq_model)
    rec = LossRecorder()
    acc, loss = simple_ml.train_ptb(
        model,
        data,
        seq_len=cfg["seq_len"],
        n_epochs=1,
        optimizer=optim.Adam,
        lr=cfg["lr"],
        progress=rec,
    )
    assert rec.steps == list(range(1, steps + 1))
    first, last = np.mean(rec.losses[:8]), np.mean(rec.losses[-8:])
    assert last < first - 0.3, (first, last)
    assert isinstance(acc, float) and isinstance(loss, float)
    assert 0.0 <= acc <= 1.0
    assert loss == pytest.approx(np.mean(rec.losses), rel=1e-5)  # equal-size batches


@pytest.mark.parametrize("seq_model", ("rnn", "lstm"))
def test_rnn_lstm_train_long_sequences(seq_model, corpus):
    """The course's seq_len (20-40): backward through split/stack of more than 8 parts (the C
    core once limited untracked ops to 8 inputs)."""
    data = batchify(corpus.train, 8, None, "float32")[:41]
    np.random.seed(0)
    model = LanguageModel(8, len(corpus.dictionary), 8, seq_model=seq_model)
    acc, loss = simple_ml.train_ptb(
        model, data, seq_len=20, n_epochs=1, optimizer=optim.Adam, lr=1e-2
    )
    assert 0.0 <= acc <= 1.0 and math.isfinite(loss)


@pytest.mark.parametrize("seq_model", ("lstm", "transformer"))
def test_evaluate_ptb_matches_independent_loss(seq_model, corpus):
    seq_len, bs = 7, 16
    data = batchify(corpus.train, bs, None, "float32")[:60]  # 9 batches, the last of 3 rows
    np.random.seed(0)
    model = LanguageModel(12, len(corpus.dictionary), 16, seq_model=seq_model)
    acc, loss = simple_ml.evaluate_ptb(model, data, seq_len=seq_len)
    assert model.training is False
    assert 0.0 <= acc <= 1.0

    total, correct, tokens, h = 0.0, 0, 0, None
    with ndl.no_grad():
        for i in range(0, data.shape[0] - 1, seq_len):
            X, y = get_batch(data, i, seq_len)
            if isinstance(h, tuple):
                h = tuple(t.detach() for t in h)
            elif h is not None:
                h = h.detach()
            logits, h = model(X, h)
            s, c = numpy_loss_and_correct(logits.numpy(), y.numpy())
            total, correct, tokens = total + s, correct + c, tokens + y.shape[0]
    assert tokens == (data.shape[0] - 1) * bs
    assert loss == pytest.approx(total / tokens, rel=1e-5)
    assert acc == pytest.approx(correct / tokens, abs=1e-12)


def test_train_ptb_sgd_with_clip(corpus):
    data = batchify(corpus.train, 16, None, "float32")[:41]
    np.random.seed(0)
    model = LanguageModel(8, len(corpus.dictionary), 8, seq_model="rnn")
    before = [p.numpy().copy() for p in model.parameters()]
    acc, loss = simple_ml.train_ptb(model, data, seq_len=8, n_epochs=2, lr=4.0, clip=0.25)
    assert 0.0 <= acc <= 1.0 and math.isfinite(loss)
    assert model.training is True
    assert any(not np.array_equal(b, p.numpy()) for b, p in zip(before, model.parameters()))
    with pytest.raises(ValueError):
        simple_ml.train_ptb(model, data, seq_len=8, n_epochs=0)


def test_epoch_general_ptb_too_little_data():
    model = LanguageModel(4, 10, 4)
    with pytest.raises(ValueError, match="at least 2"):
        simple_ml.epoch_general_ptb(np.zeros((1, 4), dtype=np.float32), model, seq_len=4)


def test_progress_line_printer(corpus, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "tqdm", None)  # force the fallback printer
    monkeypatch.setitem(sys.modules, "tqdm.auto", None)
    data = batchify(corpus.train, 8, None, "float32")[:41]
    model = LanguageModel(4, len(corpus.dictionary), 4, seq_model="rnn")
    simple_ml.evaluate_ptb(model, data, seq_len=4, progress=True)
    err = capsys.readouterr().err
    assert "eval step 1/10" in err and "eval step 10/10" in err
    assert "loss" in err and "allocated" in err
    with pytest.raises(TypeError):
        simple_ml.evaluate_ptb(model, data, seq_len=4, progress="yes")


def test_ptb_real_text_lowers_loss():
    if not (PTB_DIR / "ptb.valid.txt").is_file() or not (PTB_DIR / "ptb.test.txt").is_file():
        pytest.skip(
            f"real PTB text not found at {PTB_DIR} (only present next to the project's "
            f"development checkout)"
        )
    corpus = Corpus(str(PTB_DIR), max_lines=300)
    assert os.path.basename(corpus.train_path) == "ptb.valid.txt"
    data = batchify(corpus.train, 16, None, "float32")
    seq_len = 10
    data = data[: 40 * seq_len + 1]
    np.random.seed(0)
    model = LanguageModel(16, len(corpus.dictionary), 32, seq_model="transformer")
    rec = LossRecorder()
    simple_ml.train_ptb(model, data, seq_len=seq_len, optimizer=optim.Adam, lr=1e-2, progress=rec)
    assert len(rec.losses) == 40
    first, last = np.mean(rec.losses[:8]), np.mean(rec.losses[-8:])
    assert last < first - 0.3, (first, last)
    test_data = batchify(corpus.test, 16, None, "float32")
    acc, loss = simple_ml.evaluate_ptb(model, test_data[:41], seq_len=seq_len)
    assert 0.0 <= acc <= 1.0 and math.isfinite(loss)


class CountingModel(nn.Module):
    """Wraps a model, counting forward calls (the loop must call it once per step)."""

    def __init__(self, model):
        super().__init__()
        self.model = model
        self.calls = 0

    def forward(self, x, h=None):
        self.calls += 1
        return self.model(x, h)


@pytest.fixture
def no_cpu_limit():
    """No memory limit on the CPU (a limit, e.g. from NEEDLE_MEMORY_LIMIT, would let the
    allocator run the collector); the previous limit is restored afterwards."""
    previous = ndl.memory.get_memory_limit("cpu")
    ndl.memory.set_memory_limit("cpu", None)
    yield
    ndl.memory.set_memory_limit("cpu", previous)


def run_steps_gc_disabled(seq_model, corpus, steps, seq_len=8, bs=8):
    data = batchify(corpus.train, bs, None, "float32")[: steps * seq_len + 1]
    np.random.seed(0)
    model = CountingModel(LanguageModel(16, len(corpus.dictionary), 32, seq_model=seq_model))
    opt = optim.Adam(model.parameters(), lr=1e-3)
    rec = LossRecorder()
    collects_before = ndl.memory.memory_stats().get("num_collect_calls", 0)
    was_enabled = gc.isenabled()
    gc.collect()
    gc.disable()
    try:
        simple_ml.epoch_general_ptb(data, model, seq_len=seq_len, opt=opt, progress=rec)
    finally:
        if was_enabled:
            gc.enable()
    collects = ndl.memory.memory_stats().get("num_collect_calls", 0) - collects_before
    assert model.calls == steps and len(rec.allocated) == steps
    return rec.allocated, collects


@pytest.mark.parametrize("seq_model", ("lstm", "transformer"))
def test_memory_flat_without_gc(seq_model, corpus, no_cpu_limit):
    assert ndl.autograd.get_graph_mode() == "cycle_free"
    allocated, collects = run_steps_gc_disabled(seq_model, corpus, steps=50)
    assert collects == 0
    base = allocated[0]
    assert base > 0
    worst = max(abs(a - base) for a in allocated)
    assert worst <= 0.01 * base, (base, allocated)


def test_memory_grows_in_needle_graph_mode(corpus, no_cpu_limit):
    """The contrast: the course's graph semantics keep every step's graph in reference cycles."""
    with ndl.autograd.graph_mode("needle"):
        allocated, _ = run_steps_gc_disabled("transformer", corpus, steps=6)
    gc.collect()
    assert allocated[-1] > 2 * allocated[0], allocated


def test_epoch_general_cifar10_matches_independent_loss():
    rng = np.random.default_rng(0)
    X = rng.standard_normal((37, 3, 4, 4)).astype(np.float32)
    y = rng.integers(0, 10, size=37).astype(np.float32)
    loader = ndl.data.DataLoader(ndl.data.NDArrayDataset(X, y), batch_size=8)
    np.random.seed(0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(48, 10))
    acc, loss = simple_ml.evaluate_cifar10(model, loader)
    logits = model(ndl.Tensor(X)).numpy()
    total, correct = numpy_loss_and_correct(logits, y)
    assert loss == pytest.approx(total / 37, rel=1e-5)
    assert acc == pytest.approx(correct / 37)
    rec = LossRecorder()
    acc, train_loss = simple_ml.train_cifar10(
        model, loader, n_epochs=3, lr=0.05, weight_decay=0.0, progress=rec
    )
    assert len(rec.losses) == 15 and 0.0 <= acc <= 1.0
    assert simple_ml.evaluate_cifar10(model, loader)[1] < loss


# --------------------------------------------------------------------------
# the train_ptb script
# --------------------------------------------------------------------------


def run_script(*args, timeout=240):
    return subprocess.run(
        [sys.executable, "-m", "needle.apps.train_ptb", *args],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=timeout,
    )


def test_train_ptb_defaults_are_the_course_config():
    """The script, the repro and the bench read one configuration; its head count and width are
    the ones LanguageModel's Transformer really has."""
    args = train_ptb.parse_args([])
    assert (
        args.model,
        args.embedding_size,
        args.hidden_size,
        args.num_layers,
        args.seq_len,
        args.batch_size,
        args.lr,
    ) == (
        COURSE.seq_model,
        COURSE.embedding_size,
        COURSE.hidden_size,
        COURSE.num_layers,
        COURSE.seq_len,
        COURSE.batch_size,
        COURSE.lr,
    )
    model = LanguageModel(
        COURSE.embedding_size,
        30,
        COURSE.hidden_size,
        num_layers=COURSE.num_layers,
        seq_model=COURSE.seq_model,
        seq_len=COURSE.seq_len,
    )
    heads = [
        (m.num_head, m.dim_head) for m in model._children() if isinstance(m, nn.AttentionLayer)
    ]
    assert heads == [(COURSE.num_head, COURSE.dim_head)] * COURSE.num_layers
    with pytest.raises(dataclasses.FrozenInstanceError):
        COURSE.lr = 1.0


def test_train_ptb_script_synthetic():
    proc = run_script(
        "--epochs",
        "2",
        "--synthetic-words",
        "4000",
        "--synthetic-vocab",
        "200",
        "--batch-size",
        "16",
        "--seq-len",
        "8",
        "--embedding-size",
        "8",
        "--hidden-size",
        "16",
    )
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "synthetic" in out and "temporary directory" in out
    for epoch in (1, 2):
        line = next(ln for ln in out.splitlines() if ln.startswith(f"epoch {epoch}/2"))
        for field in ("train loss", "test loss", "ppl", "acc", "time", "peak memory"):
            assert field in line, line


def test_train_ptb_script_reads_ptb_names(corpus_dir, tmp_path):
    """A directory with only ptb.valid.txt / ptb.test.txt trains on ptb.valid.txt and says so."""
    shutil.copy(corpus_dir / "valid.txt", tmp_path / "ptb.valid.txt")
    shutil.copy(corpus_dir / "test.txt", tmp_path / "ptb.test.txt")
    proc = run_script(
        "--data",
        str(tmp_path),
        "--model",
        "lstm",
        "--epochs",
        "1",
        "--batch-size",
        "8",
        "--seq-len",
        "8",
        "--embedding-size",
        "8",
        "--hidden-size",
        "8",
        "--max-lines",
        "40",
    )
    assert proc.returncode == 0, proc.stderr
    assert "using ptb.valid.txt as the training text" in proc.stdout
    assert "epoch 1/1" in proc.stdout


def test_train_ptb_script_missing_data_dir(tmp_path):
    missing = tmp_path / "no_such_dir"
    proc = run_script("--data", str(missing))
    assert proc.returncode != 0
    assert "does not exist" in proc.stderr and str(missing) in proc.stderr
    assert "Traceback" not in proc.stderr
