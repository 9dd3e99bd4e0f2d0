"""Run by tests/test_launcher_hosts.py under ``python -m needle.distributed.run`` with the
host placement options (``--host``, ``--hostfile``, ``-N``): each rank prints where the
launcher put it (rank, world size, local rank, hostname, device) and the result of one
all_reduce, so the test can check the placement that mpiexec was given. Its own argv is
printed too: options after the script name (``--host``, ``-n``) must reach it untouched.

One line per rank: ``rank R size S local L host H device D sum X argv A``.
"""

import socket
import sys

import numpy as np

import needle as ndl
import needle.distributed as dist

dist.init_process_group(timeout=60)
rank, size = dist.get_rank(), dist.get_world_size()
a = ndl.NDArray(np.full(3, rank + 1.0, np.float32), device=dist.get_device())
dist.all_reduce(a)
total = a.numpy()
# Every element carries the same sum; one value on the line is enough once they agree.
assert (total == total[0]).all(), (rank, total)
print(
    f"rank {rank} size {size} local {dist.get_local_rank()} host {socket.gethostname()} "
    f"device {dist.get_device()!r} sum {total[0]:g} argv {' '.join(sys.argv[1:])}",
    flush=True,
)
dist.barrier()
dist.destroy_process_group()
