"""Draws random Tensor programs: a list of ``Instr`` with a float64 NumPy mirror.

``generate(seed)`` returns a ``Program``: instructions over value ids, the NumPy value of
every id (``ref``), which instructions are bad on purpose (the generator knows NumPy
rejects them; needle must raise ValueError/TypeError/IndexError), the graph mode, and
whether the program is smooth and small enough for a float64 finite difference of its
gradients. ``np_apply`` is the one NumPy semantics of every op; ``evaluate`` replays a
program on NumPy with other leaf values (the finite difference uses it).
"""

import random
from dataclasses import dataclass, field

import numpy as np

from needle.autograd import GRAPH_MODES

UNARY = ("negate", "exp", "log", "tanh", "sigmoid", "relu", "sqrt", "power_scalar")
UNARY += ("add_scalar", "mul_scalar", "div_scalar", "pyop_scale")
BINARY = ("add", "sub", "mul", "div", "power", "pyop_muladd")
KINKED = {"relu", "max"}


@dataclass
class Instr:
    op: str
    ins: tuple
    params: dict
    out: int
    bad: bool = False
    nograd: bool = False


@dataclass
class Val:
    ref: object  # np.ndarray (float64) or a list of them for a tuple
    rg: bool
    deps: frozenset  # leaf ids that require grad and reach this value
    kind: str = "tensor"
    parts: tuple = ()  # a make_tuple's inputs: tuple_get_item folds to them


@dataclass
class Program:
    seed: int
    mode: str
    instrs: list = field(default_factory=list)
    vals: dict = field(default_factory=dict)
    smooth: bool = True
    leaf_elems: int = 0


def _lse(x, axes):
    if x.size == 0:
        return np.log(np.sum(np.exp(x), axis=axes))
    m = np.max(x, axis=axes, keepdims=True)
    return (np.log(np.sum(np.exp(x - m), axis=axes, keepdims=True)) + m).squeeze(axis=axes)


def _conv(x, w, stride, padding):
    x = np.pad(x, ((0, 0), (padding, padding), (padding, padding), (0, 0)))
    n, h, wd, _ = x.shape
    k, _, _, cout = w.shape
    oh, ow = (h - k) // stride + 1, (wd - k) // stride + 1
    out = np.zeros((n, oh, ow, cout))
    for a in range(k):
        for b in range(k):
            rows = slice(a, a + stride * (oh - 1) + 1, stride)
            cols = slice(b, b + stride * (ow - 1) + 1, stride)
            patch = x[:, rows, cols]
            out += patch @ w[a, b]
    return out


def _axes(axes, ndim):
    if axes is None:
        return None
    return tuple(a % ndim for a in axes) if ndim else axes


def np_apply(op, p, xs):
    """NumPy (float64) semantics of one instruction; raises on inputs NumPy rejects."""
    x = xs[0] if xs else None
    if op == "leaf":
        return np.asarray(p["data"], np.float64)
    if op in ("detach", "pyop_identity"):
        return x.copy()
    if op == "negate":
        return -x
    if op == "exp":
        return np.exp(x)
    if op == "log":
        return np.log(x)
    if op == "tanh":
        return np.tanh(x)
    if op == "sigmoid":
        return 1 / (1 + np.exp(-x))
    if op == "relu":
        return np.maximum(x, 0)
    if op == "sqrt":
        return np.sqrt(x)
    if op == "power_scalar":
        return x ** p["s"]
    if op == "add_scalar":
        return x + p["s"]
    if op == "mul_scalar":
        return x * p["s"]
    if op == "div_scalar":
        return x / p["s"]
    if op == "pyop_scale":
        return x * 3.0 + 1.0
    if op == "add":
        return x + xs[1]
    if op == "sub":
        return x - xs[1]
    if op == "mul":
        return x * xs[1]
    if op == "div":
        return x / xs[1]
    if op == "power":
        return x ** xs[1]
    if op == "pyop_muladd":
        return x * xs[1] + x
    if op == "reshape":
        return x.reshape(p["shape"])
    if op == "transpose":
        axes = p["axes"] or (x.ndim - 2, x.ndim - 1)
        return np.swapaxes(x, *axes)
    if op == "broadcast_to":
        return np.broadcast_to(x, p["shape"]).copy()
    if op == "getitem":
        return np.array(x[p["key"]], np.float64)
    if op == "flip":
        return np.flip(x, p["axes"]).copy()
    if op == "summation":
        if p["axes"] is None:
            return np.sum(x).reshape(1)
        return np.sum(x, axis=_axes(p["axes"], x.ndim))
    if op == "max":
        if p["axes"] is None:
            return np.max(x).reshape(1)
        return np.max(x, axis=_axes(p["axes"], x.ndim))
    if op == "logsumexp":
        if p["axes"] is None:
            return _lse(x.reshape(-1), 0).reshape(1)
        return _lse(x, _axes(p["axes"], x.ndim))
    if op == "matmul":
        return x @ xs[1]
    if op == "stack":
        return np.stack(xs, p["axis"])
    if op == "split":
        return [np.take(x, i, axis=p["axis"]) for i in range(x.shape[p["axis"]])]
    if op == "make_tuple":
        return [v.copy() for v in xs]
    if op == "tuple_get_item":
        return x[p["index"]].copy()
    if op == "logsoftmax":
        return x - _lse(x, 1)[:, None]
    if op == "softmax_cross_entropy":
        lab = xs[1].astype(np.int64)
        return np.array([np.mean(_lse(x, 1) - x[np.arange(x.shape[0]), lab])])
    if op == "conv":
        return _conv(x, xs[1], p["stride"], p["padding"])
    raise AssertionError(op)


def evaluate(prog, leaf_values):
    """Replays the program on NumPy with leaf_values {id: array}; returns {id: value}."""
    out = {}
    for ins in prog.instrs:
        if ins.bad or ins.op == "backward":
            continue
        if ins.op == "leaf":
            out[ins.out] = leaf_values.get(ins.out, prog.vals[ins.out].ref)
            continue
        if not prog.vals[ins.out].rg:  # detached, made under no_grad or a constant
            out[ins.out] = prog.vals[ins.out].ref
            continue
        out[ins.out] = np_apply(ins.op, ins.params, [out[i] for i in ins.ins])
    return out


class Generator:
    """Draws one program; every choice comes from ``self.r`` (a seeded random.Random)."""

    def __init__(self, seed, n_instrs=None):
        self.r = random.Random(seed)
        self.prog = Program(seed, self.r.choice(GRAPH_MODES))
        self.zero_dims = self.r.random() < 0.25
        self.n = n_instrs or self.r.randint(4, 22)
        self.np_rng = np.random.default_rng(seed)

    # -- helpers ---------------------------------------------------------------------
    def dim(self):
        if self.zero_dims and self.r.random() < 0.12:
            return 0
        return self.r.choice((1, 1, 2, 2, 3, 4))

    def shape(self, max_ndim=3):
        return tuple(self.dim() for _ in range(self.r.randint(0, max_ndim)))

    def tensors(self, pred=lambda v: True):
        return [i for i, v in self.prog.vals.items() if v.kind == "tensor" and pred(v.ref)]

    def emit(self, op, ins, params=None, *, bad=False, nograd=False, kind="tensor"):
        params = params or {}
        vid = len(self.prog.vals)
        instr = Instr(op, tuple(ins), params, vid, bad, nograd)
        xs = [self.prog.vals[i].ref for i in ins]
        if bad:
            self.prog.instrs.append(instr)
            return None
        try:
            with np.errstate(all="ignore"):
                ref = np_apply(op, params, xs)
        except (ValueError, IndexError):
            instr.bad = True
            self.prog.instrs.append(instr)
            return None
        arrays = ref if isinstance(ref, list) else [ref]
        if any(not np.all(np.isfinite(a)) or (a.size and np.abs(a).max() > 1e4) for a in arrays):
            return None
        ins_vals = [self.prog.vals[i] for i in ins]
        if op == "leaf":
            rg, deps = params["rg"], frozenset([vid]) if params["rg"] else frozenset()
            self.prog.leaf_elems += ref.size if rg else 0
        elif op == "detach" or nograd:
            rg, deps = False, frozenset()
        elif op == "tuple_get_item" and ins_vals[0].parts:
            part = self.prog.vals[ins_vals[0].parts[params["index"]]]
            rg, deps = part.rg, part.deps
        else:
            rg = any(v.rg for v in ins_vals)
            deps = frozenset().union(*(v.deps for v in ins_vals))
        if op in KINKED and rg:
            self.prog.smooth = False
        parts = tuple(ins) if op == "make_tuple" else ()
        self.prog.vals[vid] = Val(ref, rg, deps, kind, parts)
        self.prog.instrs.append(instr)
        return vid

    def leaf(self, shape=None, positive=False, rg=None):
        shape = self.shape() if shape is None else tuple(shape)
        data = self.np_rng.uniform(-2, 2, size=shape)
        if positive:
            data = np.abs(data) + 0.2
        rg = self.r.random() < 0.7 if rg is None else rg
        return self.emit("leaf", (), {"data": data.astype(np.float32), "rg": rg})

    def pick(self, pred=lambda v: True):
        ids = self.tensors(pred)
        return self.r.choice(ids) if ids else None

    def bcast_partner(self, shape):
        """An existing value or a new leaf whose shape broadcasts with ``shape``."""
        if self.r.random() < 0.5:
            same = self.tensors(lambda a: a.shape == shape)
            if same:
                return self.r.choice(same)
        s = list(shape[self.r.randint(0, len(shape)) :]) if shape else []
        s = [1 if self.r.random() < 0.3 else d for d in s]
        if self.r.random() < 0.2 and len(s) < 4:
            s = [self.r.choice((1, 2))] + s
        return self.leaf(s)

    # -- op families -----------------------------------------------------------------
    def g_unary(self):
        x = self.pick()
        if x is None:
            return
        a = self.prog.vals[x].ref
        op = self.r.choice(UNARY)
        lo = a.min() if a.size else 1.0
        p = {}
        if op in ("log", "sqrt") and lo < 0.05:
            op = "tanh"
        if op == "exp" and a.size and a.max() > 4:
            op = "sigmoid"
        if op == "power_scalar":
            p["s"] = self.r.choice((2, 3, 0.5, -1)) if lo > 0.2 else self.r.choice((2, 3))
        if op in ("add_scalar", "mul_scalar", "div_scalar"):
            p["s"] = self.r.choice((-2.5, -1.0, 0.5, 1.5, 3.0))
        self.emit(op, (x,), p, nograd=self.r.random() < 0.08)

    def g_binary(self):
        x = self.pick()
        if x is None:
            return
        a = self.prog.vals[x].ref
        op = self.r.choice(BINARY)
        y = self.bcast_partner(a.shape)
        if y is None:
            return
        b = self.prog.vals[y].ref
        try:
            np.broadcast_shapes(a.shape, b.shape)
        except ValueError:
            return self.emit(op, (x, y), bad=True)
        if op == "div" and b.size and np.abs(b).min() < 0.3:
            op = "mul"
        if op == "power" and ((a.size and a.min() < 0.2) or (b.size and np.abs(b).max() > 3)):
            op = "add"
        if self.r.random() < 0.5:
            x, y = (y, x) if op in ("add", "mul") else (x, y)
        self.emit(op, (x, y))

    def g_shape(self):
        x = self.pick()
        if x is None:
            return
        a = self.prog.vals[x].ref
        op = self.r.choice(("reshape", "transpose", "broadcast_to", "getitem", "getitem", "flip"))
        if op == "reshape":
            if self.r.random() < 0.06:
                return self.emit(op, (x,), {"shape": (a.size + 1,)}, bad=True)
            dims, rest = [], a.size
            for _ in range(self.r.randint(0, 3)):
                f = self.r.choice([d for d in (1, 2, 3, 4) if rest % d == 0] or [1])
                dims.append(f)
                rest //= f
            dims.append(rest)
            self.r.shuffle(dims)
            if a.size and self.r.random() < 0.3:
                dims[self.r.randrange(len(dims))] = -1 if dims.count(0) == 0 else 0
            self.emit(op, (x,), {"shape": tuple(dims)})
        elif op == "transpose":
            if a.ndim < 2:
                if self.r.random() < 0.1:
                    self.emit(op, (x,), {"axes": (0, 3)}, bad=True)
                return
            axes = None if self.r.random() < 0.4 else tuple(self.r.sample(range(a.ndim), 2))
            self.emit(op, (x,), {"axes": axes})
        elif op == "broadcast_to":
            s = [d if d != 1 else self.r.choice((1, 2, 3)) for d in a.shape]
            s = [self.r.choice((1, 2)) for _ in range(self.r.randint(0, 2))] + s
            bad = self.r.random() < 0.06 and any(d > 1 for d in a.shape)
            if bad:
                s = [d + 1 if d > 1 else d for d in s]
            self.emit(op, (x,), {"shape": tuple(s)}, bad=bad)
        elif op == "getitem":
            key = []
            for d in a.shape[: self.r.randint(0, a.ndim)]:
                c = self.r.random()
                if c < 0.3 and d:
                    key.append(self.r.randrange(-d, d))
                elif c < 0.35:
                    key.append(d + self.r.randint(0, 2))  # out of range
                else:
                    lo, hi = self.r.randint(-d - 1, d + 1), self.r.randint(-d - 1, d + 1)
                    key.append(
                        slice(
                            self.r.choice((lo, None)),
                            self.r.choice((hi, None)),
                            self.r.choice((None, 1, 2, -1, -2, 3)),
                        )
                    )
            key = tuple(key)
            try:
                a[key]
            except IndexError:
                return self.emit(op, (x,), {"key": key}, bad=True)
            self.emit(op, (x,), {"key": key})
        else:
            if a.ndim == 0:
                return
            axes = tuple(sorted(self.r.sample(range(a.ndim), self.r.randint(1, a.ndim))))
            self.emit(op, (x,), {"axes": axes})

    def g_reduce(self):
        x = self.pick()
        if x is None:
            return
        a = self.prog.vals[x].ref
        op = self.r.choice(("summation", "summation", "max", "logsumexp"))
        c = self.r.random()
        if c < 0.25 or a.ndim == 0:
            axes = None
        elif c < 0.3:
            return self.emit(op, (x,), {"axes": (a.ndim + 1,)}, bad=True)
        else:
            axes = tuple(self.r.sample(range(a.ndim), self.r.randint(1, a.ndim)))
            if self.r.random() < 0.3:
                axes = tuple(ax - a.ndim for ax in axes)
        reduced = a.size if axes is None else int(np.prod([a.shape[ax] for ax in axes]))
        if op in ("max", "logsumexp") and reduced == 0:
            return self.emit(op, (x,), {"axes": axes}, bad=True)
        self.emit(op, (x,), {"axes": axes}, nograd=self.r.random() < 0.05)

    def g_matmul(self):
        x = self.pick(lambda a: 2 <= a.ndim <= 3)
        if x is None:
            x = self.leaf((self.dim(), self.dim()))
            if x is None:
                return
        a = self.prog.vals[x].ref
        k = a.shape[-1]
        if self.r.random() < 0.05:
            y = self.leaf((k + 1, 2))
            return self.emit("matmul", (x, y), bad=True) if y is not None else None
        bshape = (k, self.dim())
        if a.ndim == 3 and self.r.random() < 0.4:
            bshape = (a.shape[0],) + bshape
        y = self.pick(lambda b: b.shape == bshape)
        y = self.leaf(bshape) if y is None or self.r.random() < 0.5 else y
        if y is not None:
            self.emit("matmul", (x, y))

    def g_tuple(self):
        c = self.r.random()
        if c < 0.4:
            x = self.pick(lambda a: a.ndim >= 1)
            if x is None:
                return
            a = self.prog.vals[x].ref
            t = self.emit("split", (x,), {"axis": self.r.randrange(a.ndim)}, kind="tuple")
        else:
            x = self.pick()
            if x is None:
                return
            shape = self.prog.vals[x].ref.shape
            parts = [x] + [
                self.pick(lambda a: a.shape == shape) or x for _ in range(self.r.randint(0, 2))
            ]
            if c < 0.75:
                axis = self.r.randint(-len(shape) - 1, len(shape))
                if self.r.random() < 0.05:
                    other = self.leaf(tuple(d + 1 for d in shape) or (2,))
                    if other is not None:
                        self.emit("stack", tuple(parts) + (other,), {"axis": 0}, bad=True)
                    return
                self.emit("stack", parts, {"axis": axis})
                return
            t = self.emit("make_tuple", parts, kind="tuple")
        if t is not None and self.prog.vals[t].ref:
            n = len(self.prog.vals[t].ref)
            for _ in range(self.r.randint(1, 2)):
                self.emit("tuple_get_item", (t,), {"index": self.r.randrange(n)})

    def g_nn(self):
        c = self.r.random()
        if c < 0.4:
            n, k = self.r.randint(1, 4), self.r.randint(1, 4)
            x = self.pick(lambda a: a.ndim == 2 and a.shape[0] >= 1 and a.shape[1] >= 1)
            x = self.leaf((n, k)) if x is None else x
            if x is None:
                return
            n, k = self.prog.vals[x].ref.shape
            labels = self.np_rng.integers(0, k, size=n).astype(np.float32)
            y = self.emit("leaf", (), {"data": labels, "rg": False})
            self.emit("softmax_cross_entropy", (x, y))
        elif c < 0.6:
            x = self.pick(lambda a: a.ndim == 2)
            if x is not None:  # no classes: the row maximum is undefined, as in max
                self.emit("logsoftmax", (x,), bad=self.prog.vals[x].ref.shape[1] == 0)
        else:
            k = self.r.choice((1, 2, 3))
            stride, padding = self.r.choice((1, 2)), self.r.choice((0, 1))
            h = self.r.randint(max(1, k - 2 * padding), 5)
            x = self.leaf(
                (
                    self.r.randint(1, 2),
                    h,
                    self.r.randint(max(1, k - 2 * padding), 5),
                    self.r.randint(1, 2),
                )
            )
            if x is None:
                return
            w = self.leaf((k, k, self.prog.vals[x].ref.shape[3], self.r.randint(1, 2)))
            if w is not None:
                self.emit("conv", (x, w), {"stride": stride, "padding": padding})

    def generate(self):
        for _ in range(self.r.randint(1, 3)):
            self.leaf()
        fams = [self.g_unary] * 4 + [self.g_binary] * 4 + [self.g_shape] * 4
        fams += [self.g_reduce] * 2 + [self.g_matmul, self.g_tuple, self.g_nn]
        fams += [lambda: self.emit("detach", (self.pick(),)) if self.pick() is not None else None]
        for _ in range(self.n):
            if self.r.random() < 0.1:
                self.leaf()
            self.r.choice(fams)()
            if self.r.random() < 0.1:
                self.backward()
        self.backward()
        return self.prog

    def backward(self):
        outs = [i for i, v in self.prog.vals.items() if v.kind == "tensor" and v.rg and v.deps]
        if not outs:
            return
        vid = self.r.choice(outs[-4:] if self.r.random() < 0.7 else outs)
        shape = self.prog.vals[vid].ref.shape
        g = self.np_rng.uniform(-1, 1, size=shape).astype(np.float32)
        self.prog.instrs.append(Instr("backward", (vid,), {"g": g}, -1))


def generate(seed, n_instrs=None):
    return Generator(seed, n_instrs).generate()
