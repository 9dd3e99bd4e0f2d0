"""Each rank's share of the training data, so that N ranks at batch B/N train like one process
at batch B.

- PTB (``needle.data.batchify`` gives (nbatch, B) token columns): :func:`ptb_rank_columns` keeps
  columns ``[r * B/N, (r + 1) * B/N)`` on rank r. Every ``get_batch`` row then holds rank r's
  slice of the one-process batch, and since the course loss is a mean over the batch, the
  average of the ranks' losses (and of their gradients, which is what DistributedDataParallel
  computes) is the one-process value.
- Any map-style dataset: :class:`DistributedSampler` (``torch.utils.data.DistributedSampler``'s
  arguments and order) gives rank r the indices ``r, r + N, r + 2N, ...`` of the epoch's
  (optionally shuffled) order; ``sampler.subset()`` is a Dataset over those indices that
  ``needle.data.DataLoader`` can batch.

Rank and world size default to the process group's (``needle.distributed.get_rank()`` /
``get_world_size()``); pass them to use the sampler without a group (tests, data preparation).
"""

import math

import numpy as np

from .._checks import check_count
from ..data import Dataset

__all__ = ["ptb_rank_columns", "DistributedSampler"]


def _rank_and_world(rank, world_size):
    """``(rank, world_size)``: the given values (checked), the group's for those left None."""
    if rank is None or world_size is None:
        from . import get_rank, get_world_size  # the group's, only when asked for

        rank = get_rank() if rank is None else rank
        world_size = get_world_size() if world_size is None else world_size
    check_count("world_size", world_size, low=1)
    check_count("rank", rank, low=0)
    if rank >= world_size:
        raise ValueError(f"Invalid rank: {rank} (must be < world_size {world_size})")
    return int(rank), int(world_size)


def ptb_rank_columns(batches, rank=None, world_size=None):
    """Rank ``rank``'s columns of PTB batches: ``batches[:, rank * b:(rank + 1) * b]`` with
    ``b = B / world_size``, as a new C-contiguous NumPy array of shape (nbatch, b) and
    ``batches``' dtype.

    ``batches``: a 2-D NumPy array (nbatch, B) from ``needle.data.batchify`` (or anything
    ``np.asarray`` makes one of). Raises ValueError when ``batches`` is not 2-D or B is not a
    multiple of ``world_size`` (an uneven split would weight the ranks' mean losses unequally),
    TypeError / ValueError for a bad rank or world size.
    """
    rank, world_size = _rank_and_world(rank, world_size)
    batches = np.asarray(batches)
    if batches.ndim != 2:
        raise ValueError(
            f"ptb_rank_columns: expected batchified data of shape (nbatch, batch_size), got "
            f"shape {batches.shape}"
        )
    total = batches.shape[1]
    if total % world_size != 0:
        raise ValueError(
            f"ptb_rank_columns: batch size {total} is not divisible by the world size "
            f"{world_size}; use a batch size that is a multiple of it"
        )
    per_rank = total // world_size
    return np.ascontiguousarray(batches[:, rank * per_rank : (rank + 1) * per_rank])


class _IndexSubset(Dataset):
    """The items of ``dataset`` at ``indices``, in that order (transforms stay the dataset's)."""

    def __init__(self, dataset, indices):
        super().__init__()
        self.dataset = dataset
        self.indices = [int(i) for i in indices]

    def __getitem__(self, index):
        return self.dataset[self.indices[index]]

    def __len__(self):
        return len(self.indices)


class DistributedSampler:
    """Rank ``rank``'s indices of ``dataset`` for one epoch, as torch's DistributedSampler.

    The epoch's order is ``range(len(dataset))``, or with ``shuffle`` a permutation drawn from
    ``np.random.default_rng(seed + epoch)`` (the same on every rank; call ``set_epoch(e)`` at
    the start of each epoch for a new one). With ``drop_last`` the tail that does not split
    evenly is dropped; without it the order is padded by repeating its start, so every rank has
    ``ceil(len / N)`` indices. Rank r takes every N-th index from position r.

    Iterating yields Python ints; ``len()`` is the number of indices per rank; ``subset()`` is
    a Dataset of this rank's items for the current epoch (batch it with
    ``needle.data.DataLoader(sampler.subset(), batch_size=B // N)``).

    Raises ValueError for an empty dataset with ``drop_last=False`` (nothing to pad with) and
    for a rank outside [0, num_replicas); TypeError for non-integer counts.
    """

    def __init__(
        self, dataset, num_replicas=None, rank=None, shuffle=True, seed=0, drop_last=False
    ):
        self.rank, self.num_replicas = _rank_and_world(rank, num_replicas)
        self.dataset = dataset
        self.shuffle = bool(shuffle)
        self.seed = check_count("seed", seed, low=0)
        self.drop_last = bool(drop_last)
        self.epoch = 0
        n = len(dataset)
        if self.drop_last:
            self.num_samples = n // self.num_replicas
        else:
            if n == 0:
                raise ValueError("DistributedSampler: the dataset is empty")
            self.num_samples = math.ceil(n / self.num_replicas)
        self.total_size = self.num_samples * self.num_replicas

    def set_epoch(self, epoch):
        """Sets the epoch that seeds the next shuffle (same value on every rank)."""
        self.epoch = check_count("epoch", epoch, low=0)

    def _epoch_order(self):
        n = len(self.dataset)
        if self.shuffle:
            order = np.random.default_rng(self.seed + self.epoch).permutation(n)
        else:
            order = np.arange(n)
        if self.total_size <= n:
            return order[: self.total_size]
        reps = math.ceil((self.total_size - n) / n)
        return np.concatenate([order] + [order] * reps)[: self.total_size]

    def indices(self):
        """This rank's indices for the current epoch: a NumPy int64 array of length len(self)."""
        return self._epoch_order()[self.rank : self.total_size : self.num_replicas]

    def __iter__(self):
        return iter(int(i) for i in self.indices())

    def __len__(self):
        return self.num_samples

    def subset(self):
        """A Dataset of this rank's items for the current epoch, in sampler order."""
        return _IndexSubset(self.dataset, self.indices())
