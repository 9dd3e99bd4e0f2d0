"""Executes a ``tensor_gen.Program`` on needle and checks it as it goes.

``run(prog, mode, disturber)`` returns a ``Result``: the needle value of every instruction
that ran (as NumPy), the leaf gradients after every backward, whether an allocation failed,
and ``failures`` (strings): an undocumented exception, a bad instruction that was accepted,
a value of the wrong shape, value or ``requires_grad``. The caller compares two runs and the
finite differences (``driver``).
"""

import contextlib
from dataclasses import dataclass, field

import numpy as np

import needle as ndl

from . import disturb

EXPECTED_BAD = (ValueError, TypeError, IndexError)


@dataclass
class Result:
    values: dict = field(default_factory=dict)
    grads: dict = field(default_factory=dict)  # backward index -> {leaf id: array}
    oom: bool = False
    failures: list = field(default_factory=list)


def close(got, want, rtol=1e-3, atol=1e-3):
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    if got.shape != want.shape:
        return False
    scale = 1.0 + (np.abs(want).max() if want.size else 0.0)
    return bool(np.allclose(got, want, rtol=rtol, atol=atol * scale, equal_nan=False))


def _call(op, p, xs, leaf_class):
    x = xs[0] if xs else None
    if op == "leaf":
        return leaf_class(p["data"], requires_grad=p["rg"])
    simple = {
        "negate": ndl.negate, "exp": ndl.exp, "log": ndl.log, "tanh": ndl.tanh,
        "sigmoid": ndl.sigmoid, "relu": ndl.relu, "sqrt": ndl.sqrt, "logsoftmax": ndl.logsoftmax,
    }  # fmt: skip
    if op in simple:
        return simple[op](x)
    if op == "detach":
        return x.detach()
    if op == "power_scalar":
        return x ** p["s"] if p["s"] in (2, 3) else ndl.power_scalar(x, p["s"])
    if op == "add_scalar":
        return x + p["s"]
    if op == "mul_scalar":
        return ndl.mul_scalar(x, p["s"])
    if op == "div_scalar":
        return x / p["s"]
    if op == "pyop_scale":
        return disturb.Scale()(x)
    if op == "add":
        return x + xs[1]
    if op == "sub":
        return x - xs[1]
    if op == "mul":
        return x * xs[1]
    if op == "div":
        return ndl.divide(x, xs[1])
    if op == "power":
        return ndl.power(x, xs[1])
    if op == "pyop_muladd":
        return disturb.MulAdd()(x, xs[1])
    if op == "reshape":
        return ndl.reshape(x, p["shape"])
    if op == "transpose":
        return ndl.transpose(x, p["axes"])
    if op == "broadcast_to":
        return ndl.broadcast_to(x, p["shape"])
    if op == "getitem":
        return x[p["key"]]
    if op == "flip":
        return ndl.flip(x, p["axes"])
    if op == "summation":
        return ndl.summation(x, p["axes"])
    if op == "max":
        return ndl.max(x, p["axes"])
    if op == "logsumexp":
        return ndl.logsumexp(x, p["axes"])
    if op == "matmul":
        return x @ xs[1]
    if op == "stack":
        return ndl.stack(list(xs), p["axis"])
    if op == "split":
        return ndl.split(x, p["axis"])
    if op == "make_tuple":
        return ndl.make_tuple(*xs)
    if op == "tuple_get_item":
        return x[p["index"]]
    if op == "softmax_cross_entropy":
        return ndl.softmax_cross_entropy(x, xs[1])
    if op == "conv":
        return ndl.conv(x, xs[1], p["stride"], p["padding"])
    raise AssertionError(op)


def _last_uses(prog):
    last = {}
    for i, ins in enumerate(prog.instrs):
        for v in ins.ins:
            last[v] = i
    return last


def _as_numpy(value):
    if isinstance(value, ndl.autograd.TensorTuple):
        return [t.numpy() for t in value]
    return value.numpy()


def run(prog, mode, disturber=None):
    res = Result()
    env = {}
    last = _last_uses(prog)
    keep = {i for i, v in prog.vals.items() if v.rg and not v.deps - {i}}  # rg leaves
    leaf_class = ndl.Tensor
    n_backward = 0
    try:
        with ndl.autograd.graph_mode(mode):
            for step, ins in enumerate(prog.instrs):
                if disturber is not None:
                    disturber.step(step)
                    leaf_class = disturber.leaf_class()
                    for vid in [v for v in env if last.get(v, -1) < step and v not in keep]:
                        if disturber.r.random() < 0.4:
                            del env[vid]
                if any(i not in env for i in ins.ins):
                    if ins.op == "backward":
                        n_backward += 1
                    continue  # an input was not made (out of memory)
                if ins.op == "backward":
                    _backward(prog, ins, env, res, n_backward, disturber)
                    n_backward += 1
                    continue
                _step(prog, ins, env, res, leaf_class, disturber)
            for vid, value in env.items():  # nothing changed them since they were made
                got = _as_numpy(value)
                if not _same(got, res.values.get(vid)):
                    res.failures.append(f"value {vid} changed after it was made")
    except ndl.OutOfMemoryError:
        if disturber is None or not disturber.limited:
            raise
        res.oom = True
    finally:
        env.clear()
    return res


def _same(a, b):
    if isinstance(a, list):
        return isinstance(b, list) and len(a) == len(b) and all(map(_same, a, b))
    return b is not None and a.shape == b.shape and np.array_equal(a, b)


def _oom_expected(disturber):
    return disturber is not None and disturber.limited


def _step(prog, ins, env, res, leaf_class, disturber):
    xs = [env[i] for i in ins.ins]
    ctx = ndl.no_grad() if ins.nograd else contextlib.nullcontext()
    try:
        with ctx:
            out = _call(ins.op, ins.params, xs, leaf_class)
    except ndl.OutOfMemoryError:
        if not _oom_expected(disturber):
            raise
        res.oom = True
        disturb.STATS["ooms"] += 1
        return
    except EXPECTED_BAD as err:
        if not ins.bad:
            res.failures.append(f"instr {ins.op}{ins.params} raised {type(err).__name__}: {err}")
        return
    del xs
    if ins.bad:
        res.failures.append(f"bad instr {ins.op} {ins.params} was accepted")
        return
    env[ins.out] = out
    if disturber is not None:
        disturber.register(out)
    want = prog.vals[ins.out]
    if isinstance(out, ndl.autograd.TensorTuple):
        got = _as_numpy(out)
        ok = len(got) == len(want.ref) and all(close(g, w) for g, w in zip(got, want.ref))
    else:
        got = out.numpy()
        ok = close(got, want.ref)
        if out.requires_grad != want.rg:
            res.failures.append(
                f"instr {ins.out} {ins.op}: requires_grad {out.requires_grad}, want {want.rg}"
            )
    res.values[ins.out] = got
    if not ok:
        where = f"instr {ins.out} {ins.op}{_short(ins.params)}"
        res.failures.append(f"{where}: value differs from NumPy")


def _short(params):
    return {k: v for k, v in params.items() if k != "data"}


def _backward(prog, ins, env, res, index, disturber):
    vid = ins.ins[0]
    # each backward's gradients alone: cycle_free mode adds into a .grad that is there (as
    # PyTorch does), needle mode replaces it, and the runs compare the two
    for leaf in prog.vals[vid].deps:
        if leaf in env and isinstance(env[leaf], ndl.Tensor) and env[leaf].op is None:
            env[leaf].grad = None
    try:
        g = ndl.Tensor(ins.params["g"], requires_grad=False)
        env[vid].backward(g)
        del g
    except ndl.OutOfMemoryError:
        if not _oom_expected(disturber):
            raise
        res.oom = True
        return
    grads = {}
    for leaf in prog.vals[vid].deps:
        t = env.get(leaf)
        if t is None:
            continue
        grad = t.grad
        if grad is None:
            res.failures.append(f"backward {index}: leaf {leaf} got no gradient")
            continue
        grads[leaf] = grad.numpy()
        if grads[leaf].shape != prog.vals[leaf].ref.shape:
            res.failures.append(f"backward {index}: gradient of leaf {leaf} has the wrong shape")
    res.grads[index] = grads
