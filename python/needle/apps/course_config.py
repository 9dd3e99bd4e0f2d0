"""The course's PTB language-model configuration (10-714 hw4's Transformer), in one place.

``python -m needle.apps.train_ptb`` takes its defaults from ``COURSE``, ``python -m needle.repro``
trains exactly this model, and ``bench/ptb_train.py`` times it (and its LSTM twin) against
PyTorch.
"""

import dataclasses


@dataclasses.dataclass(frozen=True)
class CourseConfig:
    """A PTB language model and how it trains: ``LanguageModel(embedding_size, vocab_size,
    hidden_size, num_layers, seq_model, seq_len)`` on batches of ``seq_len`` x ``batch_size``
    tokens, with Adam at learning rate ``lr``."""

    seq_model: str = "transformer"
    embedding_size: int = 20
    hidden_size: int = 32
    num_layers: int = 1
    # nn.Transformer's own defaults, which LanguageModel keeps; a model written elsewhere (the
    # bench's PyTorch twin) needs them spelled out.
    num_head: int = 8
    dim_head: int = 32
    seq_len: int = 20
    batch_size: int = 256
    lr: float = 3e-3
    # PTB's vocabulary; needle's synthetic corpus has the same size.
    vocab_size: int = 10_000

    @property
    def tokens_per_step(self):
        return self.seq_len * self.batch_size

    def language_model(self, vocab_size=None, seq_len=None, device=None):
        """This configuration's ``LanguageModel`` (``vocab_size`` and ``seq_len`` default to
        the configuration's), on ``device``; the caller seeds NumPy first."""
        from .models import LanguageModel

        return LanguageModel(
            self.embedding_size,
            self.vocab_size if vocab_size is None else vocab_size,
            self.hidden_size,
            num_layers=self.num_layers,
            seq_model=self.seq_model,
            seq_len=self.seq_len if seq_len is None else seq_len,
            device=device,
        )


COURSE = CourseConfig()
