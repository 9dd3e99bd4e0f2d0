"""Penn Treebank (word level) helpers: Dictionary, Corpus, batchify and get_batch.

``Corpus`` reads ``train.txt`` / ``test.txt`` (the course's names), falling back to the
upstream names ``ptb.train.txt`` / ``ptb.test.txt``; when there is no training file but
there is ``ptb.valid.txt`` (as in a checkout that has only the valid/test splits), that
file is used as the training text. ``Corpus.train_path`` / ``Corpus.test_path`` say which
files were read.
"""

import os

import numpy as np

from ..._checks import check_count, require_dir
from ...autograd import Tensor

__all__ = ["Dictionary", "Corpus", "batchify", "get_batch"]

TRAIN_NAMES = ("train.txt", "ptb.train.txt", "ptb.valid.txt")
TEST_NAMES = ("test.txt", "ptb.test.txt")


class Dictionary:
    """A word <-> id map: ``word2idx`` (dict) and ``idx2word`` (list)."""

    def __init__(self):
        self.word2idx = {}
        self.idx2word = []

    def add_word(self, word):
        """Gives ``word`` the next free id if it is new; returns its id (an int)."""
        idx = self.word2idx.get(word)
        if idx is None:
            idx = len(self.idx2word)
            self.word2idx[word] = idx
            self.idx2word.append(word)
        return idx

    def __len__(self):
        """The number of distinct words."""
        return len(self.idx2word)


def _find(base_dir, names, split):
    for name in names:
        path = os.path.join(base_dir, name)
        if os.path.isfile(path):
            return path
    raise FileNotFoundError(
        f"no {split} file in PTB corpus directory {base_dir!r}: looked for " + ", ".join(names)
    )


class Corpus:
    """The train and test token streams of a PTB-format corpus, with one shared
    Dictionary.

    ``self.train`` and ``self.test`` are lists of word ids; every line contributes its
    words followed by ``'<eos>'``. ``max_lines`` limits the number of lines read from
    each file (None: all; else an int >= 0). Raises FileNotFoundError naming the path
    when ``base_dir`` or a split is missing.
    """

    def __init__(self, base_dir, max_lines=None):
        base_dir = require_dir(base_dir, "PTB corpus directory")
        if max_lines is not None:
            check_count("Corpus max_lines", max_lines, low=0)
        self.dictionary = Dictionary()
        self.train_path = _find(base_dir, TRAIN_NAMES, "training")
        self.test_path = _find(base_dir, TEST_NAMES, "test")
        self.train = self.tokenize(self.train_path, max_lines)
        self.test = self.tokenize(self.test_path, max_lines)

    def tokenize(self, path, max_lines=None):
        """Reads up to ``max_lines`` lines of a utf-8 text file, adding each word (and an
        ``'<eos>'`` per line) to the dictionary; returns the flat list of ids."""
        ids = []
        with open(path, encoding="utf-8") as f:
            for i, line in enumerate(f):
                if max_lines is not None and i >= max_lines:
                    break
                for word in line.split() + ["<eos>"]:
                    ids.append(self.dictionary.add_word(word))
        return ids


def batchify(data, batch_size, device, dtype):
    """Cuts the id stream ``data`` into ``batch_size`` contiguous columns.

    Returns a NumPy array of shape (nbatch, batch_size) and dtype ``dtype`` with
    nbatch = len(data) // batch_size (the tail is dropped); column j holds
    ``data[j * nbatch:(j + 1) * nbatch]``. ``device`` is unused (the course's signature).
    """
    if batch_size < 1:
        raise ValueError(f"batchify: batch_size must be at least 1, got {batch_size}")
    nbatch = len(data) // batch_size
    if nbatch == 0:
        raise ValueError(f"batchify: {len(data)} tokens are fewer than batch_size={batch_size}")
    arr = np.array(data[: nbatch * batch_size], dtype=dtype)
    return np.ascontiguousarray(arr.reshape((batch_size, nbatch)).T)


def get_batch(batches, i, bptt, device=None, dtype=None):
    """The chunk of ``batches`` (nbatch, bs) starting at row ``i``.

    Returns ``(data, target)``: data a Tensor (sq, bs) = ``batches[i:i+sq]`` and target a
    Tensor (sq * bs,) = ``batches[i+1:i+1+sq]`` flattened, with
    sq = min(bptt, nbatch - i - 1) (the last chunk is shorter, not padded). Raises
    ValueError when no target row is left (i >= nbatch - 1).
    """
    seq_len = min(bptt, len(batches) - 1 - i)
    if seq_len < 1:
        raise ValueError(f"get_batch: row {i} leaves no target in {len(batches)} rows")
    data = batches[i : i + seq_len]
    target = batches[i + 1 : i + 1 + seq_len].reshape(-1)
    return Tensor(data, device=device, dtype=dtype), Tensor(target, device=device, dtype=dtype)
