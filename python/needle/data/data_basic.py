"""Dataset and DataLoader: the course's batching (fixed ``np.array_split`` order, or a
fresh ``np.random.permutation`` at each ``iter()`` when shuffling)."""

import numpy as np

from .._checks import check_count
from ..autograd import Tensor

__all__ = ["Dataset", "DataLoader"]


class Dataset:
    """An abstract dataset: subclasses implement ``__getitem__`` and ``__len__``.

    ``transforms`` is a list of callables that ``apply_transforms`` applies in order.
    """

    def __init__(self, transforms=None):
        self.transforms = transforms

    def __getitem__(self, index):
        raise NotImplementedError

    def __len__(self):
        raise NotImplementedError

    def apply_transforms(self, x):
        """Returns ``x`` after every transform in ``self.transforms`` (in order)."""
        if self.transforms is not None:
            for tform in self.transforms:
                x = tform(x)
        return x


class DataLoader:
    """Iterates over ``dataset`` in mini-batches.

    Each batch is a list with one Tensor per field of the samples (for a dataset whose
    items are ``(x, y)``: ``[X (B, *x.shape), y (B, *y.shape)]``), built as
    ``Tensor(np.stack(field), device=device, dtype=dtype)``; labels are cast to
    ``dtype`` as well. Without shuffling the batches are the consecutive index ranges of
    ``np.array_split``; with shuffling the order is redrawn with
    ``np.random.permutation(len(dataset))`` at each ``iter()``. The last batch may be
    smaller than ``batch_size``.
    """

    def __init__(self, dataset, batch_size=1, shuffle=False, device=None, dtype="float32"):
        check_count("DataLoader batch_size", batch_size)
        # An empty dataset gives no batch: the loop over it would run nothing and report
        # nothing (an epoch's mean loss divided by zero), so it is refused here.
        if len(dataset) == 0:
            raise ValueError("DataLoader: dataset is empty (len(dataset) == 0)")
        self.dataset = dataset
        self.shuffle = shuffle
        self.batch_size = batch_size
        self.device = device
        self.dtype = dtype
        self._batch = 0
        if not self.shuffle:
            self.ordering = self._split(np.arange(len(dataset)))

    def _split(self, indices):
        n = len(self.dataset)
        if n == 0:
            return []
        return np.array_split(indices, range(self.batch_size, n, self.batch_size))

    def __len__(self):
        """The number of batches per epoch."""
        n = len(self.dataset)
        return (n + self.batch_size - 1) // self.batch_size

    def __iter__(self):
        if self.shuffle:
            self.ordering = self._split(np.random.permutation(len(self.dataset)))
        self._batch = 0
        return self

    def __next__(self):
        """Returns the next batch: a list of Tensors, one per sample field."""
        if self._batch >= len(self.ordering):
            raise StopIteration
        indices = self.ordering[self._batch]
        self._batch += 1
        samples = [self.dataset[int(i)] for i in indices]
        if not isinstance(samples[0], (tuple, list)):
            samples = [(s,) for s in samples]
        return [
            Tensor(np.stack([np.asarray(x) for x in field]), device=self.device, dtype=self.dtype)
            for field in zip(*samples)
        ]
