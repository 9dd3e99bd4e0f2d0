"""Image transforms on H x W x C NumPy arrays, drawing from NumPy's global RNG with the
course's calls (so ``np.random.seed`` reproduces the course's augmentations)."""

import numpy as np

__all__ = ["Transform", "RandomFlipHorizontal", "RandomCrop"]


class Transform:
    """Base class: calling a transform maps one image to another."""

    def __call__(self, x):
        raise NotImplementedError


class RandomFlipHorizontal(Transform):
    """Flips an image left-right with probability ``p``."""

    def __init__(self, p=0.5):
        self.p = p

    def __call__(self, img):
        """Returns ``img[:, ::-1, :]`` when ``np.random.rand() < p``, else ``img``.

        img: NumPy array of shape (H, W, C); the result has the same shape. Makes exactly
        one ``np.random.rand()`` call.
        """
        flip_img = np.random.rand() < self.p
        if flip_img:
            return img[:, ::-1, :]
        return img


class RandomCrop(Transform):
    """Zero-pads an image by ``padding`` on each side of H and W, then crops it back to
    its size at a random shift in [-padding, padding] along each axis."""

    def __init__(self, padding=3):
        self.padding = padding

    def __call__(self, img):
        """Returns the shifted crop, an array of the same shape (H, W, C) as ``img``.

        Makes exactly one ``np.random.randint(-padding, padding + 1, size=2)`` call; the
        first value shifts rows (H), the second columns (W).
        """
        pad = self.padding
        shift_x, shift_y = np.random.randint(low=-pad, high=pad + 1, size=2)
        H, W = img.shape[0], img.shape[1]
        padded = np.pad(img, ((pad, pad), (pad, pad), (0, 0)), mode="constant")
        return padded[pad + shift_x : pad + shift_x + H, pad + shift_y : pad + shift_y + W, :]
