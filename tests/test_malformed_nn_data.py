"""Malformed-input sweep of ``needle.nn``, ``needle.init``, ``needle.optim`` and ``needle.data``
(issue 11): modules fed the wrong feature sizes or types and built with bad arguments,
initializers with bad sizes, optimizers with bad rates and parameters, data loaders with bad
batch sizes and transforms with bad images.

Every case makes one malformed call beside a small model (Linear(4, 3) -> ReLU) on the device
under test, expects the documented exception, then runs a forward and backward pass of the
model and checks that the device's allocated bytes are unchanged.

Rates: the course does not check them; PyTorch raises ValueError for a negative learning rate,
momentum or weight decay and for betas outside [0, 1). needle follows PyTorch and also rejects
NaN and infinities, which PyTorch's ``lr < 0`` comparisons let through, a momentum of 1 or
more (the course's dampened momentum then never moves, or diverges) and ``eps == 0``. Norm
layers refuse a feature count below 1 and a negative eps, ``randb`` a probability outside
[0, 1], and the dataset constructors name a missing path in a FileNotFoundError; a bool where
a number is meant is a TypeError everywhere (needle/_checks.py).
"""

import os
import types

import numpy as np
import pytest

import needle as ndl
from needle import data, init, nn, optim
from needle.apps.models import LanguageModel

from devices import DEVICES
from malformed import case, run_case

NAN = float("nan")
INF = float("inf")


def _t(s, shape, value=0.5):
    return ndl.Tensor(np.full(shape, value, np.float32), device=s.device)


def _idx(s, values):
    return ndl.Tensor(np.array(values, np.float32), device=s.device)


def _params(s):
    return s.model.parameters()


def _step(opt, s):
    s.model(s.x).sum().backward()
    opt.step()


class _Items(data.Dataset):
    def __init__(self, n=5):
        super().__init__()
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return np.full((2,), i, np.float32), np.float32(i % 2)


def _first(loader):
    return next(iter(loader))


IMG = np.zeros((4, 4, 3), np.float32)

# A path that does not exist: the dataset constructors must name it in a FileNotFoundError.
MISSING = os.path.join(os.path.dirname(os.path.abspath(__file__)), "no-such-dir", "issue24")

NN = [
    case("linear-features", lambda s: s.model(_t(s, (2, 5))), ValueError),
    case("linear-numpy-input", lambda s: s.model(np.ones((2, 4), np.float32)), TypeError),
    case("linear-str-input", lambda s: s.model("x"), TypeError),
    case("linear-in-str", lambda s: nn.Linear("4", 3, device=s.device), TypeError),
    case("linear-in-negative", lambda s: nn.Linear(-1, 3, device=s.device), ValueError),
    case("linear-in-float", lambda s: nn.Linear(4.5, 3, device=s.device), TypeError),
    case("linear-in-nan", lambda s: nn.Linear(NAN, 3, device=s.device), TypeError),
    case("linear-dtype", lambda s: nn.Linear(4, 3, device=s.device, dtype="int8"), TypeError),
    case("linear-device", lambda s: nn.Linear(4, 3, device="gpu9"), ValueError),
    case(
        "linear-other-device",
        lambda s: s.model(ndl.Tensor(np.ones((2, 4), np.float32), device=ndl.cpu_numpy())),
        ndl.DeviceError,
    ),
    case("relu-str", lambda s: nn.ReLU()("x"), TypeError),
    case("flatten-int", lambda s: nn.Flatten()(3), TypeError),
    case("sequential-int", lambda s: nn.Sequential(1)(s.x), TypeError),
    case(
        "residual-shape", lambda s: nn.Residual(nn.Linear(4, 3, device=s.device))(s.x), ValueError
    ),
    case(
        "softmax-loss-label-shape",
        lambda s: nn.SoftmaxLoss()(s.model(s.x), _idx(s, [0.0])),
        ValueError,
    ),
    case(
        "softmax-loss-label-range",
        lambda s: nn.SoftmaxLoss()(s.model(s.x), _idx(s, [7.0, 0.0])),
        IndexError,
    ),
    case(
        "softmax-loss-label-nan",
        lambda s: nn.SoftmaxLoss()(s.model(s.x), _idx(s, [NAN, 0.0])),
        IndexError,
    ),
    case(
        "softmax-loss-1d-logits",
        lambda s: nn.SoftmaxLoss()(_t(s, (3,)), _idx(s, [0.0])),
        ValueError,
    ),
    case(
        "batchnorm1d-features",
        lambda s: nn.BatchNorm1d(4, device=s.device)(_t(s, (3, 5))),
        ValueError,
    ),
    case("batchnorm1d-dim-negative", lambda s: nn.BatchNorm1d(-1, device=s.device), ValueError),
    case("batchnorm1d-dim-str", lambda s: nn.BatchNorm1d("4", device=s.device), TypeError),
    case(
        "batchnorm2d-channels",
        lambda s: nn.BatchNorm2d(2, device=s.device)(_t(s, (1, 3, 4, 4))),
        ValueError,
    ),
    case(
        "batchnorm2d-2d-input",
        lambda s: nn.BatchNorm2d(2, device=s.device)(_t(s, (2, 2))),
        ValueError,
    ),
    case(
        "layernorm-features",
        lambda s: nn.LayerNorm1d(4, device=s.device)(_t(s, (3, 5))),
        ValueError,
    ),
    case("layernorm-dim-float", lambda s: nn.LayerNorm1d(2.5, device=s.device), TypeError),
    case("batchnorm1d-dim-zero", lambda s: nn.BatchNorm1d(0, device=s.device), ValueError, "dim"),
    case("batchnorm1d-dim-bool", lambda s: nn.BatchNorm1d(True, device=s.device), TypeError),
    case("batchnorm1d-dim-float", lambda s: nn.BatchNorm1d(2.0, device=s.device), TypeError),
    case(
        "batchnorm1d-eps-negative",
        lambda s: nn.BatchNorm1d(4, eps=-1e-5, device=s.device),
        ValueError,
        "Invalid BatchNorm1d eps",
    ),
    case("batchnorm1d-eps-nan", lambda s: nn.BatchNorm1d(4, eps=NAN, device=s.device), ValueError),
    case("batchnorm1d-eps-str", lambda s: nn.BatchNorm1d(4, eps="x", device=s.device), TypeError),
    case(
        "batchnorm1d-momentum-above",
        lambda s: nn.BatchNorm1d(4, momentum=1.5, device=s.device),
        ValueError,
        "momentum",
    ),
    case(
        "batchnorm1d-momentum-nan",
        lambda s: nn.BatchNorm1d(4, momentum=NAN, device=s.device),
        ValueError,
    ),
    case("batchnorm2d-dim-zero", lambda s: nn.BatchNorm2d(0, device=s.device), ValueError),
    case(
        "batchnorm2d-eps-negative",
        lambda s: nn.BatchNorm2d(2, eps=-1.0, device=s.device),
        ValueError,
        "Invalid BatchNorm2d eps",
    ),
    case("layernorm-dim-zero", lambda s: nn.LayerNorm1d(0, device=s.device), ValueError),
    case("layernorm-dim-negative", lambda s: nn.LayerNorm1d(-3, device=s.device), ValueError),
    case("layernorm-dim-bool", lambda s: nn.LayerNorm1d(True, device=s.device), TypeError),
    case(
        "layernorm-eps-negative",
        lambda s: nn.LayerNorm1d(4, eps=-1e-5, device=s.device),
        ValueError,
        "Invalid LayerNorm1d eps",
    ),
    case("layernorm-eps-inf", lambda s: nn.LayerNorm1d(4, eps=INF, device=s.device), ValueError),
    case("dropout-bool", lambda s: nn.Dropout(True), TypeError),
    case("conv-channels-bool", lambda s: nn.Conv(True, 4, 3, device=s.device), TypeError),
    case("rnn-layers-bool", lambda s: nn.RNN(4, 3, num_layers=True, device=s.device), TypeError),
    case("lstm-layers-str", lambda s: nn.LSTM(4, 3, num_layers="2", device=s.device), TypeError),
    case("dropout-above-one", lambda s: nn.Dropout(1.5), ValueError),
    case("dropout-negative", lambda s: nn.Dropout(-0.1), ValueError),
    case("dropout-nan", lambda s: nn.Dropout(NAN), ValueError),
    case("dropout-str", lambda s: nn.Dropout("x"), TypeError),
    case(
        "conv-channels",
        lambda s: nn.Conv(2, 4, 3, device=s.device)(_t(s, (1, 3, 5, 5))),
        ValueError,
    ),
    case(
        "conv-3d-input", lambda s: nn.Conv(2, 4, 3, device=s.device)(_t(s, (2, 5, 5))), ValueError
    ),
    case("conv-kernel-zero", lambda s: nn.Conv(2, 4, 0, device=s.device), ValueError),
    case("conv-stride-zero", lambda s: nn.Conv(2, 4, 3, stride=0, device=s.device), ValueError),
    case("conv-kernel-str", lambda s: nn.Conv(2, 4, "3", device=s.device), TypeError),
    case(
        "rnn-cell-nonlinearity",
        lambda s: nn.RNNCell(4, 3, nonlinearity="sigmoid", device=s.device),
        ValueError,
    ),
    case(
        "rnn-cell-features", lambda s: nn.RNNCell(4, 3, device=s.device)(_t(s, (2, 5))), ValueError
    ),
    case(
        "rnn-cell-hidden-shape",
        lambda s: nn.RNNCell(4, 3, device=s.device)(_t(s, (2, 4)), _t(s, (2, 4))),
        ValueError,
    ),
    case("rnn-layers-zero", lambda s: nn.RNN(4, 3, num_layers=0, device=s.device), ValueError),
    case("rnn-2d-input", lambda s: nn.RNN(4, 3, device=s.device)(_t(s, (2, 4))), ValueError),
    case(
        "lstm-cell-h-tensor",
        lambda s: nn.LSTMCell(4, 3, device=s.device)(_t(s, (2, 4)), _t(s, (2, 3))),
        TypeError,
    ),
    case("lstm-2d-input", lambda s: nn.LSTM(4, 3, device=s.device)(_t(s, (2, 4))), ValueError),
    case(
        "lstm-layers-negative", lambda s: nn.LSTM(4, 3, num_layers=-2, device=s.device), ValueError
    ),
    case(
        "embedding-range",
        lambda s: nn.Embedding(10, 3, device=s.device)(_idx(s, [[11.0]])),
        IndexError,
    ),
    case(
        "embedding-fraction",
        lambda s: nn.Embedding(10, 3, device=s.device)(_idx(s, [[0.5]])),
        IndexError,
    ),
    case(
        "embedding-negative",
        lambda s: nn.Embedding(10, 3, device=s.device)(_idx(s, [[-1.0]])),
        IndexError,
    ),
    case("embedding-size-negative", lambda s: nn.Embedding(-1, 3, device=s.device), ValueError),
    case(
        "mha-shapes",
        lambda s: nn.MultiHeadAttention(device=s.device)(
            _t(s, (1, 2, 3, 4)), _t(s, (1, 2, 3, 5)), _t(s, (1, 2, 3, 4))
        ),
        ValueError,
    ),
    case(
        "mha-3d",
        lambda s: nn.MultiHeadAttention(device=s.device)(
            _t(s, (2, 3, 4)), _t(s, (2, 3, 4)), _t(s, (2, 3, 4))
        ),
        ValueError,
    ),
    case(
        "attention-2d",
        lambda s: nn.AttentionLayer(4, 2, 3, device=s.device)(_t(s, (3, 4))),
        ValueError,
    ),
    case(
        "attention-features",
        lambda s: nn.AttentionLayer(4, 2, 3, device=s.device)(_t(s, (1, 3, 5))),
        ValueError,
    ),
    # Zero sizes (issue 35): each a ValueError naming the argument, where a bound divided by
    # zero (ZeroDivisionError) or a layer of nothing was made.
    case("linear-in-zero", lambda s: nn.Linear(0, 3, device=s.device), ValueError, "in_features"),
    case("linear-out-zero", lambda s: nn.Linear(3, 0, device=s.device), ValueError, "out_features"),
    case("rnn-cell-hidden-zero", lambda s: nn.RNNCell(3, 0), ValueError, "RNNCell hidden_size"),
    case("rnn-cell-input-zero", lambda s: nn.RNNCell(0, 3), ValueError, "RNNCell input_size"),
    case("rnn-input-zero", lambda s: nn.RNN(0, 4), ValueError, "RNN input_size"),
    case("rnn-hidden-zero", lambda s: nn.RNN(4, 0), ValueError, "RNN hidden_size"),
    case("lstm-cell-hidden-zero", lambda s: nn.LSTMCell(4, 0), ValueError, "LSTMCell hidden_size"),
    case("lstm-cell-input-zero", lambda s: nn.LSTMCell(0, 4), ValueError, "LSTMCell input_size"),
    case("lstm-input-zero", lambda s: nn.LSTM(0, 4), ValueError, "LSTM input_size"),
    case("lstm-hidden-str", lambda s: nn.LSTM(4, "3"), TypeError, "LSTM hidden_size"),
    case("embedding-dim-zero", lambda s: nn.Embedding(5, 0), ValueError, "embedding_dim"),
    case("embedding-size-zero", lambda s: nn.Embedding(0, 5), ValueError, "num_embeddings"),
    case("attention-heads-zero", lambda s: nn.AttentionLayer(4, 0, 3), ValueError, "num_head"),
    case("attention-dim-head-zero", lambda s: nn.AttentionLayer(4, 2, 0), ValueError, "dim_head"),
    case(
        "attention-k-features-zero",
        lambda s: nn.AttentionLayer(4, 2, 3, k_features=0),
        ValueError,
        "AttentionLayer k_features",
    ),
    case(
        "transformer-layer-heads-zero",
        lambda s: nn.TransformerLayer(4, 0, 3, 8),
        ValueError,
        "TransformerLayer num_head",
    ),
    case(
        "transformer-layer-hidden-zero",
        lambda s: nn.TransformerLayer(4, 2, 3, 0),
        ValueError,
        "TransformerLayer hidden_size",
    ),
    case(
        "transformer-layers-negative",
        lambda s: nn.Transformer(4, 8, -1),
        ValueError,
        "Transformer num_layers",
    ),
    case(
        "transformer-sequence-len-zero",
        lambda s: nn.Transformer(4, 8, 1, sequence_len=0),
        ValueError,
        "Transformer sequence_len",
    ),
    case(
        "language-model-output-zero",
        lambda s: LanguageModel(8, 0, 8),
        ValueError,
        "LanguageModel output_size",
    ),
    case(
        "language-model-hidden-zero",
        lambda s: LanguageModel(8, 8, 0, seq_model="lstm"),
        ValueError,
        "LanguageModel hidden_size",
    ),
    case(
        "transformer-features",
        lambda s: nn.Transformer(4, 8, 1, num_head=2, dim_head=2, device=s.device, sequence_len=8)(
            _t(s, (3, 1, 5))
        ),
        ValueError,
    ),
    case(
        "transformer-too-long",
        lambda s: nn.Transformer(4, 8, 1, num_head=2, dim_head=2, device=s.device, sequence_len=2)(
            _t(s, (3, 1, 4))
        ),
        ValueError,
    ),
]

INIT = [
    case("rand-negative", lambda s: init.rand(-1, device=s.device), ValueError),
    case("rand-str", lambda s: init.rand("3", device=s.device), TypeError),
    case("rand-float", lambda s: init.rand(2.5, device=s.device), TypeError),
    case("rand-nan", lambda s: init.rand(NAN, device=s.device), TypeError),
    case("rand-dtype", lambda s: init.rand(3, dtype="int16", device=s.device), TypeError),
    case("randn-float", lambda s: init.randn(2.5, device=s.device), TypeError),
    case("randn-17-dims", lambda s: init.randn(*(1,) * 17, device=s.device), ValueError),
    case("constant-str", lambda s: init.constant(3, c="x", device=s.device), TypeError),
    case("ones-device", lambda s: init.ones(3, device="gpu9"), ValueError),
    case("zeros-negative", lambda s: init.zeros(2, -3, device=s.device), ValueError),
    case("zeros-huge", lambda s: init.zeros(2**40, device=s.device), ndl.OutOfMemoryError),
    # NumPy drew float64 of that size first: its MemoryError, not needle's (issue 35).
    case("rand-huge", lambda s: init.rand(2**40, device=s.device), ndl.OutOfMemoryError),
    case("randn-huge", lambda s: init.randn(2**40, device=s.device), ndl.OutOfMemoryError),
    case("randb-huge", lambda s: init.randb(2**40, device=s.device), ndl.OutOfMemoryError),
    case(
        "kaiming-huge",
        lambda s: init.kaiming_uniform(2**40, 2, device=s.device),
        ndl.OutOfMemoryError,
    ),
    case("randb-str-p", lambda s: init.randb(3, p="x", device=s.device), TypeError),
    case(
        "randb-p-above",
        lambda s: init.randb(3, p=1.5, device=s.device),
        ValueError,
        r"Invalid randb probability p: 1\.5",
    ),
    case("randb-p-negative", lambda s: init.randb(3, p=-0.1, device=s.device), ValueError),
    case("randb-p-nan", lambda s: init.randb(3, p=NAN, device=s.device), ValueError),
    case("randb-p-bool", lambda s: init.randb(3, p=True, device=s.device), TypeError),
    case("one-hot-range", lambda s: init.one_hot(3, _idx(s, [5.0]), device=s.device), IndexError),
    case(
        "one-hot-negative-n",
        lambda s: init.one_hot(-1, _idx(s, [0.0]), device=s.device),
        ValueError,
    ),
    case("one-hot-str", lambda s: init.one_hot(3, "x", device=s.device), IndexError),
    case("zeros-like-str", lambda s: init.zeros_like("x"), TypeError),
    case("xavier-negative", lambda s: init.xavier_uniform(-1, 3, device=s.device), ValueError),
    case("xavier-normal-str", lambda s: init.xavier_normal("a", 3, device=s.device), TypeError),
    case("kaiming-fan-in-zero", lambda s: init.kaiming_uniform(0, 3), ValueError, "fan_in"),
    case("kaiming-fan-out-zero", lambda s: init.kaiming_uniform(3, 0), ValueError, "fan_out"),
    case("kaiming-normal-fan-in-zero", lambda s: init.kaiming_normal(0, 3), ValueError, "fan_in"),
    case(
        "kaiming-shape-zero",
        lambda s: init.kaiming_uniform(3, 3, shape=(3, 3, 0, 4)),
        ValueError,
        r"kaiming_uniform shape\[2\]",
    ),
    case(
        "kaiming-normal-shape-1d",
        lambda s: init.kaiming_normal(3, 3, shape=(3,)),
        ValueError,
        "kaiming_normal: shape",
    ),
    case("xavier-fans-zero", lambda s: init.xavier_uniform(0, 0), ValueError, "fan_in"),
    case("xavier-normal-fans-zero", lambda s: init.xavier_normal(0, 0), ValueError, "fan_in"),
    case("xavier-fan-out-zero", lambda s: init.xavier_uniform(3, 0), ValueError, "fan_out"),
    case(
        "kaiming-nonlinearity",
        lambda s: init.kaiming_uniform(3, 3, nonlinearity="tanh"),
        ValueError,
    ),
    case("kaiming-normal-str", lambda s: init.kaiming_normal("a", 3, device=s.device), TypeError),
]

OPTIM = [
    case("sgd-lr-nan", lambda s: optim.SGD(_params(s), lr=NAN), ValueError),
    case("sgd-lr-inf", lambda s: optim.SGD(_params(s), lr=INF), ValueError),
    case("sgd-lr-negative", lambda s: optim.SGD(_params(s), lr=-0.1), ValueError),
    case("sgd-lr-str", lambda s: optim.SGD(_params(s), lr="x"), TypeError),
    case("sgd-lr-none", lambda s: optim.SGD(_params(s), lr=None), TypeError),
    case("sgd-momentum-negative", lambda s: optim.SGD(_params(s), momentum=-0.5), ValueError),
    case("sgd-momentum-nan", lambda s: optim.SGD(_params(s), momentum=NAN), ValueError),
    case(
        "sgd-momentum-one",
        lambda s: optim.SGD(_params(s), momentum=1.0),
        ValueError,
        r"Invalid momentum: 1\.0",
    ),
    case("sgd-momentum-above", lambda s: optim.SGD(_params(s), momentum=2.0), ValueError),
    case("sgd-momentum-bool", lambda s: optim.SGD(_params(s), momentum=True), TypeError),
    case("sgd-lr-bool", lambda s: optim.SGD(_params(s), lr=True), TypeError),
    case("sgd-lr-2**2000", lambda s: optim.SGD(_params(s), lr=2**2000), ValueError, "Invalid lr"),
    case("sgd-params-int-list-step", lambda s: optim.SGD([5]).step(), TypeError, "parameter 0"),
    case(
        "sgd-weight-decay-negative", lambda s: optim.SGD(_params(s), weight_decay=-1.0), ValueError
    ),
    case("sgd-weight-decay-inf", lambda s: optim.SGD(_params(s), weight_decay=INF), ValueError),
    case("sgd-params-int", lambda s: optim.SGD(5), TypeError),
    case("sgd-params-numbers", lambda s: optim.SGD([1, 2]), TypeError),
    case("sgd-params-ndarray", lambda s: optim.SGD([s.x.cached_data]), TypeError),
    case("adam-lr-nan", lambda s: optim.Adam(_params(s), lr=NAN), ValueError),
    case("adam-lr-negative", lambda s: optim.Adam(_params(s), lr=-1.0), ValueError),
    case("adam-beta1-above", lambda s: optim.Adam(_params(s), beta1=1.5), ValueError),
    case("adam-beta1-one", lambda s: optim.Adam(_params(s), beta1=1.0), ValueError),
    case("adam-beta2-negative", lambda s: optim.Adam(_params(s), beta2=-0.1), ValueError),
    case("adam-beta2-nan", lambda s: optim.Adam(_params(s), beta2=NAN), ValueError),
    case("adam-eps-negative", lambda s: optim.Adam(_params(s), eps=-1e-8), ValueError),
    case("adam-eps-inf", lambda s: optim.Adam(_params(s), eps=INF), ValueError),
    case("adam-eps-zero", lambda s: optim.Adam(_params(s), eps=0.0), ValueError, "Invalid eps"),
    case("adam-beta2-one", lambda s: optim.Adam(_params(s), beta2=1.0), ValueError),
    case("adam-beta1-bool", lambda s: optim.Adam(_params(s), beta1=False), TypeError),
    case(
        "adam-weight-decay-negative",
        lambda s: optim.Adam(_params(s), weight_decay=-0.1),
        ValueError,
        "Invalid weight_decay",
    ),
    case("adam-weight-decay-str", lambda s: optim.Adam(_params(s), weight_decay="x"), TypeError),
    case("adam-params-str", lambda s: optim.Adam("ab"), TypeError),
    case("clip-nan", lambda s: optim.SGD(_params(s)).clip_grad_norm(NAN), ValueError),
    case("clip-negative", lambda s: optim.SGD(_params(s)).clip_grad_norm(-1.0), ValueError),
    case("clip-str", lambda s: optim.Adam(_params(s)).clip_grad_norm("x"), TypeError),
    case(
        "step-grad-shape",
        lambda s: (
            lambda o: (
                s.model(s.x).sum().backward(),
                setattr(o.params[0], "grad", _t(s, (7,))),
                o.step(),
            )
        )(optim.SGD(_params(s))),
        ValueError,
    ),
]

DATA = [
    case("loader-batch-zero", lambda s: data.DataLoader(_Items(), batch_size=0), ValueError),
    case("loader-batch-negative", lambda s: data.DataLoader(_Items(), batch_size=-2), ValueError),
    case("loader-batch-float", lambda s: data.DataLoader(_Items(), batch_size=1.5), TypeError),
    case("loader-batch-nan", lambda s: data.DataLoader(_Items(), batch_size=NAN), TypeError),
    case("loader-batch-inf", lambda s: data.DataLoader(_Items(), batch_size=INF), TypeError),
    case("loader-batch-str", lambda s: data.DataLoader(_Items(), batch_size="2"), TypeError),
    case("loader-batch-none", lambda s: data.DataLoader(_Items(), batch_size=None), TypeError),
    case("loader-dataset-int", lambda s: data.DataLoader(5), TypeError),
    case(
        "loader-dataset-empty",
        lambda s: data.DataLoader(_Items(0), batch_size=2),
        ValueError,
        "DataLoader: dataset is empty",
    ),
    case(
        "loader-dtype",
        lambda s: _first(data.DataLoader(_Items(), dtype="int64", device=s.device)),
        TypeError,
    ),
    case("loader-device", lambda s: _first(data.DataLoader(_Items(), device="gpu9")), ValueError),
    case("ndarray-dataset-none", lambda s: data.NDArrayDataset(), ValueError),
    case(
        "ndarray-dataset-lengths", lambda s: data.NDArrayDataset(np.ones(3), np.ones(4)), ValueError
    ),
    case("ndarray-dataset-index", lambda s: data.NDArrayDataset(np.ones(3))[10], IndexError),
    case("ndarray-dataset-str-index", lambda s: data.NDArrayDataset(np.ones(3))["a"], IndexError),
    case("crop-padding-negative", lambda s: data.RandomCrop(padding=-1)(IMG), ValueError),
    case("crop-padding-str", lambda s: data.RandomCrop(padding="x")(IMG), TypeError),
    case("crop-2d-image", lambda s: data.RandomCrop(padding=1)(np.zeros((4, 4))), ValueError),
    case("flip-p-str", lambda s: data.RandomFlipHorizontal(p="x")(IMG), TypeError),
    case("flip-2d-image", lambda s: data.RandomFlipHorizontal(p=1.0)(np.zeros((4, 4))), IndexError),
    case(
        "mnist-missing-images",
        lambda s: data.MNISTDataset(MISSING + "-images.gz", MISSING + "-labels.gz"),
        FileNotFoundError,
        "MNIST image file not found: .*issue24-images.gz",
    ),
    case(
        "cifar-missing-folder",
        lambda s: data.CIFAR10Dataset(MISSING, train=True),
        FileNotFoundError,
        "CIFAR-10 folder not found: .*issue24",
    ),
    case(
        "ptb-missing-dir",
        lambda s: data.Corpus(MISSING),
        FileNotFoundError,
        "PTB corpus directory not found: .*issue24",
    ),
    case("batchify-zero", lambda s: data.batchify(list(range(10)), 0, None, "float32"), ValueError),
    case(
        "batchify-too-big",
        lambda s: data.batchify(list(range(10)), 20, None, "float32"),
        ValueError,
    ),
]


def _subject(device):
    np.random.seed(0)
    model = nn.Sequential(nn.Linear(4, 3, device=device), nn.ReLU())
    x = ndl.Tensor(np.linspace(-1, 1, 8, dtype=np.float32).reshape(2, 4), device=device)
    return types.SimpleNamespace(model=model, x=x, device=device)


def _normal(s):
    for p in s.model.parameters():  # a training step starts from no gradient (reset_grad)
        p.grad = None
    out = s.model(s.x)
    assert out.shape == (2, 3)
    out.sum().backward()
    for p in s.model.parameters():
        assert p.grad.shape == p.shape
        p.grad = None


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("bad, exc, match", NN + INIT)
def test_nn_and_init(bad, exc, match, device):
    run_case(bad, exc, match, _subject(device), _normal, device)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("bad, exc, match", OPTIM + DATA)
def test_optim_and_data(bad, exc, match, device):
    run_case(bad, exc, match, _subject(device), _normal, device)
