"""DistributedDataParallel: one model replica per rank, gradients averaged over the process
group inside ``backward()``, in buckets whose all-reduces start while the backward goes on, as
PyTorch's DDP does (the hooks and the averaging are in ``_reducer``).
"""

import contextlib

import numpy as np

from .. import optim as _optim
from .._checks import check_real
from ..autograd import Tensor, TensorTuple, find_topo_sort, is_grad_enabled, no_grad
from ..backend_ndarray import NDArray
from ..memory import alignment as _alignment
from ..nn import Module
from . import _reducer

__all__ = ["DistributedDataParallel"]

_MIB = 1024 * 1024
# PyTorch's first bucket (dist._DEFAULT_FIRST_BUCKET_BYTES): the last layers' gradients, ready
# first, start their all-reduce early instead of waiting for 25 MiB of gradients.
_FIRST_BUCKET_MIB = 1
# BatchNorm's running statistics are the only module state that is not a Parameter; other
# Tensor attributes (attention's saved probabilities) are per-batch scratch, not model state.
_BUFFER_PREFIX = "running_"


def _dist():
    # The package imports this module; look the collectives up at call time.
    from needle import distributed

    return distributed


class _State:
    """DDP's bookkeeping (the reducer, the running statistics' owners), kept out of
    ``Module.parameters()``' and ``_children()``' walks of ``__dict__``, which would report the
    modules and parameters held here a second time."""

    def __init__(self):
        self.buffers = []
        self.reducer = None


class DistributedDataParallel(Module):
    """Wraps ``module`` for data-parallel training over ``needle.distributed``'s process group,
    with PyTorch's semantics::

        model = DistributedDataParallel(model)
        opt = optim.Adam(model.parameters(), lr=...)
        loss = loss_fn(model(x), y)
        opt.zero_grad()        # or opt.reset_grad()
        loss.backward()        # returns with the gradients averaged over the ranks
        opt.step()

    At wrap time every parameter (and BatchNorm's running statistics) is broadcast from rank 0,
    so all replicas start equal, and the ranks check that they wrap the same layout.
    ``forward`` calls the module (in training mode it first broadcasts the running statistics
    from rank 0, PyTorch's ``broadcast_buffers``).

    Gradients: each parameter that requires grad gets a post-accumulate-grad hook. The
    parameters, in reverse order (the last layers' gradients are ready first), are packed into
    flat buckets, one device and dtype each (a gradient is averaged in its parameter's dtype,
    float64 included): the first of about 1 MiB, the others of about ``bucket_cap_mb`` MiB (a
    larger parameter gets a bucket of its own). When a bucket's last gradient has been
    accumulated its all-reduce starts (MPI's non-blocking all-reduce; NCCL on its own stream),
    in bucket order on every rank, and the backward goes on. When the backward ends the
    all-reduces are waited for, divided by the world size, and each ``p.grad`` becomes a
    detached view of its bucket (valid until the next backward overwrites the bucket): after
    ``loss.backward()`` every rank holds the same averaged gradients. A parameter whose
    ``grad`` was None on every rank keeps ``grad = None`` (the optimizers skip it, as in one
    process). Every rank must run the same backward passes (each is a set of collectives).

    - ``no_sync()``: a context in which backward passes accumulate gradients locally (graph
      mode ``cycle_free``, the default, adds into ``.grad`` as PyTorch does); the first
      backward after it averages the sum. An optimizer step on gradients accumulated under
      ``no_sync()`` and never averaged raises RuntimeError, as does one after a backward that
      raised before its averaging finished: the replicas never train apart silently.
    - ``find_unused_parameters=False`` (the default): every synchronised parameter must get a
      gradient in every backward, else the backward raises RuntimeError naming them (PyTorch
      raises at the next forward). ``True``: each training forward finds the parameters its
      outputs do not depend on, and their buckets do not wait for them; a parameter with no
      gradient counts as zeros on that rank.
    - ``module`` is the wrapped module; ``state_dict()`` has PyTorch's keys (``module.`` and the
      module's own).
    - ``sync_gradients()`` and ``wrap_optimizer(opt)`` are kept for code written for the
      earlier needle, where the averaging ran after backward: both are no-ops now.

    Aligned collections: with ``aligned=True`` (the default) the wrap turns alignment on
    (``needle.memory.alignment``; process-wide: the last wrap decides, and
    ``destroy_process_group()`` turns it off), and each backward's last bucket carries this
    rank's ``alignment.local_wants(rank, world_size)``; the summed wants go to
    ``alignment.agreed()`` on every rank when the backward ends, so that collections happen on
    all ranks at the same step. ``aligned=False`` leaves every rank's collector to itself.

    Raises ``needle.distributed.DistributedError`` when no process group is up or the ranks'
    layouts differ, TypeError for a ``module`` that is not an ``nn.Module``, TypeError /
    ValueError for a bad ``bucket_cap_mb`` (a real number > 0), and TypeError for
    ``aligned``, ``broadcast_buffers`` or ``find_unused_parameters`` that are not bools.
    """

    def __init__(
        self,
        module,
        bucket_cap_mb=25,
        aligned=None,
        broadcast_buffers=True,
        find_unused_parameters=False,
    ):
        super().__init__()
        if not isinstance(module, Module):
            raise TypeError(
                f"DistributedDataParallel: expected an nn.Module, got {type(module).__name__}"
            )
        bucket_cap_mb = check_real("bucket_cap_mb", bucket_cap_mb, low=0.0, low_open=True)
        if aligned is None:
            aligned = True
        for name, value in (
            ("aligned", aligned),
            ("broadcast_buffers", broadcast_buffers),
            ("find_unused_parameters", find_unused_parameters),
        ):
            if not isinstance(value, bool):
                raise TypeError(f"{name} must be True or False, got {type(value).__name__}")
        dist = _dist()
        if not dist.is_initialized():
            raise dist.DistributedError(
                "DistributedDataParallel: no process group; call "
                "needle.distributed.init_process_group() first"
            )
        self.module = module
        self.bucket_cap_mb = bucket_cap_mb
        self.aligned = aligned
        self.broadcast_buffers = broadcast_buffers
        self.find_unused_parameters = find_unused_parameters
        self.world_size = dist.get_world_size()
        self.rank = dist.get_rank()
        params = [p for p in module.parameters() if p.requires_grad]
        self._state = _State()
        self._state.buffers = _buffer_owners(module)
        with no_grad():
            for p in module.parameters():
                dist.broadcast(p, src=0)
            self._broadcast_buffers()
        tail = len(params) + (_alignment.num_wants(self.world_size) if aligned else 0)
        cap = int(bucket_cap_mb * _MIB)
        buckets = _reducer.plan_buckets(
            params, cap, min(cap, _FIRST_BUCKET_MIB * _MIB), tail, _module_device(module)
        )
        dist.collectives.agree_layout(
            "DistributedDataParallel",
            "buckets " + ",".join(f"{b.flat.size}:{b.flat.dtype}" for b in buckets),
        )
        self._state.reducer = _reducer.Reducer(
            params,
            buckets,
            self.world_size,
            self.rank,
            aligned,
            find_unused_parameters,
            dist.collectives,
        )
        _optim._register_grad_check(self._state.reducer)
        # Process-wide: the last wrap decides; destroy_process_group() turns it off.
        _alignment.enable(aligned)

    @property
    def bucket_sizes(self):
        """The number of gradient elements in each bucket, in reduction order (a list of ints)."""
        return [b.grad_size for b in self._state.reducer.buckets]

    @property
    def reduction_stats(self):
        """``{"reductions": n, "exposed_wait_s": s, "last_arrival": t0, "last_done": t1}``: the
        backward passes averaged so far, the seconds their ends spent waiting for the
        all-reduces (for the all-reduces the backward did not hide, and for the other ranks to
        reach their ends), and the last one's ``time.perf_counter()`` when this rank had
        computed the last bucket's gradients (the end of the backward's computation) and when
        its all-reduces were done."""
        return dict(self._state.reducer.stats)

    # -- Module -------------------------------------------------------------------------------

    def parameters(self):
        return self.module.parameters()

    def state_dict(self, *args, **kwargs):
        """The wrapped module's ``state_dict()`` with PyTorch's DDP keys: ``module.`` + each
        key."""
        inner = self.module.state_dict(*args, **kwargs)
        return type(inner)(("module." + k, v) for k, v in inner.items())

    def load_state_dict(self, state_dict, strict=True):
        """Loads a ``state_dict()`` of this wrapper (``module.`` keys) into the module; a
        mapping without the prefix (the module's own) is refused with the keys named."""
        if not hasattr(state_dict, "items"):
            raise TypeError(f"load_state_dict: expected a mapping, got {type(state_dict).__name__}")
        stray = [k for k in state_dict if not str(k).startswith("module.")]
        if stray and strict:
            raise RuntimeError(
                "DistributedDataParallel.load_state_dict: keys without the 'module.' prefix "
                f"({', '.join(map(str, stray[:4]))}): load the module's own state into "
                "ddp.module"
            )
        inner = {k[len("module.") :]: v for k, v in state_dict.items() if k not in stray}
        return self.module.load_state_dict(inner, strict=strict)

    def forward(self, *args, **kwargs):
        """Calls the wrapped module; in training mode broadcasts the running statistics from
        rank 0 first and, with ``find_unused_parameters``, finds the parameters the outputs do
        not depend on."""
        if self.training and self.broadcast_buffers and self._state.buffers:
            with no_grad():
                self._broadcast_buffers()
        out = self.module(*args, **kwargs)
        if self.find_unused_parameters and self.training and is_grad_enabled():
            self._state.reducer.unused_from_forward = self._unused(out)
        return out

    def _unused(self, out):
        """Indices of the synchronised parameters no output tensor depends on."""
        roots = [t for t in _tensors_in(out) if t.requires_grad]
        reached = {id(node) for node in find_topo_sort(roots)} if roots else set()
        return tuple(i for i, p in enumerate(self._state.reducer.params) if id(p) not in reached)

    @contextlib.contextmanager
    def no_sync(self):
        """Context: backward passes inside accumulate gradients locally, without averaging
        (PyTorch's); the first backward after it averages the accumulated sum."""
        self._state.reducer.no_sync_depth += 1
        try:
            yield
        finally:
            self._state.reducer.no_sync_depth -= 1

    def _broadcast_buffers(self):
        dist = _dist()
        for owner, name in self._state.buffers:
            buf = getattr(owner, name)
            if isinstance(buf, Tensor):
                dist.broadcast(buf, src=0)

    # -- kept for code written for the earlier needle ------------------------------------------

    def sync_gradients(self):
        """A no-op: ``backward()`` averages the gradients. (The earlier needle averaged them
        here, after backward.) Returns None."""

    def wrap_optimizer(self, opt):
        """A no-op kept for the earlier needle's code: every optimizer refuses gradients this
        wrapper has not averaged, with no wrapping. Returns ``opt``."""
        return opt

    def sum_across_ranks(self, values):
        """The element-wise sums over the ranks of the float ``values`` (a sequence), as a
        list of Python floats (float32 on the wire): how the training loops combine their
        per-rank metrics. A collective."""
        dist = _dist()
        values = np.asarray(values, dtype=np.float32).reshape(-1)
        buckets = self._state.reducer.buckets
        device = buckets[0].device if buckets else None
        arr = NDArray(values, device=device)
        dist.all_reduce(arr, op=dist.ReduceOp.SUM)
        return [float(v) for v in arr.numpy()]


def _tensors_in(out):
    """The Tensors in a forward's output (a Tensor, a TensorTuple, or lists, tuples and dicts
    of them)."""
    if isinstance(out, Tensor):
        return [out]
    if isinstance(out, TensorTuple):
        return [out]
    if isinstance(out, dict):
        out = list(out.values())
    if isinstance(out, (list, tuple)):
        found = []
        for item in out:
            found += _tensors_in(item)
        return found
    return []


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
