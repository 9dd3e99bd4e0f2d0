"""DistributedDataParallel's reducer: the gradient averaging that runs inside ``backward()``.

Each synchronised parameter carries a post-accumulate-grad hook (the engine's, PyTorch's
semantics). When the last gradient of a bucket has been accumulated, the bucket is packed
(each ``p.grad`` copied into the flat buffer, zeros where a parameter has none) and its SUM
all-reduce starts without waiting: over MPI on the process group's communication thread, over
NCCL on its own stream after an event on needle's (``collectives.start_all_reduce``).
Buckets start in index order on every rank, as MPI and NCCL need. A callback queued with the
engine for the end of the outermost backward waits for the all-reduces, divides by the world
size and makes each ``p.grad`` a view of its bucket, so ``backward()`` returns with the averaged
gradients in place.

The last bucket also carries one presence flag per parameter (a parameter whose ``grad`` is
None on every rank keeps ``grad = None``) and, with aligned collections, each rank's collection
wants (``needle.memory.alignment``), with no extra round trip.

What an optimizer must not read (``check_grads``, run by every optimizer's ``step()`` and
``clip_grad_norm()``): gradients accumulated under ``no_sync()`` and never averaged, and those
of a backward that raised before its averaging finished.
"""

import time
import weakref

import numpy as np

from .. import autograd
from ..autograd import Tensor, no_grad
from ..backend_ndarray import NDArray, empty
from ..memory import alignment as _alignment

# The dtypes that carry the presence flags and the alignment wants exactly enough; a model
# whose last bucket is narrow gets one more, float32, bucket for them.
TAIL_DTYPES = ("float32", "float64")


def numel(p):
    n = 1
    for d in p.shape:
        n *= d
    return n


class Bucket:
    """One flat buffer (on the parameters' device, in their dtype) holding the gradients of
    ``params`` back to back (``indices``: their positions in the reducer's list), reduced
    with one all-reduce; ``extra`` elements after them carry the last bucket's tail."""

    def __init__(self, params, indices, device, dtype, extra):
        self.params = params
        self.indices = indices
        self.offsets = []
        size = 0
        for p in params:
            self.offsets.append(size)
            size += numel(p)
        self.grad_size = size
        self.device = device
        self.flat = empty((size + extra,), dtype=dtype, device=device)


def plan_buckets(params, cap_bytes, first_cap_bytes, tail, default_device):
    """Buckets over ``params`` in reverse order (the last layers' gradients are ready first):
    a new bucket starts when the next parameter would pass the cap (``first_cap_bytes`` for
    the first bucket, which is ready earliest, ``cap_bytes`` after), lives on another device
    or has another dtype. The last bucket gets ``tail`` extra elements when it is float32 or
    float64, else one more float32 bucket of no gradients carries them."""
    groups = []
    current, current_bytes, current_key = [], 0, None
    for i in reversed(range(len(params))):
        p = params[i]
        key = (p.device, p.dtype)
        nbytes = numel(p) * p.realize_cached_data().itemsize
        cap = first_cap_bytes if not groups else cap_bytes
        if current and (current_bytes + nbytes > cap or key != current_key):
            groups.append((current, *current_key))
            current, current_bytes = [], 0
        current.append(i)
        current_bytes += nbytes
        current_key = key
    if current:
        groups.append((current, *current_key))
    if tail and (not groups or groups[-1][2] not in TAIL_DTYPES):
        device = groups[-1][1] if groups else default_device
        groups.append(([], device, "float32"))
    last = len(groups) - 1
    return [
        Bucket([params[i] for i in idx], idx, device, dtype, tail if b == last else 0)
        for b, (idx, device, dtype) in enumerate(groups)
    ]


def _hook(reducer_ref, index):
    """A parameter's post-accumulate-grad hook: a weak reference, so a dropped wrapper stops
    averaging (and its reducer is freed) even while the model lives on."""

    def hook(param):
        reducer = reducer_ref()
        if reducer is not None:
            reducer.grad_ready(index)

    return hook


class Reducer:
    """The hook-driven averaging of ``params`` (see the module docstring)."""

    def __init__(self, params, buckets, world_size, rank, aligned, find_unused, collectives):
        self.params = params
        self.buckets = buckets
        self.world_size = world_size
        self.rank = rank
        self.aligned = aligned
        self.find_unused = find_unused
        self._collectives = collectives
        self.bucket_of = [0] * len(params)
        for b, bucket in enumerate(buckets):
            for i in bucket.indices:
                self.bucket_of[i] = b
        self.no_sync_depth = 0
        # gradients accumulated under no_sync() and not averaged since
        self.unsynced = False
        # a reduction started (its backward ran hooks) and not finished: why, for the error
        self.active = False
        self.backward = None  # the engine's id of the backward being reduced
        self.broken = None
        # parameters the last training forward could not reach (find_unused_parameters)
        self.unused_from_forward = ()
        self.ready_at = None
        self.stats = {
            "reductions": 0,
            "exposed_wait_s": 0.0,
            "last_arrival": None,
            "last_done": None,
        }
        self._reset()
        ref = weakref.ref(self)
        self.handles = [
            p.register_post_accumulate_grad_hook(_hook(ref, i)) for i, p in enumerate(params)
        ]
        weakref.finalize(self, _remove_all, self.handles)

    def _reset(self):
        self.pending = [len(b.params) for b in self.buckets]
        self.ready = bytearray(len(self.params))
        self.present = np.zeros(len(self.params), dtype=np.float32)
        self.works = [None] * len(self.buckets)
        self.next_launch = 0

    # -- during backward ----------------------------------------------------------------------

    def grad_ready(self, index):
        if self.no_sync_depth:
            if autograd.get_graph_mode() == "needle":
                raise RuntimeError(
                    "DistributedDataParallel.no_sync() accumulates gradients over several "
                    "backward passes, but graph mode 'needle' (the course's backward) replaces "
                    ".grad instead of adding to it: use the default 'cycle_free' mode"
                )
            self.unsynced = True
            return
        backward = autograd._backward_id()
        if not self.active or backward != self.backward:
            self._begin(backward)
        if self.ready[index]:
            return
        self._mark_ready(index)

    def _begin(self, backward):
        if self.active:
            # the last backward raised after starting some all-reduces: the other ranks
            # started them too, so they complete (or time out naming the ranks)
            self._wait_launched()
        autograd._queue_callback(self.finish)
        self._reset()
        self.backward = backward
        self.active = True
        self.broken = "a backward did not finish averaging the gradients (it raised)"
        for i in self.unused_from_forward:
            self._mark_ready(i)

    def _mark_ready(self, index):
        self.ready[index] = 1
        b = self.bucket_of[index]
        self.pending[b] -= 1
        if self.pending[b] == 0 and b == self.next_launch:
            self._launch_ready()

    def _launch_ready(self):
        while self.next_launch < len(self.buckets) and self.pending[self.next_launch] == 0:
            self._launch(self.next_launch)
            self.next_launch += 1

    def _launch(self, b):
        bucket = self.buckets[b]
        with no_grad():
            for p, i, offset in zip(bucket.params, bucket.indices, bucket.offsets):
                n = numel(p)
                grad = p.grad
                if grad is None:
                    if n:
                        bucket.flat[offset : offset + n].fill(0.0)
                    continue
                if tuple(grad.shape) != tuple(p.shape):
                    raise ValueError(
                        f"DistributedDataParallel: a gradient of shape {tuple(grad.shape)} "
                        f"for a parameter of shape {tuple(p.shape)}"
                    )
                self.present[i] = 1.0
                if n:
                    bucket.flat[offset : offset + n] = grad.realize_cached_data().reshape((n,))
            if b == len(self.buckets) - 1 and bucket.flat.size > bucket.grad_size:
                tail = self.present
                if self.aligned:
                    wants = _alignment.local_wants(self.rank, self.world_size)
                    tail = np.concatenate([tail, np.asarray(wants, dtype=np.float32)])
                bucket.flat[bucket.grad_size :] = NDArray(tail, device=bucket.device)
        # when this rank had every gradient of the bucket: for the last bucket, the end of
        # the backward's computation (what the all-reduces can hide under ends here)
        self.ready_at = time.perf_counter()
        self.works[b] = self._collectives.start_all_reduce(bucket.flat, "DistributedDataParallel")

    # -- at the end of backward ---------------------------------------------------------------

    def finish(self):
        """The engine's end-of-backward callback: every bucket launched, waited for, averaged
        and unpacked into ``p.grad``."""
        start = time.perf_counter()
        missing = [i for i in range(len(self.params)) if not self.ready[i]]
        if missing and not self.find_unused:
            self._wait_launched()
            self.active = False
            names = ", ".join(f"#{i} {tuple(self.params[i].shape)}" for i in missing[:8])
            more = f" and {len(missing) - 8} more" if len(missing) > 8 else ""
            self.broken = (
                f"the backward gave no gradient to {len(missing)} parameter(s) ({names}{more})"
            )
            raise RuntimeError(
                f"DistributedDataParallel: {self.broken}, so their buckets could not be "
                "averaged; pass find_unused_parameters=True when some parameters take no part "
                "in the loss (their parameter indices are in module.parameters() order)"
            )
        for i in missing:
            self._mark_ready(i)
        self._launch_ready()
        self._wait_launched()
        done = time.perf_counter()
        self.stats["exposed_wait_s"] += done - start
        # when this rank's backward had computed its last gradient and when its all-reduces
        # were done (time.perf_counter: one clock for the processes of a machine), for a
        # benchmark to tell the all-reduces' own exposed time from the wait for a later rank
        self.stats["last_arrival"], self.stats["last_done"] = self.ready_at, done
        self._unpack()
        self.active = False
        self.broken = None
        self.unsynced = False
        self.stats["reductions"] += 1

    def _wait_launched(self):
        for work in self.works:
            if work is not None:
                work.wait()

    def _unpack(self):
        last = self.buckets[-1]
        with no_grad():
            summed_tail = last.flat[last.grad_size :].numpy()
            summed_present = summed_tail[: len(self.params)]
            for bucket in self.buckets:
                if bucket.grad_size:
                    grads = bucket.flat[: bucket.grad_size]
                    bucket.flat[: bucket.grad_size] = grads / self.world_size
                for p, i, offset in zip(bucket.params, bucket.indices, bucket.offsets):
                    if summed_present[i] == 0:
                        p.grad = None
                        continue
                    view = bucket.flat[offset : offset + numel(p)].reshape(tuple(p.shape))
                    p.grad = Tensor.make_const(view)
        if self.aligned:
            _alignment.agreed(summed_tail[len(self.params) :])

    # -- what optimizers ask ------------------------------------------------------------------

    def check_grads(self, params):
        """Raises RuntimeError when ``params`` (an optimizer's) include gradients this reducer
        has not averaged."""
        if not self.unsynced and self.broken is None:
            return
        mine = {id(p) for p in self.params}
        if not any(id(p) in mine for p in params):
            return
        if self.broken is not None:
            raise RuntimeError(
                f"DistributedDataParallel: {self.broken}; the gradients were not averaged "
                "over the ranks, and a step would train the replicas apart: run a backward "
                "that completes (or zero the gradients) before step()"
            )
        if any(p.grad is not None for p in self.params):
            raise RuntimeError(
                "DistributedDataParallel: the gradients were accumulated under no_sync() and "
                "never averaged over the ranks, and a step would train the replicas apart: "
                "run the last micro-batch's backward outside no_sync() before step()"
            )
        self.unsynced = False


def _remove_all(handles):
    for h in handles:
        h.remove()
