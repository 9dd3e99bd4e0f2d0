"""Attention and Transformer modules (the course's hw4_extra ``nn_transformer``):
MultiHeadAttention, AttentionLayer, TransformerLayer and Transformer, with the course's
attribute names, parameter creation order and dropout draws (so a seeded NumPy RNG gives
the course's parameters and masks).

Differences from the course code that keep its numbers: q @ k^T is one batched
``ops.matmul`` (needle's MatMul broadcasts batch dims) instead of a broadcast multiply and
sum, and the scaling, causal mask and softmax are one op, ``ops.attention_softmax`` (the
course's division, the same -finfo(float32).max added where the mask is, one kernel each
way), unless a subclass overrides ``softmax`` or ``create_causal_mask``; ``softmax`` itself
is exp(logsoftmax) over the rows (the engine's row kernel) instead of exp(x - max) / sum.
"""

import numpy as np

from needle import backend_ndarray as array_api
from needle import init, ops
from needle._checks import check_count
from needle.autograd import Tensor

from .nn_basic import Dropout, LayerNorm1d, Linear, Module, ReLU, Residual, Sequential
from .nn_sequence import Embedding


def _check_tensor(x, module, name):
    if not isinstance(x, Tensor):
        raise TypeError(f"{module}: {name} must be a Tensor, got {type(x).__name__}")


def _check_3d(x, features, module, name):
    _check_tensor(x, module, name)
    if len(x.shape) != 3 or x.shape[2] != features:
        raise ValueError(
            f"{module}: {name} must have shape (batch, seq_len, {features}), got {tuple(x.shape)}"
        )


class MultiHeadAttention(Module):
    """Scaled dot-product attention over heads, with dropout on the probabilities.

    No parameters; ``self.dropout`` is a Dropout(dropout) that, in training mode, draws
    one ``np.random.rand(B, H, Lq, Lk)`` per call (also when dropout == 0) where draws are
    NumPy's, and one bernoulli kernel (none when dropout == 0) where they come from the
    device generator (see needle.random).
    """

    def __init__(self, *, dropout=0.0, causal=False, device=None, dtype="float32"):
        super().__init__()
        self.device = device
        self.dtype = dtype
        self.causal = causal
        self.dropout = Dropout(dropout)

    def create_causal_mask(self, i, j, device):
        """The NDArray (1, 1, i, j): 0 on and below the diagonal k = j - i, and
        -finfo(float32).max above it (queries i see keys up to j - i + row)."""
        mask = -np.finfo(np.float32).max * np.triu(
            np.ones((1, 1, i, j), dtype=np.float32), j - i + 1
        )
        return array_api.array(mask.astype(np.float32), device=device)

    def matmul(self, a, b_transpose):
        """Batched a @ b_transpose^T over the leading dims: (..., m, d), (..., n, d) ->
        (..., m, n)."""
        return ops.matmul(a, ops.transpose(b_transpose))

    def softmax(self, logit):
        """Softmax over the last axis, as exp(logsoftmax) of the rows: LogSoftmax runs the
        engine's row kernel (each row's max and sum of exponentials in one read) where the
        course's max, subtract, exp, sum and divide took five passes, and its gradient is
        softmax's. The graph ("needle" mode) is Reshape, LogSoftmax, Exp, Reshape."""
        shape = tuple(logit.shape)
        rows = logit.reshape((int(np.prod(shape[:-1])), shape[-1]))
        return ops.exp(ops.logsoftmax(rows)).reshape(shape)

    def _fused_softmax(self):
        """Whether the fused op computes what softmax(logits / sqrt(D) + mask) would: yes
        unless a subclass brings its own softmax or causal mask."""
        cls = type(self)
        return (
            cls.softmax is MultiHeadAttention.softmax
            and cls.create_causal_mask is MultiHeadAttention.create_causal_mask
        )

    def forward(self, q, k, v):
        """q (B, H, Lq, D), k (B, H, Lk, D), v (B, H, Lk, Dv).

        Returns (result, probs): result (B, H, Lq, Dv) = probs @ v, and probs
        (B, H, Lq, Lk), the attention probabilities after dropout."""
        for name, x in (("q", q), ("k", k), ("v", v)):
            _check_tensor(x, "MultiHeadAttention", name)
            if len(x.shape) != 4:
                raise ValueError(
                    f"MultiHeadAttention: {name} must be 4-D (batch, heads, len, dim), "
                    f"got shape {tuple(x.shape)}"
                )
        batch_size, num_head, queries_len, q_dim = q.shape
        if tuple(k.shape[:2]) != (batch_size, num_head) or k.shape[3] != q_dim:
            raise ValueError(
                f"MultiHeadAttention: k must have shape ({batch_size}, {num_head}, Lk, {q_dim}) "
                f"to match q {tuple(q.shape)}, got {tuple(k.shape)}"
            )
        keys_values_len = k.shape[2]
        if tuple(v.shape[:3]) != (batch_size, num_head, keys_values_len):
            raise ValueError(
                f"MultiHeadAttention: v must have shape ({batch_size}, {num_head}, "
                f"{keys_values_len}, Dv) to match k {tuple(k.shape)}, got {tuple(v.shape)}"
            )

        if self._fused_softmax():
            probs = ops.attention_softmax(self.matmul(q, k), np.sqrt(q_dim), causal=self.causal)
        else:
            logits = self.matmul(q, k) / np.sqrt(q_dim)
            if self.causal:
                mask = Tensor(
                    self.create_causal_mask(queries_len, keys_values_len, logits.device),
                    device=logits.device,
                    dtype=logits.dtype,
                    requires_grad=False,
                )
                logits = logits + mask.broadcast_to(logits.shape)
            probs = self.softmax(logits)
        probs = self.dropout(probs)
        result = ops.matmul(probs, v)
        return result, probs


class AttentionLayer(Module):
    """Pre-norm multi-head attention: LayerNorm, q/k/v projections, attention, output
    projection.

    Parameters, in creation order: ``prenorm_q``, ``prenorm_k``, ``prenorm_v``
    (LayerNorm1d, no RNG draw), then the bias-free Linear layers ``q_projection``
    (q_features, H*Dh), ``k_projection`` (k_features, H*Dh), ``v_projection``
    (v_features, H*Dh), ``attn`` (MultiHeadAttention, no parameters) and
    ``out_projection`` (H*Dh, out_features). k/v/out features default to q_features.
    """

    def __init__(
        self,
        q_features,
        num_head,
        dim_head,
        *,
        k_features=None,
        v_features=None,
        out_features=None,
        dropout=0.0,
        causal=True,
        device=None,
        dtype="float32",
    ):
        super().__init__()
        self.device = device
        self.dtype = dtype
        if k_features is None:
            k_features = q_features
        if v_features is None:
            v_features = q_features
        if out_features is None:
            out_features = q_features
        for name, value in (
            ("q_features", q_features),
            ("num_head", num_head),
            ("dim_head", dim_head),
            ("k_features", k_features),
            ("v_features", v_features),
            ("out_features", out_features),
        ):
            check_count(f"AttentionLayer {name}", value)
        self.q_features = q_features
        self.k_features = k_features
        self.v_features = v_features
        self.out_features = out_features
        self.num_head = num_head
        self.dim_head = dim_head

        self.prenorm_q = LayerNorm1d(q_features, device=device, dtype=dtype)
        self.prenorm_k = LayerNorm1d(k_features, device=device, dtype=dtype)
        self.prenorm_v = LayerNorm1d(v_features, device=device, dtype=dtype)

        inner_dim = num_head * dim_head
        self.q_projection = Linear(q_features, inner_dim, bias=False, device=device, dtype=dtype)
        self.k_projection = Linear(k_features, inner_dim, bias=False, device=device, dtype=dtype)
        self.v_projection = Linear(v_features, inner_dim, bias=False, device=device, dtype=dtype)

        self.attn = MultiHeadAttention(dropout=dropout, causal=causal, device=device, dtype=dtype)

        self.out_projection = Linear(
            inner_dim, out_features, bias=False, device=device, dtype=dtype
        )

    def forward(self, q, k=None, v=None):
        """q (B, Lq, q_features); k (B, Lk, k_features) and v (B, Lk, v_features) default
        to q.

        Returns (B, Lq, out_features). The attention probabilities (B, H, Lq, Lk) are
        kept in ``self.probs``."""
        if k is None:
            k = q
        if v is None:
            v = q
        _check_3d(q, self.q_features, "AttentionLayer", "q")
        _check_3d(k, self.k_features, "AttentionLayer", "k")
        _check_3d(v, self.v_features, "AttentionLayer", "v")
        batch_size, queries_len, _ = q.shape
        if k.shape[0] != batch_size or v.shape[0] != batch_size or k.shape[1] != v.shape[1]:
            raise ValueError(
                "AttentionLayer: q, k, v must share the batch size and k, v the length, got "
                f"{tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}"
            )
        keys_values_len = k.shape[1]
        heads, dim = self.num_head, self.dim_head

        def project(x, norm, proj, length):
            x = proj(norm(x)).reshape((batch_size, length, heads, dim))
            return x.transpose((1, 2))

        q = project(q, self.prenorm_q, self.q_projection, queries_len)
        k = project(k, self.prenorm_k, self.k_projection, keys_values_len)
        v = project(v, self.prenorm_v, self.v_projection, keys_values_len)

        result, probs = self.attn(q, k, v)
        self.probs = probs.detach()
        result = result.transpose((1, 2)).reshape((batch_size, queries_len, heads * dim))
        return self.out_projection(result)


class TransformerLayer(Module):
    """A pre-norm Transformer block on batch-first input (B, L, q_features):
    x + Dropout(Attention(x)), then x + Dropout(L2(Dropout(ReLU(L1(LayerNorm(x)))))).

    ``residual1`` = Residual(Sequential(AttentionLayer, Dropout)); ``residual2`` =
    Residual(Sequential(LayerNorm1d, Linear(q, hidden), ReLU, Dropout, Linear(hidden, q),
    Dropout)), created in that order.
    """

    def __init__(
        self,
        q_features,
        num_head,
        dim_head,
        hidden_size,
        *,
        dropout=0.0,
        causal=True,
        device=None,
        dtype="float32",
    ):
        super().__init__()
        for name, value in (
            ("q_features", q_features),
            ("num_head", num_head),
            ("dim_head", dim_head),
            ("hidden_size", hidden_size),
        ):
            check_count(f"TransformerLayer {name}", value)
        self.device = device
        self.dtype = dtype
        self.q_features = q_features
        self.residual1 = Residual(
            Sequential(
                AttentionLayer(
                    q_features,
                    num_head,
                    dim_head,
                    dropout=dropout,
                    causal=causal,
                    device=device,
                    dtype=dtype,
                ),
                Dropout(dropout),
            )
        )
        self.residual2 = Residual(
            Sequential(
                LayerNorm1d(q_features, device=device, dtype=dtype),
                Linear(q_features, hidden_size, device=device, dtype=dtype),
                ReLU(),
                Dropout(dropout),
                Linear(hidden_size, q_features, device=device, dtype=dtype),
                Dropout(dropout),
            )
        )

    def forward(self, x):
        """x (B, L, q_features) -> (B, L, q_features)."""
        _check_3d(x, self.q_features, "TransformerLayer", "x")
        return self.residual2(self.residual1(x))


class Transformer(Module):
    """A stack of TransformerLayer with a learned positional embedding.

    Created in order: ``positional_embedding`` = Embedding(sequence_len, embedding_size)
    (one randn(sequence_len, embedding_size) draw), then the list ``transformer_layers``.
    No final LayerNorm and no output head.
    """

    def __init__(
        self,
        embedding_size,
        hidden_size,
        num_layers,
        *,
        num_head=8,
        dim_head=32,
        dropout=0.0,
        causal=True,
        device=None,
        dtype="float32",
        batch_first=False,
        sequence_len=2048,
    ):
        super().__init__()
        for name, value in (
            ("embedding_size", embedding_size),
            ("hidden_size", hidden_size),
            ("num_layers", num_layers),
            ("num_head", num_head),
            ("dim_head", dim_head),
            ("sequence_len", sequence_len),
        ):
            check_count(f"Transformer {name}", value)
        self.device = device
        self.dtype = dtype
        self.batch_first = batch_first
        self.embedding_size = embedding_size
        self.sequence_len = sequence_len
        self.positional_embedding = Embedding(
            sequence_len, embedding_size, device=device, dtype=dtype
        )
        self.transformer_layers = [
            TransformerLayer(
                embedding_size,
                num_head,
                dim_head,
                hidden_size,
                dropout=dropout,
                causal=causal,
                device=device,
                dtype=dtype,
            )
            for _ in range(num_layers)
        ]

    def _positions(self, batch_size, seq_len, x):
        """The positional embedding of positions 0..seq_len-1 for each sequence, (B, L, D).

        The course looks up a (B, L) array of positions; for the course's Embedding those
        rows are its first seq_len rows, so they are taken as a slice broadcast over the
        batch: the same numbers and gradients, with no indices to upload and check on
        every step. Another module gets the course's lookup."""
        table = self.positional_embedding
        if type(table) is Embedding:
            return table.weight[:seq_len].broadcast_to((batch_size, seq_len, table.embedding_dim))
        positions = np.broadcast_to(np.arange(seq_len, dtype=np.float32), (batch_size, seq_len))
        positions = Tensor(
            np.ascontiguousarray(positions), device=x.device, dtype=x.dtype, requires_grad=False
        )
        return table(positions)

    def forward(self, x, h=None):
        """x (L, B, embedding_size), or (B, L, embedding_size) when batch_first; h is
        ignored.

        Returns (x, zeros_like(x)), both in the input's layout and shape."""
        _check_tensor(x, "Transformer", "x")
        layout = "(batch, seq_len, D)" if self.batch_first else "(seq_len, batch, D)"
        if len(x.shape) != 3 or x.shape[2] != self.embedding_size:
            raise ValueError(
                f"Transformer: x must have shape {layout} with D = {self.embedding_size}, "
                f"got {tuple(x.shape)}"
            )
        if not self.batch_first:
            x = x.transpose((0, 1))
        batch_size, seq_len, _ = x.shape
        if seq_len > self.sequence_len:
            raise ValueError(
                f"Transformer: sequence length {seq_len} exceeds sequence_len {self.sequence_len}"
            )
        x = x + self._positions(batch_size, seq_len, x)
        for layer in self.transformer_layers:
            x = layer(x)
        if not self.batch_first:
            x = x.transpose((0, 1))
        return x, init.zeros_like(x)
