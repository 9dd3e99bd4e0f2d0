"""CIFAR10Dataset: reads the pickled batches of the CIFAR-10 python release."""

import os
import pickle

import numpy as np

from ..._checks import require_dir, require_file
from ..data_basic import Dataset

__all__ = ["CIFAR10Dataset"]


def _load_batch(path):
    with open(path, "rb") as f:
        batch = pickle.load(f, encoding="bytes")
    data = batch[b"data"] if b"data" in batch else batch["data"]
    labels = batch[b"labels"] if b"labels" in batch else batch["labels"]
    return np.asarray(data), np.asarray(labels)


class CIFAR10Dataset(Dataset):
    """CIFAR-10 from ``base_folder`` (``data_batch_1`` .. ``data_batch_5`` when ``train``,
    else ``test_batch``).

    ``self.X`` is float64 (N, 3, 32, 32) with values in [0, 1] (bytes / 255), ``self.Y``
    the integer labels (N,). ``p`` is accepted for the course's signature and unused.
    Item ``i`` is ``(X[i] (3, 32, 32), Y[i])``; transforms, when given, are applied to the
    image in H x W x C layout and the result is returned as C x H x W again. A missing
    folder or batch file raises FileNotFoundError naming the path.
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
