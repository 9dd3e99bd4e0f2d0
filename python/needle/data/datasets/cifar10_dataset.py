"""CIFAR10Dataset: reads the pickled batches of the CIFAR-10 python release."""

import os
import pickle

import numpy as np

from ..._checks import require_dir, require_file
from ..data_basic import Dataset

__all__ = ["CIFAR10Dataset"]


IMAGE_VALUES = 3 * 32 * 32  # one image's bytes in a batch's data rows


def _field(batch, name):
    """batch[name], under its bytes key (the python release, read with encoding="bytes") or
    its str key (a batch pickled again under Python 3); None when it has neither."""
    for key in (name.encode(), name):
        if key in batch:
            return batch[key]
    return None


def _load_batch(path):
    """One batch file as (data (N, 3072) byte values, labels (N,)); ValueError naming the
    file when it does not unpickle to a batch of that form."""
    try:
        with open(path, "rb") as f:
            batch = pickle.load(f, encoding="bytes")
    except (OSError, MemoryError):
        raise  # they name the file, or are not the file's fault
    except Exception as e:
        # A corrupt pickle raises any of UnpicklingError, EOFError, ValueError, KeyError...:
        # one catchable type, with the path the original message lacks.
        raise ValueError(
            f"{path}: not a CIFAR-10 batch file (unpickling failed: {type(e).__name__}: {e})"
        ) from e
    if not isinstance(batch, dict):
        raise ValueError(
            f"{path}: not a CIFAR-10 batch file (it holds a {type(batch).__name__}, "
            "expected a dict with 'data' and 'labels')"
        )
    data, labels = _field(batch, "data"), _field(batch, "labels")
    if data is None or labels is None:
        raise ValueError(f"{path}: not a CIFAR-10 batch file (no 'data' or no 'labels' entry)")
    data, labels = np.asarray(data), np.asarray(labels)
    if labels.ndim != 1 or data.size != labels.size * IMAGE_VALUES:
        raise ValueError(
            f"{path}: data of shape {data.shape} and labels of shape {labels.shape}, "
            f"expected {IMAGE_VALUES} values (3 x 32 x 32) for each of N labels"
        )
    return data, labels


class CIFAR10Dataset(Dataset):
    """CIFAR-10 from ``base_folder`` (``data_batch_1`` .. ``data_batch_5`` when ``train``,
    else ``test_batch``).

    ``self.X`` is float64 (N, 3, 32, 32) with values in [0, 1] (bytes / 255), ``self.Y``
    the integer labels (N,). ``p`` is accepted for the course's signature and unused.
    Item ``i`` is ``(X[i] (3, 32, 32), Y[i])``; transforms, when given, are applied to the
    image in H x W x C layout and the result is returned as C x H x W again. A missing
    folder or batch file raises FileNotFoundError naming the path; a batch file that does
    not unpickle, or holds no 3072 data values per label, a ValueError naming it (the
    unpickling error chained as its cause).
    """

    def __init__(self, base_folder, train, p=0.5, transforms=None):
        super().__init__(transforms)
        self.p = p
        base_folder = require_dir(base_folder, "CIFAR-10 folder")
        names = [f"data_batch_{i}" for i in range(1, 6)] if train else ["test_batch"]
        # every file is checked before the first (slow) one is read
        paths = [
            require_file(os.path.join(base_folder, name), "CIFAR-10 batch file") for name in names
        ]
        xs, ys = [], []
        for path in paths:
            data, labels = _load_batch(path)
            xs.append(data)
            ys.append(labels)
        self.X = np.concatenate(xs).reshape(-1, 3, 32, 32) / 255.0
        self.Y = np.concatenate(ys)

    def __getitem__(self, index):
        """Returns ``(image (3, 32, 32) float64, label)``."""
        img = self.X[index]
        if self.transforms:
            img = self.apply_transforms(img.transpose(1, 2, 0)).transpose(2, 0, 1)
        return img, self.Y[index]

    def __len__(self):
        return self.Y.size
