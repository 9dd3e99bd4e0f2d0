"""``needle.distributed``: data parallelism over MPI (any device) and NCCL (CUDA), with
PyTorch's names::

    import needle.distributed as dist
    dist.init_process_group()            # under mpiexec -n N (or python -m needle.distributed.run)
    dist.all_reduce(grad, op=dist.ReduceOp.AVG)
    dist.broadcast(param, src=0)
    dist.all_gather(outputs, x)
    dist.barrier(); dist.destroy_process_group()

Collectives work in place on NDArrays and Tensors (a Tensor's data), on their device and in
their dtype (float32, float16, bfloat16, float64: see ``_dtypes``), and return None (or a
:class:`Work` with ``async_op=True``). Every failure is a :class:`DistributedError` that names
the rank(s). mpi4py is imported by init_process_group, not here: importing needle.distributed
starts no MPI.
"""

from .. import _environ
from ._group import DistributedError, ReduceOp, timeout_seconds
from .collectives import (
    Work,
    all_gather,
    all_reduce,
    barrier,
    broadcast,
    destroy_process_group,
    get_device,
    get_local_rank,
    get_rank,
    get_world_size,
    init_process_group,
    is_available,
    is_initialized,
)
from .ddp import DistributedDataParallel
from .sampler import DistributedSampler, ptb_rank_columns

# needle checks its variables at import (needle._environ): a malformed one is this import's
# error, not the first collective's.
timeout_seconds(None)
_environ.switch("NEEDLE_DIST_CUDA_AWARE", None)

__all__ = [
    "DistributedDataParallel",
    "DistributedError",
    "DistributedSampler",
    "ReduceOp",
    "Work",
    "all_gather",
    "all_reduce",
    "barrier",
    "broadcast",
    "destroy_process_group",
    "get_device",
    "get_local_rank",
    "get_rank",
    "get_world_size",
    "init_process_group",
    "is_available",
    "is_initialized",
    "ptb_rank_columns",
]
