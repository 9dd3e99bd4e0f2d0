"""Random NDArray programs: views of every kind and ``__setitem__``, mirrored by NumPy views.

Each base NDArray has a flat float32 NumPy buffer of the same size; every needle view
(reshape, permute, broadcast_to, getitem with the course's semantics (ints keep their
dimension) including negative indices and steps, flip, as_strided) is mirrored by the NumPy
view of that buffer, so a ``__setitem__`` through one view must show through all others
(overlapping source and target included). Arithmetic, reductions, matmul, pad and compact
make new bases. After every instruction every live view must equal its mirror and report
the mirror's offset. ``run(seed, disturbed)`` returns the list of findings.
"""

import random

import numpy as np

import needle as ndl
from needle import backend_ndarray as nd

from . import disturb

EXPECTED_BAD = (ValueError, TypeError, IndexError)


class _Prog:
    def __init__(self, seed, disturber):
        self.r = random.Random(seed * 31 + 5)
        self.np_rng = np.random.default_rng(seed + 1)
        self.d = disturber
        self.views = []  # (NDArray, numpy view, its flat base, writable)
        self.failures = []

    def dim(self):
        return self.r.choice((0, 1, 1, 2, 3, 4) if self.r.random() < 0.2 else (1, 2, 3, 4))

    def add_base(self, arr=None, ref=None):
        if arr is None:
            shape = tuple(self.dim() for _ in range(self.r.randint(0, 3)))
            ref = self.np_rng.uniform(-2, 2, size=shape).astype(np.float32)
            arr = nd.array(ref)
        flat = np.ascontiguousarray(ref, np.float32).reshape(-1).copy()
        self.views.append((arr, flat.reshape(ref.shape), flat, True))

    def key(self, shape):
        """A course-style key (ints keep their dim) and its NumPy equivalent."""
        key, npkey = [], []
        for d in shape[: self.r.randint(0, len(shape))]:
            c = self.r.random()
            if c < 0.3:
                i = self.r.randrange(-d, d + 1) if d else 0
                key.append(i)
                j = i + d if i < 0 else i
                npkey.append(slice(j, j + 1) if 0 <= j < d else None)
            else:
                s = slice(
                    self.r.choice((None, self.r.randint(-d - 1, d + 1))),
                    self.r.choice((None, self.r.randint(-d - 1, d + 1))),
                    self.r.choice((None, 1, 2, -1, -3)),
                )
                key.append(s)
                npkey.append(s)
        bad = any(k is None for k in npkey)
        return tuple(key), (None if bad else tuple(npkey))

    def view(self, arr, ref, flat, writable):
        op = self.r.choice(
            (
                "reshape",
                "permute",
                "broadcast_to",
                "getitem",
                "getitem",
                "flip",
                "as_strided",
                "compact",
            )
        )
        if op == "reshape":
            shape = self.r.choice(((1, ref.size), (ref.size, 1), (ref.size,), (ref.size, 1, 1)))
            try:
                new = arr.reshape(shape)
            except ValueError:
                if ref.flags.c_contiguous and ref.size > 1:
                    self.failures.append(f"reshape of a compact view {ref.shape}->{shape} refused")
                return
            new_ref = ref.reshape(shape)
            return new, new_ref, writable and np.may_share_memory(new_ref, flat)
        if op == "permute":
            axes = tuple(self.r.sample(range(ref.ndim), ref.ndim))
            return arr.permute(axes), ref.transpose(axes), writable
        if op == "broadcast_to":
            shape = (self.r.randint(1, 3),) + tuple(
                self.r.choice((d, 2)) if d == 1 else d for d in ref.shape
            )
            return arr.broadcast_to(shape), np.broadcast_to(ref, shape), False
        if op == "getitem":
            key, npkey = self.key(ref.shape)
            if npkey is None:
                try:
                    arr[key]
                except IndexError:
                    return
                self.failures.append(f"getitem {key} out of range on {ref.shape} accepted")
                return
            return arr[key], ref[npkey + (Ellipsis,)], writable
        if op == "flip":
            if ref.ndim == 0:
                return
            axes = tuple(sorted(self.r.sample(range(ref.ndim), self.r.randint(1, ref.ndim))))
            return arr.flip(axes), np.flip(ref, axes), writable
        if op == "compact":
            new = arr.compact()
            return new, (ref if new is arr else ref.copy()), writable and new is arr
        # as_strided, relative to the view's first element, within its storage or not
        if ref.size == 0 or flat.size == 0:
            return
        shape = tuple(self.r.randint(1, 3) for _ in range(self.r.randint(1, 3)))
        strides = tuple(self.r.randint(-2, 3) for _ in shape)
        off = (ref.__array_interface__["data"][0] - flat.__array_interface__["data"][0]) // 4
        try:
            want = np.ndarray(
                shape,
                np.float32,
                buffer=flat,
                offset=off * 4,
                strides=tuple(4 * s for s in strides),
            )
        except (ValueError, TypeError):
            want = None
        try:
            got = arr.as_strided(shape, strides)
        except EXPECTED_BAD:
            if want is not None:
                self.failures.append(f"as_strided {shape} {strides} in bounds refused")
            return
        if want is None:
            self.failures.append(f"as_strided {shape} {strides} out of bounds accepted")
            return
        return got, want, False

    def setitem(self):
        targets = [v for v in self.views if v[3] and v[1].size]
        if not targets:
            return
        arr, ref, flat, _ = self.r.choice(targets)
        key, npkey = self.key(ref.shape)
        if npkey is None:
            return
        region = ref[npkey + (Ellipsis,)]
        if self.r.random() < 0.4:
            value = self.r.choice((0.0, -1.5, 2.25))
            arr[key] = value  # (the mirror changes only once needle's write succeeded)
            region[...] = value
            return
        sources = [v for v in self.views if v[1].shape == region.shape]
        if sources and self.r.random() < 0.6:
            src, src_ref = self.r.choice(sources)[:2]
        else:
            src_ref = self.np_rng.uniform(-2, 2, size=region.shape).astype(np.float32)
            src = nd.array(src_ref)
        src_copy = src_ref.copy()  # the right side is read before anything is written
        arr[key] = src  # an OutOfMemoryError here must leave the target as it was
        region[...] = src_copy

    def new_base(self):
        arr, ref = self.r.choice(self.views)[:2]
        ref = ref.astype(np.float64)
        c = self.r.random()
        if c < 0.25:
            return arr + 1.5, ref + 1.5
        if c < 0.4:
            others = [v for v in self.views if v[1].shape == ref.shape]
            o = self.r.choice(others)
            return arr * o[0], ref * o[1]
        if c < 0.55 and ref.ndim:
            axis = self.r.randrange(ref.ndim)
            keep = self.r.random() < 0.5
            if ref.shape[axis] == 0:
                return arr.sum(axis=axis, keepdims=keep), ref.sum(axis=axis, keepdims=keep)
            return arr.max(axis=axis, keepdims=keep), ref.max(axis=axis, keepdims=keep)
        if c < 0.65 and ref.ndim == 2:
            w = self.np_rng.uniform(-1, 1, size=(ref.shape[1], 2)).astype(np.float32)
            return arr @ nd.array(w), ref @ w
        if c < 0.75 and ref.ndim:
            pads = tuple((self.r.randint(0, 1), self.r.randint(0, 2)) for _ in ref.shape)
            return arr.pad(pads), np.pad(ref, pads)
        if c < 0.85:
            return arr.exp().log(), ref.copy()
        return arr.maximum(0.0), np.maximum(ref, 0)

    def check(self, what):
        for arr, ref, flat, _ in self.views:
            got = arr.numpy()
            if got.shape != ref.shape or not np.allclose(got, ref, rtol=1e-5, atol=1e-5):
                self.failures.append(f"after {what}: view {ref.shape} differs from NumPy")
                return
            if ref.size and np.may_share_memory(ref, flat):
                off = ref.__array_interface__["data"][0] - flat.__array_interface__["data"][0]
                if arr._offset != off // 4:
                    self.failures.append(f"after {what}: offset {arr._offset} != {off // 4}")
                    return

    def run(self, n):
        for _ in range(self.r.randint(1, 3)):
            self.add_base()
        for step in range(n):
            if self.d is not None:
                self.d.step(step)
            c = self.r.random()
            try:
                if c < 0.5:
                    out = self.view(*self.r.choice(self.views))
                    what = "a view"
                    if out is not None:
                        self.append_view(*out)
                elif c < 0.75:
                    what = "setitem"
                    self.setitem()
                else:
                    what = "a new array"
                    arr, ref = self.new_base()
                    self.add_base(arr, ref)
            except ndl.OutOfMemoryError:
                if self.d is None or not self.d.limited:
                    raise
                continue
            self.check(what)
            if len(self.views) > 12:
                del self.views[self.r.randrange(len(self.views))]
        self.views.clear()
        return self.failures

    def append_view(self, arr, ref, writable):
        for v in self.views:
            if ref.size and np.may_share_memory(ref, v[2]):
                self.views.append((arr, ref, v[2], writable))
                return
        flat = ref.copy().reshape(-1)  # a new storage (or an empty one)
        self.views.append((arr, flat.reshape(ref.shape), flat, writable))


def run(seed, disturbed):
    d = disturb.Disturber(seed + 99991) if disturbed else None
    if d is not None:
        disturb.DISTURBER[0] = d
        d.start()
    try:
        failures = _Prog(seed, d).run(random.Random(seed).randint(4, 16))
    finally:
        if d is not None:
            d.stop()
    return failures + (d.errors if d is not None else [])
