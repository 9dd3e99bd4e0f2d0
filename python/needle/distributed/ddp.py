"""DistributedDataParallel: one model replica per rank, gradients averaged over the process
group in buckets, as PyTorch's DDP does, on needle's autograd (which has no per-parameter
backward hooks: the gradients are synchronised after ``backward()``, see the class docstring).
"""

import numpy as np

from .._checks import check_real
from ..autograd import Tensor, is_grad_enabled, no_grad
from ..backend_ndarray import NDArray, empty
from ..memory import alignment as _alignment
from ..nn import Module

__all__ = ["DistributedDataParallel"]

_MIB = 1024 * 1024
# BatchNorm's running statistics are the only module state that is not a Parameter; other
# Tensor attributes (attention's saved probabilities) are per-batch scratch, not model state.
_BUFFER_PREFIX = "running_"


def _dist():
    # The package imports this module; look the collectives up at call time.
    from needle import distributed

    return distributed


# The dtypes that carry the presence flags and the alignment wants (seconds) exactly enough;
# a model whose last bucket is narrow gets one more, float32, bucket for them.
_TAIL_DTYPES = ("float32", "float64")


class _Bucket:
    """One flat buffer (on the parameters' device, in their dtype) holding the gradients of
    ``params`` back to back, reduced with one all-reduce. The last bucket reduced also carries
    one presence flag per synchronised parameter and the alignment wants after them."""

    def __init__(self, params, device, dtype, extra):
        self.params = params
        self.offsets = []
        size = 0
        for p in params:
            self.offsets.append(size)
            size += _numel(p)
        self.grad_size = size
        self.device = device
        self.flat = empty((size + extra,), dtype=dtype, device=device)


def _numel(p):
    n = 1
    for d in p.shape:
        n *= d
    return n


class _State:
    """DDP's bookkeeping, kept out of ``Module.parameters()``' walk of ``__dict__`` (which
    would report the parameters held here a second time)."""

    def __init__(self):
        self.params = []
        self.buckets = []
        self.buffers = []
        self.pending = False
        self.optimizers = []


class DistributedDataParallel(Module):
    """Wraps ``module`` for data-parallel training over ``needle.distributed``'s process group.

    At wrap time every parameter (and BatchNorm's running statistics) is broadcast from rank 0,
    so all replicas start equal. ``forward`` calls the module (in training mode it first
    broadcasts the running statistics from rank 0, like PyTorch's ``broadcast_buffers``).

    Gradients: needle's backward has no per-parameter hooks, so the averaging runs after
    ``loss.backward()``, in either of two ways (they do the same thing):

    - explicitly: ``ddp.sync_gradients()`` between ``loss.backward()`` and
      ``opt.clip_grad_norm()`` / ``opt.step()``;
    - automatically: ``ddp.wrap_optimizer(opt)`` makes ``opt.step()`` and
      ``opt.clip_grad_norm()`` synchronise first when a training forward ran since the last
      synchronisation (so clipping sees the averaged gradients, as in one process).
      ``needle.apps.simple_ml.epoch_general_ptb`` does this for a wrapped model, so the course
      loop trains a DDP model unchanged.

    Every rank must make the same calls in the same order (each synchronisation is a collective).

    Buckets: the parameters that require grad, in reverse order (PyTorch's: the last layers'
    gradients come first), are packed into flat buffers of about ``bucket_cap_mb`` MiB each (a
    larger parameter gets a bucket of its own), one device and dtype per bucket (a gradient is
    reduced in its parameter's dtype, float64 included, and stays in it); the layout depends
    only on shapes, dtypes and ``requires_grad`` at wrap time, so it is the same on every rank.
    A synchronisation copies each gradient into its bucket (zeros for a parameter whose
    ``grad`` is None on this rank), runs one SUM all-reduce per bucket, divides by the world
    size, and sets each ``p.grad`` to a detached Tensor that is a view of the bucket (no copy
    back): the gradients stay valid until the next synchronisation overwrites the buckets. A
    parameter whose ``grad`` was None on every rank keeps ``grad = None`` (the optimizers skip
    it, as in one process); the presence flags that decide this ride in the last bucket, with
    no extra round trip (in one more, float32, bucket when the last is float16 or bfloat16). The
    all-reduces are blocking, one per bucket: none could overlap the backward, which needle
    runs whole before the synchronisation (its backward has no per-parameter hooks).

    Aligned collections: with ``aligned=True`` (the default) the wrap turns alignment on
    (``needle.memory.alignment``; process-wide: the last wrap decides, and
    ``destroy_process_group()`` turns it off), and each synchronisation appends this rank's
    ``alignment.local_wants(rank, world_size)`` to the last bucket and hands the summed wants to
    ``alignment.agreed()`` on every rank, so that collections happen on all ranks at the same
    step. ``aligned=False`` leaves every rank's collector to itself.

    Raises ``needle.distributed.DistributedError`` when no process group is up, TypeError for a
    ``module`` that is not an ``nn.Module``, TypeError / ValueError for a bad ``bucket_cap_mb``
    (a real number > 0), and TypeError for an ``aligned`` that is not a bool.
    """

    def __init__(self, module, bucket_cap_mb=25, aligned=None, broadcast_buffers=True):
        super().__init__()
        if not isinstance(module, Module):
            raise TypeError(
                f"DistributedDataParallel: expected an nn.Module, got {type(module).__name__}"
            )
        bucket_cap_mb = check_real("bucket_cap_mb", bucket_cap_mb, low=0.0, low_open=True)
        if aligned is None:
            aligned = True
        if not isinstance(aligned, bool):
            raise TypeError(f"aligned must be True or False, got {type(aligned).__name__}")
        dist = _dist()
        if not dist.is_initialized():
            raise dist.DistributedError(
                "DistributedDataParallel: no process group; call "
                "needle.distributed.init_process_group() first"
            )
        self.module = module
        self.bucket_cap_mb = bucket_cap_mb
        self.aligned = bool(aligned)
        self.broadcast_buffers = bool(broadcast_buffers)
        self.world_size = dist.get_world_size()
        self.rank = dist.get_rank()
        self._state = _State()
        self._state.params = [p for p in module.parameters() if p.requires_grad]
        self._state.buffers = _buffer_owners(module)
        with no_grad():
            for p in module.parameters():
                dist.broadcast(p, src=0)
            self._broadcast_buffers()
        self._state.buckets = self._build_buckets(int(bucket_cap_mb * _MIB))
        # Process-wide: the last wrap decides; destroy_process_group() turns it off.
        _alignment.enable(self.aligned)

    # -- layout -------------------------------------------------------------------------------

    def _build_buckets(self, cap_bytes):
        """Buckets over the synchronised parameters in reverse order; a new bucket starts when
        the next parameter would pass ``cap_bytes``, lives on another device or has another
        dtype. The flags ride on the last bucket when it is float32 or float64, else on one
        more float32 bucket of no gradients."""
        groups = []
        current, current_bytes, current_key = [], 0, None
        for p in reversed(self._state.params):
            key = (p.device, p.dtype)
            nbytes = _numel(p) * p.realize_cached_data().itemsize
            if current and (current_bytes + nbytes > cap_bytes or key != current_key):
                groups.append((current, *current_key))
                current, current_bytes = [], 0
            current.append(p)
            current_bytes += nbytes
            current_key = key
        if current:
            groups.append((current, *current_key))
        extra = len(self._state.params) + self._num_wants()
        if extra and (not groups or groups[-1][2] not in _TAIL_DTYPES):
            # nothing to average, or a narrow last bucket: the flags still have to meet
            device = groups[-1][1] if groups else _module_device(self.module)
            groups.append(([], device, "float32"))
        buckets = []
        for i, (params, device, dtype) in enumerate(groups):
            buckets.append(_Bucket(params, device, dtype, extra if i == len(groups) - 1 else 0))
        return buckets

    def _num_wants(self):
        return _alignment.num_wants(self.world_size) if self.aligned else 0

    @property
    def bucket_sizes(self):
        """The number of gradient elements in each bucket, in reduction order (a list of ints)."""
        return [b.grad_size for b in self._state.buckets]

    # -- Module -------------------------------------------------------------------------------

    def parameters(self):
        return self.module.parameters()

    def forward(self, *args, **kwargs):
        """Calls the wrapped module; in training mode with recording on, marks the gradients
        of this step as not yet synchronised (see ``wrap_optimizer``)."""
        if self.training and self.broadcast_buffers and self._state.buffers:
            with no_grad():
                self._broadcast_buffers()
        if self.training and is_grad_enabled():
            self._state.pending = True
        return self.module(*args, **kwargs)

    def _broadcast_buffers(self):
        dist = _dist()
        for owner, name in self._state.buffers:
            buf = getattr(owner, name)
            if isinstance(buf, Tensor):
                dist.broadcast(buf, src=0)

    # -- gradients ----------------------------------------------------------------------------

    def sync_gradients(self):
        """Averages every synchronised parameter's gradient over the ranks (a collective: every
        rank calls it). Afterwards ``p.grad`` is the mean of the ranks' gradients (a missing one
        counting as zeros), or None where no rank had one. Returns None."""
        state = self._state
        dist = _dist()
        params = state.params
        if not state.buckets:
            state.pending = False
            return
        last = state.buckets[-1]
        present = np.zeros(len(params), dtype=np.float32)
        index = {id(p): i for i, p in enumerate(params)}
        # refuse a bad gradient before any rank's collective starts (a rank that stopped
        # half-way would leave the others waiting)
        for p in params:
            if p.grad is not None and tuple(p.grad.shape) != tuple(p.shape):
                raise ValueError(
                    f"DistributedDataParallel: a gradient of shape {tuple(p.grad.shape)} for a "
                    f"parameter of shape {tuple(p.shape)}"
                )
        with no_grad():
            # Blocking all-reduces: nothing is left to overlap them with, and MPI's
            # non-blocking ones were slower (bench/ddp_scaling.py's sync time: 1.3 against
            # 2.3 ms at best for the course model's 1.9 MB on two ranks).
            for bucket in state.buckets:
                self._pack(bucket, present, index)
                if bucket is last:
                    tail = present
                    if self.aligned:
                        wants = _alignment.local_wants(self.rank, self.world_size)
                        wants = np.asarray(wants, dtype=np.float32)
                        tail = np.concatenate([present, wants])
                    last.flat[last.grad_size :] = NDArray(tail, device=last.device)
                dist.all_reduce(bucket.flat, op=dist.ReduceOp.SUM)
            for bucket in state.buckets:
                if bucket.grad_size:
                    grads = bucket.flat[: bucket.grad_size]
                    bucket.flat[: bucket.grad_size] = grads / self.world_size
            summed_tail = last.flat[last.grad_size :].numpy()
            summed_present = summed_tail[: len(params)]
            for bucket in state.buckets:
                self._unpack(bucket, summed_present, index)
        state.pending = False
        if self.aligned:
            _alignment.agreed(summed_tail[len(params) :])

    def _pack(self, bucket, present, index):
        """Copies each gradient of ``bucket`` into its flat buffer (zeros where None) and
        records which parameters had one in ``present``."""
        for p, offset in zip(bucket.params, bucket.offsets):
            n = _numel(p)
            grad = p.grad
            if grad is None:
                if n:
                    bucket.flat[offset : offset + n].fill(0.0)
                continue
            present[index[id(p)]] = 1.0
            if n:
                bucket.flat[offset : offset + n] = grad.realize_cached_data().reshape((n,))

    def _unpack(self, bucket, summed_present, index):
        """Makes each averaged gradient a view of the bucket (None where no rank had one)."""
        for p, offset in zip(bucket.params, bucket.offsets):
            if summed_present[index[id(p)]] == 0:
                p.grad = None
                continue
            n = _numel(p)
            view = bucket.flat[offset : offset + n].reshape(tuple(p.shape))
            p.grad = Tensor.make_const(view)

    def wrap_optimizer(self, opt):
        """Makes ``opt.step()`` and ``opt.clip_grad_norm()`` call ``sync_gradients()`` first
        when a training forward ran since the last synchronisation. Idempotent; returns
        ``opt``."""
        if any(o is opt for o in self._state.optimizers):
            return opt
        step, clip = opt.step, opt.clip_grad_norm

        def synced_step(*args, **kwargs):
            self._sync_if_pending()
            return step(*args, **kwargs)

        def synced_clip(*args, **kwargs):
            self._sync_if_pending()
            return clip(*args, **kwargs)

        opt.step = synced_step
        opt.clip_grad_norm = synced_clip
        self._state.optimizers.append(opt)
        return opt

    def _sync_if_pending(self):
        if self._state.pending:
            self.sync_gradients()

    def sum_across_ranks(self, values):
        """The element-wise sums over the ranks of the float ``values`` (a sequence), as a
        list of Python floats (float32 on the wire): how the training loops combine their
        per-rank metrics. A collective."""
        dist = _dist()
        values = np.asarray(values, dtype=np.float32).reshape(-1)
        device = self._state.buckets[0].device if self._state.buckets else None
        arr = NDArray(values, device=device)
        dist.all_reduce(arr, op=dist.ReduceOp.SUM)
        return [float(v) for v in arr.numpy()]


def _module_device(module):
    """The device of ``module``'s first parameter, else the CPU."""
    for p in module.parameters():
        return p.device
    from ..backend_ndarray import cpu

    return cpu()


def _buffer_owners(module):
    """``(owner module, attribute name)`` of every running statistic in ``module``'s tree, in
    the same order on every rank."""
    owners = []
    for m in [module] + module._children():
        for name, value in m.__dict__.items():
            if name.startswith(_BUFFER_PREFIX) and isinstance(value, Tensor):
                owners.append((m, name))
    return owners
