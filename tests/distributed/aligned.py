"""Run under mpiexec -n 2 by tests/test_aligned_ranks.py: two ranks train a small PTB
transformer in the course's graph mode (each step leaves its old graph as cyclic garbage); rank 1
holds a large Python heap and a tighter memory limit, so it is the one whose collector wants to
run. Every collection that starts (Python's, of any generation, and needle's scoped ones) is
recorded with the step it happened in; each rank writes them and its figures to
OUTDIR/rank<r>.json.

argv: MODE OUTDIR, MODE "aligned" (DistributedDataParallel(aligned=True)) or "independent"
(aligned=False: each rank's collector is its own).
"""

import gc
import json
import os
import sys

import numpy as np

import needle as ndl
import needle.distributed as dist
import needle_c
from needle import memory, optim
from needle.apps.models import LanguageModel
from needle.apps.simple_ml import epoch_general_ptb
from needle.memory import alignment

VOCAB, EMBED, HIDDEN, SEQ_LEN, BATCH, STEPS = 200, 16, 32, 8, 32, 40
HEAP_OBJECTS = 50_000
MiB = 2**20

mode, outdir = sys.argv[1], sys.argv[2]
dist.init_process_group(timeout=60)
rank = dist.get_rank()
ndl.autograd.set_graph_mode("needle")
heap = [[i] for i in range(HEAP_OBJECTS)] if rank == 1 else []

step = [0]
collections = []  # (step, kind)


def on_python_collection(phase, info):
    if phase == "start":
        collections.append((step[0], f"gen{info['generation']}"))


def on_scoped_collection(phase, info):
    if phase == "start":
        collections.append((step[0], "scoped"))


gc.callbacks.append(on_python_collection)
needle_c._scoped_info()["observers"].append(on_scoped_collection)

rng = np.random.default_rng(0)
data = rng.integers(0, VOCAB, size=(STEPS * SEQ_LEN + 1, BATCH)).astype(np.float32)
np.random.seed(0)
model = LanguageModel(EMBED, VOCAB, HIDDEN, num_layers=1, seq_model="transformer", seq_len=SEQ_LEN)
ddp = dist.DistributedDataParallel(model, aligned=(mode == "aligned"))
opt = optim.Adam(ddp.parameters(), lr=0.01)
gc.collect()
if rank == 1:
    # A budget a few steps' garbage fills: the trigger sits 2 MiB above the live set.
    memory.set_memory_limit("cpu", memory.memory_allocated() + 64 * MiB)
    memory.set_gc_policy(growth=0.0, min_growth="2MiB")
start = memory.memory_stats()
collections.clear()


def advance(done, batch_loss, allocated):
    step[0] = done


epoch_general_ptb(dist.ptb_rank_columns(data), ddp, seq_len=SEQ_LEN, opt=opt, progress=advance)
stats = memory.memory_stats()
figures = {
    key: stats[key] - start[key]
    for key in (
        "num_pressure_collections",
        "num_oom_collections",
        "num_aligned_wants",
        "num_aligned_collections",
        "aligned_rounds_waited",
    )
}
result = {
    "rank": rank,
    "collections": collections,
    "figures": figures,
    "alignment": alignment.stats(),
    "gc_enabled_during": gc.isenabled(),
}
dist.destroy_process_group()
result["gc_enabled_after"] = gc.isenabled()
with open(os.path.join(outdir, f"rank{rank}.json"), "w") as f:
    json.dump(result, f)
print(f"rank {rank}: {len(collections)} collections, {figures}", flush=True)
