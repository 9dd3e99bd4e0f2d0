"""MNISTDataset: reads the (gzip-compressed) IDX image and label files of MNIST."""

import gzip
import struct

import numpy as np

from ..._checks import require_file
from ..data_basic import Dataset

__all__ = ["MNISTDataset"]

_IMAGE_MAGIC = 2051
_LABEL_MAGIC = 2049


def _open_idx(filename, what):
    """Opens an IDX file, gzip-compressed (the usual ``*.gz``) or not; FileNotFoundError
    naming ``what`` and the path when it is missing."""
    filename = require_file(filename, what)
    with open(filename, "rb") as f:
        gz = f.read(2) == b"\x1f\x8b"
    return gzip.open(filename, "rb") if gz else open(filename, "rb")


def _read_header(f, fmt, filename):
    header = f.read(struct.calcsize(fmt))
    if len(header) != struct.calcsize(fmt):
        raise ValueError(f"{filename}: too short for an IDX header ({len(header)} bytes)")
    return struct.unpack(fmt, header)


def parse_mnist(image_filename, label_filename):
    """Reads an MNIST image file and label file in IDX format.

    Returns ``(X, y, (rows, cols))``: X float32 of shape (N, rows*cols) with the pixel
    values 0..255 mapped to 0.0..1.0 (divided by 255, as the course specifies), y uint8
    of shape (N,). Raises FileNotFoundError naming a missing file and ValueError on a
    file too short for its header, a wrong magic number or mismatched counts.
    """
    with _open_idx(image_filename, "MNIST image file") as f:
        magic, n, rows, cols = _read_header(f, ">IIII", image_filename)
        if magic != _IMAGE_MAGIC:
            raise ValueError(
                f"{image_filename}: not an IDX image file (magic {magic}, expected {_IMAGE_MAGIC})"
            )
        pixels = np.frombuffer(f.read(n * rows * cols), dtype=np.uint8)
    if pixels.size != n * rows * cols:
        raise ValueError(f"{image_filename}: truncated, expected {n} images of {rows}x{cols}")
    with _open_idx(label_filename, "MNIST label file") as f:
        magic, m = _read_header(f, ">II", label_filename)
        if magic != _LABEL_MAGIC:
            raise ValueError(
                f"{label_filename}: not an IDX label file (magic {magic}, expected {_LABEL_MAGIC})"
            )
        y = np.frombuffer(f.read(m), dtype=np.uint8).copy()
    if y.size != m:
        raise ValueError(f"{label_filename}: truncated, expected {m} labels")
    if m != n:
        raise ValueError(f"MNIST: {n} images but {m} labels")
    X = pixels.reshape(n, rows * cols).astype(np.float32) / np.float32(255.0)
    return X, y, (rows, cols)


class MNISTDataset(Dataset):
    """MNIST images and labels.

    ``self.images`` is float32 (N, 784) in [0, 1], ``self.labels`` uint8 (N,). Item ``i``
    is ``(img, label)`` with img the (28, 28, 1) float32 image after the transforms.
    A missing file raises FileNotFoundError naming it (see ``parse_mnist``).
    """

    def __init__(self, image_filename, label_filename, transforms=None):
        super().__init__(transforms)
        self.images, self.labels, (self._rows, self._cols) = parse_mnist(
            image_filename, label_filename
        )

    def __getitem__(self, index):
        """Returns ``(img (28, 28, 1) float32, label uint8)`` for an integer index; for a
        slice or an index array, ``(imgs (k, 28, 28, 1), labels (k,))``."""
        if np.ndim(index) == 0 and not isinstance(index, slice):
            img = self.images[index].reshape(self._rows, self._cols, 1)
            return self.apply_transforms(img), self.labels[index]
        imgs = self.images[index].reshape(-1, self._rows, self._cols, 1)
        imgs = np.stack([self.apply_transforms(img) for img in imgs]) if len(imgs) else imgs
        return imgs, self.labels[index]

    def __len__(self):
        return self.labels.shape[0]
