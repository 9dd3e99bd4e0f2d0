"""The course's ``apps/models.py``: the PTB ``LanguageModel`` (RNN, LSTM or Transformer) and the
CIFAR-10 ``ResNet9``, with the course's parameter creation order.

Unlike the course's copy, importing this module does **not** call ``np.random.seed(0)``:
seeding NumPy's global RNG is left to the caller (``np.random.seed(0)`` before building a
model gives the course's parameters).
"""

from needle import nn
from needle._checks import check_count

__all__ = ["ConvBN", "ResNet9", "LanguageModel"]


class ConvBN(nn.Module):
    """Conv (padding (k-1)//2) -> BatchNorm2d -> ReLU, as in the course's hw4 models.py.

    forward(x (N, a, H, W)) returns (N, b, H', W') with H' = (H - 1) // stride + 1 for odd k.
    """

    def __init__(self, a, b, k, s, device=None, dtype="float32"):
        super().__init__()
        self.conv = nn.Conv(a, b, k, stride=s, device=device, dtype=dtype)
        self.bn = nn.BatchNorm2d(b, device=device, dtype=dtype)
        self.relu = nn.ReLU()

    def forward(self, x):
        return self.relu(self.bn(self.conv(x)))


class ResNet9(nn.Module):
    """The course's ResNet9 for 32x32 RGB images (431,946 parameters).

    ConvBN(3,16,7,4) -> ConvBN(16,32,3,2) -> Residual(ConvBN(32,32,3,1) x2) -> ConvBN(32,64,3,2)
    -> ConvBN(64,128,3,2) -> Residual(ConvBN(128,128,3,1) x2) -> Flatten -> Linear(128,128)
    -> ReLU -> Linear(128,10).

    forward(x (N, 3, 32, 32)) returns the logits, shape (N, 10).
    """

    def __init__(self, device=None, dtype="float32"):
        super().__init__()
        kw = dict(device=device, dtype=dtype)
        self.model = nn.Sequential(
            ConvBN(3, 16, 7, 4, **kw),
            ConvBN(16, 32, 3, 2, **kw),
            nn.Residual(nn.Sequential(ConvBN(32, 32, 3, 1, **kw), ConvBN(32, 32, 3, 1, **kw))),
            ConvBN(32, 64, 3, 2, **kw),
            ConvBN(64, 128, 3, 2, **kw),
            nn.Residual(nn.Sequential(ConvBN(128, 128, 3, 1, **kw), ConvBN(128, 128, 3, 1, **kw))),
            nn.Flatten(),
            nn.Linear(128, 128, **kw),
            nn.ReLU(),
            nn.Linear(128, 10, **kw),
        )

    def forward(self, x):
        return self.model(x)


SEQ_MODELS = ("rnn", "lstm", "transformer")


class LanguageModel(nn.Module):
    """Embedding -> sequence model -> Linear, the course's PTB language model.

    Parameters are created in the course's order (so a seeded NumPy RNG gives the course's
    model): ``embedding`` = Embedding(output_size, embedding_size), then ``seq_model`` =
    RNN(embedding_size, hidden_size, num_layers) | LSTM(...) |
    Transformer(embedding_size, hidden_size, num_layers) (its other arguments defaulted:
    8 heads of 32, causal, no dropout, sequence_len 2048; ``seq_len`` is not passed on), then
    ``linear`` = Linear(hidden_size, output_size), or Linear(embedding_size, output_size) for
    the transformer (whose output keeps the embedding width).

    Raises ValueError for a ``seq_model`` other than 'rnn', 'lstm' or 'transformer'.
    """

    def __init__(
        self,
        embedding_size,
        output_size,
        hidden_size,
        num_layers=1,
        seq_model="rnn",
        seq_len=40,
        device=None,
        dtype="float32",
    ):
        super().__init__()
        if seq_model not in SEQ_MODELS:
            raise ValueError(
                f"LanguageModel: unknown seq_model {seq_model!r} (expected 'rnn', 'lstm' or "
                f"'transformer')"
            )
        for name, value in (
            ("embedding_size", embedding_size),
            ("output_size", output_size),
            ("hidden_size", hidden_size),
            ("num_layers", num_layers),
        ):
            check_count(f"LanguageModel {name}", value)
        self.embedding_size = embedding_size
        self.output_size = output_size
        self.hidden_size = hidden_size
        self.num_layers = num_layers
        self.seq_model_name = seq_model
        self.seq_len = seq_len
        self.embedding = nn.Embedding(output_size, embedding_size, device=device, dtype=dtype)
        if seq_model == "rnn":
            self.seq_model = nn.RNN(
                embedding_size, hidden_size, num_layers, device=device, dtype=dtype
            )
            out_features = hidden_size
        elif seq_model == "lstm":
            self.seq_model = nn.LSTM(
                embedding_size, hidden_size, num_layers, device=device, dtype=dtype
            )
            out_features = hidden_size
        else:
            self.seq_model = nn.Transformer(
                embedding_size, hidden_size, num_layers, device=device, dtype=dtype
            )
            out_features = embedding_size
        self.linear = nn.Linear(out_features, output_size, device=device, dtype=dtype)

    @property
    def emd(self):
        """The embedding layer (the course's name for it)."""
        return self.embedding

    def forward(self, x, h=None):
        """Runs the model on a batch of token ids.

        x: Tensor (seq_len, bs) of token ids (as floats). h: the sequence model's state or
        None: for 'rnn' a Tensor (num_layers, bs, hidden_size); for 'lstm' a tuple (h0, c0) of
        such Tensors; for 'transformer' anything (it is ignored).

        Returns (logits, h): logits a Tensor (seq_len * bs, output_size), row t * bs + b for
        position t of sequence b; h the new state in the same form (for the transformer,
        zeros of shape (seq_len, bs, embedding_size), as the course's Transformer returns).
        """
        seq_len, bs = x.shape
        out = self.embedding(x)
        out, h = self.seq_model(out, h)
        out = out.reshape((seq_len * bs, out.shape[-1]))
        return self.linear(out), h
