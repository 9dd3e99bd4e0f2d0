"""NDArrayDataset: a dataset over in-memory arrays that share their first dimension."""

from ..data_basic import Dataset

__all__ = ["NDArrayDataset"]


class NDArrayDataset(Dataset):
    """Item ``i`` is the tuple ``(a[i] for a in arrays)``; the length is
    ``arrays[0].shape[0]``."""

    def __init__(self, *arrays):
        super().__init__()
        if not arrays:
            raise ValueError("NDArrayDataset needs at least one array")
        lengths = {len(a) for a in arrays}
        if len(lengths) != 1:
            raise ValueError(
                f"NDArrayDataset: the arrays' first dimensions differ: {sorted(lengths)}"
            )
        self.arrays = arrays

    def __len__(self):
        return self.arrays[0].shape[0]

    def __getitem__(self, i):
        """Returns a tuple with one entry per array: ``a[i]``."""
        return tuple(a[i] for a in self.arrays)
