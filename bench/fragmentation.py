"""Fragmentation of the caching allocators under varying batch and sequence lengths: peak
reserved over peak allocated, with and without each allocator setting.

    python bench/fragmentation.py [--steps 40] [--devices cpu,cuda] [--seed 0]

A synthetic allocation pattern that mimics training the course's transformer (4 layers,
d_model 256, 8 heads) on batches whose size (8..32) and sequence length (16..192) change every
step: the forward pass keeps each layer's activations (the input, q/k/v, the attention
scores and probabilities, the MLP's hidden layer), the backward pass makes each layer's
gradients, transient, and frees the layer's activations in reverse order; the parameters
and their gradients live throughout. Only the allocator runs (``device.empty``), so the
figures are the allocator's, not the kernels'.

Configurations: ``default``; ``max_split_size_mb:32``; ``garbage_collection_threshold:0.8``,
alone and with ``max_split_size_mb:32``, under a limit of 1.25x the default run's peak
allocated (the budget the threshold is a share of); on a GPU also ``expandable_segments:True``
(the CPU refuses it: its cache never splits a block). Each device this process can use is
measured (``cuda`` on the simulated build too). Prints the machine line, one JSON line per
(device, configuration) and a table; the ratio reserved/allocated (peaks) is the figure of
merit, 1.0 being no fragmentation at all.
"""

import argparse
import json
import random

import needle as ndl

from benchutil import print_machine

MiB = 2**20
LAYERS, D_MODEL, HEADS = 4, 256, 8
DEFAULTS = "max_split_size_mb:None,garbage_collection_threshold:None,expandable_segments:False"


def shapes(steps, seed):
    """The (batch, sequence length) of each step, the same for every configuration."""
    rng = random.Random(seed)
    return [(rng.choice((8, 16, 24, 32)), rng.randrange(16, 193, 8)) for _ in range(steps)]


def layer_activations(batch, seq):
    """Element counts of what one layer's forward pass keeps for its backward pass."""
    tokens = batch * seq
    return [
        tokens * D_MODEL,  # input
        3 * tokens * D_MODEL,  # q, k, v
        batch * HEADS * seq * seq,  # scores
        batch * HEADS * seq * seq,  # probabilities
        tokens * D_MODEL,  # attention output
        4 * tokens * D_MODEL,  # MLP hidden
    ]


def train(device, plan):
    """Runs the allocation pattern of every step in plan on device."""
    params = [device.empty((4 * D_MODEL * D_MODEL,)) for _ in range(LAYERS)]
    grads = [device.empty((4 * D_MODEL * D_MODEL,)) for _ in range(LAYERS)]
    for batch, seq in plan:
        saved = []
        for _ in range(LAYERS):
            saved.append([device.empty((n,)) for n in layer_activations(batch, seq)])
        while saved:
            acts = saved.pop()
            transient = [device.empty((n,)) for n in layer_activations(batch, seq)[1:4]]
            del transient, acts
    del params, grads


def measure(device, conf, plan, limit=None):
    """Peak allocated and reserved (bytes) of one run of plan under conf."""
    ndl.memory.set_allocator_settings(DEFAULTS)
    if conf != "default":
        ndl.memory.set_allocator_settings(conf)
    ndl.memory.empty_cache(device)
    previous_limit = ndl.memory.get_memory_limit(device)
    if limit is not None:
        ndl.memory.set_memory_limit(device, limit)
    ndl.memory.reset_peak_memory_stats(device)
    before = ndl.memory.memory_stats(device)
    try:
        train(device, plan)
        stats = ndl.memory.memory_stats(device)
    finally:
        ndl.memory.set_memory_limit(device, previous_limit)
        ndl.memory.set_allocator_settings(DEFAULTS)
        ndl.memory.empty_cache(device)
    return {
        "allocated_peak": stats["allocated_bytes.all.peak"],
        "reserved_peak": stats["reserved_bytes.all.peak"],
        "segments_allocated": stats["segment.all.allocated"] - before["segment.all.allocated"],
        "inactive_split_bytes_peak": stats["inactive_split_bytes.all.peak"],
        "gc_releases": stats["num_gc_releases"] - before["num_gc_releases"],
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--devices", default="cpu,cuda")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    print_machine(cuda_simulated=ndl.cuda().enabled() and __import__("needle_c")._cuda_simulated())
    plan = shapes(args.steps, args.seed)
    rows = []
    for name in args.devices.split(","):
        device = ndl.cpu() if name == "cpu" else ndl.cuda()
        if not device.enabled():
            print(json.dumps({"device": name, "skipped": "not available"}), flush=True)
            continue
        base = measure(device, "default", plan)
        runs = [("default", base)]
        runs.append(("max_split_size_mb:32", measure(device, "max_split_size_mb:32", plan)))
        limit = int(1.25 * base["allocated_peak"])
        gc = "garbage_collection_threshold:0.8"
        for conf in (gc, "max_split_size_mb:32," + gc):
            runs.append((f"{conf} (limit 1.25x)", measure(device, conf, plan, limit)))
        if name == "cuda":
            expandable = "expandable_segments:True"
            runs.append((expandable, measure(device, expandable, plan)))
        for conf, figures in runs:
            ratio = figures["reserved_peak"] / figures["allocated_peak"]
            row = {"device": name, "conf": conf, "steps": args.steps, **figures}
            row["reserved_over_allocated"] = round(ratio, 3)
            print(json.dumps(row), flush=True)
            rows.append(row)
    print(
        f"\n{'device':<7}{'configuration':<66}{'alloc peak':>12}{'resv peak':>12}"
        f"{'ratio':>8}{'segments':>10}{'gc rel.':>9}"
    )
    for r in rows:
        print(
            f"{r['device']:<7}{r['conf']:<66}{r['allocated_peak'] / MiB:>10.1f}Mi"
            f"{r['reserved_peak'] / MiB:>10.1f}Mi{r['reserved_over_allocated']:>8.3f}"
            f"{r['segments_allocated']:>10}{r['gc_releases']:>9}"
        )


if __name__ == "__main__":
    main()
