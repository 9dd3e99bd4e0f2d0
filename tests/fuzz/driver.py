"""Runs one fuzz program by seed and checks everything a run can lie about.

``run_seed(seed)`` draws a Tensor program and an NDArray program from ``seed`` and:

- runs the Tensor program undisturbed in one graph mode and disturbed (``disturb``) in the
  other; both must match the NumPy mirror, each other (forward values and the gradients of
  every backward that completed in both), and, for smooth programs with few leaf
  elements, a float64 central finite difference of ``sum(output * out_grad)``;
- after each run, with everything dropped and ``gc.collect()``, the CPU's allocated bytes
  are back at their start value and the gc threshold, gc callbacks and the memory limit are
  as they were; no exception went to ``sys.unraisablehook``.

It raises ``FuzzFailure`` listing every finding.
"""

import gc
import sys

import numpy as np

import needle as ndl

from . import disturb, ndarray_prog, tensor_gen, tensor_run


class FuzzFailure(AssertionError):
    pass


FD_MAX_ELEMS = 40


def _finite_difference(prog, vid, g, leaf, h=1e-6):
    base = {i: v.ref for i, v in prog.vals.items() if prog.instrs and v.kind == "tensor"}
    x = prog.vals[leaf].ref.astype(np.float64)
    grad = np.zeros_like(x)
    flat = grad.reshape(-1)
    for j in range(x.size):
        vals = []
        for sign in (1, -1):
            xp = x.copy().reshape(-1)
            xp[j] += sign * h
            out = tensor_gen.evaluate(prog, {leaf: xp.reshape(x.shape)})[vid]
            vals.append(np.sum(out * g))
        flat[j] = (vals[0] - vals[1]) / (2 * h)
    del base
    return grad


class _Checked:
    """Leak, settings and unraisable-exception checks around one run."""

    def __init__(self, failures, what):
        self.failures, self.what = failures, what

    def __enter__(self):
        gc.collect()
        self.start = ndl.memory.memory_allocated("cpu")
        self.threshold = gc.get_threshold()
        self.callbacks = list(gc.callbacks)
        self.limit = ndl.memory.get_memory_limit("cpu")
        self.unraisable = []
        self.hook = sys.unraisablehook
        sys.unraisablehook = lambda u: self.unraisable.append(
            f"unraisable {u.exc_type.__name__}: {u.exc_value} in {u.object!r}"
        )
        return self

    def __exit__(self, *exc):
        disturb.DISTURBER[0] = None
        gc.collect()
        gc.collect()
        sys.unraisablehook = self.hook
        f = self.failures
        f.extend(f"{self.what}: {u}" for u in self.unraisable)
        now = ndl.memory.memory_allocated("cpu")
        if now != self.start:
            f.append(f"{self.what}: {now - self.start} bytes still allocated after the program")
        if gc.get_threshold() != self.threshold:
            f.append(f"{self.what}: gc threshold not restored")
        if list(gc.callbacks) != self.callbacks:
            f.append(f"{self.what}: gc.callbacks not restored")
        if ndl.memory.get_memory_limit("cpu") != self.limit:
            ndl.memory.set_memory_limit("cpu", self.limit)
            f.append(f"{self.what}: memory limit not restored")
        return False


def _run_tensor(prog, mode, disturber, failures, what):
    with _Checked(failures, what):
        if disturber is not None:
            disturb.DISTURBER[0] = disturber
            disturber.start()
        try:
            res = tensor_run.run(prog, mode, disturber)
        except Exception as err:  # noqa: BLE001 - an unexpected exception is a finding
            failures.append(f"{what}: {type(err).__name__}: {err}")
            return None
        finally:
            if disturber is not None:
                disturber.stop()
        failures.extend(f"{what}: {f}" for f in res.failures)
        if disturber is not None:
            failures.extend(f"{what}: {e}" for e in disturber.errors)
        return res


def check_tensor_program(seed, disturbed=True):
    prog = tensor_gen.generate(seed)
    failures = []
    (other,) = (m for m in ndl.autograd.GRAPH_MODES if m != prog.mode)
    ref = _run_tensor(prog, other, None, failures, f"seed {seed} plain/{other}")
    dis = None
    if disturbed:
        dis = _run_tensor(
            prog, prog.mode, disturb.Disturber(seed), failures, f"seed {seed} disturbed/{prog.mode}"
        )
    if ref is not None and dis is not None:
        for vid, got in dis.values.items():
            want = ref.values.get(vid)
            if want is not None and not _close_any(got, want):
                failures.append(f"seed {seed}: value {vid} differs between the runs")
        for k, grads in dis.grads.items():
            for leaf, got in grads.items():
                want = ref.grads.get(k, {}).get(leaf)
                if want is not None and not tensor_run.close(got, want, 1e-4, 1e-5):
                    failures.append(
                        f"seed {seed}: backward {k} leaf {leaf}: gradients differ "
                        "between the plain and the disturbed run"
                    )
    if ref is not None and prog.smooth and prog.leaf_elems <= FD_MAX_ELEMS:
        backwards = [ins for ins in prog.instrs if ins.op == "backward"]
        for k, ins in enumerate(backwards):
            for leaf, got in ref.grads.get(k, {}).items():
                want = _finite_difference(prog, ins.ins[0], ins.params["g"], leaf)
                if not tensor_run.close(got, want, 1e-2, 2e-3):
                    failures.append(
                        f"seed {seed}: backward {k} leaf {leaf}: gradient differs "
                        "from the finite difference"
                    )
    return failures


def _close_any(a, b):
    if isinstance(a, list):
        return isinstance(b, list) and len(a) == len(b) and all(map(_close_any, a, b))
    return tensor_run.close(a, b, 1e-5, 1e-6)


def run_seed(seed, disturbed=True):
    failures = check_tensor_program(seed, disturbed)
    with _Checked(failures, f"seed {seed} ndarray"):
        try:
            failures.extend(ndarray_prog.run(seed, disturbed))
        except Exception as err:  # noqa: BLE001 - an unexpected exception is a finding
            failures.append(f"seed {seed} ndarray: {type(err).__name__}: {err}")
    if failures:
        raise FuzzFailure("\n".join(failures))
