"""Hostile programs: graph attributes set to inconsistent values on purpose.

A random graph is built, then nodes get attributes no op made (``inputs`` that contain the
node itself, too few or too many inputs, an ``op`` of another arity, ``cached_data`` of
another shape, a tuple on a Tensor or None on a leaf, ``requires_grad`` flipped, ``grad`` of
the wrong shape) between further ops, backward passes, ``realize_cached_data``,
``find_topo_sort``, ``numpy`` and the memory diagnostics, under the usual disturbances. Only
ValueError, TypeError and IndexError (and ``OutOfMemoryError`` under a limit) may come
out; no crash, no SystemError, and no bytes left allocated once everything is dropped.
``run_hostile(seed)`` returns the findings.
"""

import random

import numpy as np

import needle as ndl
from needle import backend_ndarray as nd

from . import disturb
from .driver import _Checked

ALLOWED = (ValueError, TypeError, IndexError)
# backward() on a node left with no graph (requires_grad flipped off) is PyTorch's error.
NO_GRAPH = "does not require grad and does not have a grad_fn"


def _ops(r):
    return [
        lambda a, b: a + b,
        lambda a, b: a * b,
        lambda a, b: ndl.exp(a),
        lambda a, b: ndl.summation(a, (0,)),
        lambda a, b: a @ b,
        lambda a, b: ndl.stack([a, b], 0),
        lambda a, b: ndl.split(a, 0)[0],
        lambda a, b: ndl.make_tuple(a, b),
        lambda a, b: ndl.tuple_get_item(a, 0),
        lambda a, b: ndl.logsumexp(a, (0,)),
        lambda a, b: ndl.max(a),
        lambda a, b: ndl.reshape(a, (-1,)),
        lambda a, b: ndl.transpose(a),
        lambda a, b: ndl.broadcast_to(a, (2,) + tuple(a.shape)) if isinstance(a, ndl.Tensor) else a,
        lambda a, b: a[0],
        lambda a, b: disturb.MulAdd()(a, b),
        lambda a, b: ndl.relu(a - b),
    ]


def _mutations(r, nodes):
    def other():
        return r.choice(nodes)

    def arr(shape):
        return nd.array(np.ones(shape, np.float32))

    return [
        lambda n: setattr(n, "inputs", [n]),
        lambda n: setattr(n, "inputs", []),
        lambda n: setattr(n, "inputs", list(n.inputs) + [other()]),
        lambda n: setattr(n, "inputs", [other()]),
        lambda n: setattr(n, "op", other().op),
        lambda n: setattr(n, "op", None),
        lambda n: setattr(n, "cached_data", arr((r.randint(0, 3), 2))),
        lambda n: setattr(n, "cached_data", None),
        lambda n: setattr(n, "cached_data", (arr((2,)), arr((3,)))),
        lambda n: setattr(n, "cached_data", arr(())),
        lambda n: setattr(n, "requires_grad", not n.requires_grad),
        lambda n: setattr(n, "grad", ndl.Tensor(np.ones((5,), np.float32))),
        lambda n: setattr(n, "grad", None),
        lambda n: setattr(n, "data", other()) if isinstance(n, ndl.Tensor) else None,
    ]


def _uses(r, nodes):
    def pick():
        return r.choice(nodes)

    return [
        lambda: pick().backward(),
        lambda: pick().backward(ndl.Tensor(np.ones((2, 2), np.float32))),
        lambda: pick().realize_cached_data(),
        lambda: ndl.autograd.find_topo_sort([pick(), pick()]),
        lambda: pick().numpy(),
        lambda: repr(pick()),
        lambda: pick().detach(),
        lambda: getattr(pick(), "shape", None),
        lambda: list(pick().inputs),
        lambda: ndl.memory.find_cycles(),
        lambda: ndl.memory.live_tensors(),
    ]


def run_hostile(seed):
    r = random.Random(seed ^ 0x5EED)
    failures = []
    with _Checked(failures, f"hostile seed {seed}"):
        d = disturb.Disturber(seed + 4242)
        disturb.DISTURBER[0] = d
        d.start()
        try:
            with ndl.autograd.graph_mode(r.choice(ndl.autograd.GRAPH_MODES)):
                _program(r, d, failures)
        finally:
            d.stop()
        failures.extend(d.errors)
    return [f"hostile seed {seed}: {f}" if not f.startswith("hostile") else f for f in failures]


def _program(r, d, failures):
    nodes = [
        ndl.Tensor(np.random.default_rng(seed).uniform(-1, 1, (2, 2)).astype(np.float32))
        for seed in range(r.randint(2, 3))
    ]
    ops, muts, uses = _ops(r), _mutations(r, nodes), _uses(r, nodes)
    for step in range(r.randint(8, 30)):
        d.step(step)
        for n in nodes:
            d.register(n)
        c = r.random()
        try:
            if c < 0.45:
                out = r.choice(ops)(r.choice(nodes), r.choice(nodes))
                nodes.append(out)
            elif c < 0.7:
                r.choice(muts)(r.choice(nodes))
            else:
                r.choice(uses)()
        except ndl.OutOfMemoryError:
            if not d.limited:
                failures.append(f"step {step}: OutOfMemoryError without a limit")
        except ALLOWED:
            pass
        except RuntimeError as err:
            if NO_GRAPH not in str(err):
                failures.append(f"step {step}: RuntimeError: {err}")
        except Exception as err:  # noqa: BLE001 - anything else is a finding
            failures.append(f"step {step}: {type(err).__name__}: {err}")
        if len(nodes) > 10:
            del nodes[r.randrange(len(nodes))]
    nodes.clear()
