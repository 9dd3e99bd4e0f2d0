"""Training steps for Nsight Compute: warm-up outside, the measured steps inside one NVTX range.

    python bench/ncu_steps.py [--device cuda] [--warmup 3] [--steps 2] [--words 200000]
                              [--no-nvtx]

Trains the course's PTB Transformer (needle.repro's setup: batch 256, seq_len 20, 10k
vocabulary, Adam) with needle's default autograd; after ``--warmup`` steps (caches, cuBLAS
handles and the allocator's blocks settle) the next ``--steps`` run inside the NVTX push/pop
range ``needle_steps``, so that Nsight Compute profiles only them::

    ncu --nvtx --nvtx-include needle_steps/ --metrics gpu__time_duration.sum --csv \\
        python bench/ncu_steps.py > ncu.log
    python bench/gpu_report.py ncu ncu.log --steps 2

NVTX comes from PyTorch (``torch.cuda.nvtx``) or the ``nvtx`` package; without either the
script stops (``--no-nvtx`` runs the steps unmarked, for a check without a GPU). Prints one
JSON line: the steps and their losses.
"""

import argparse
import json
import os
import sys
import tempfile

from real_oom import Trainer

import needle as ndl
from needle.data import write_synthetic_corpus

RANGE = "needle_steps"


def nvtx_range():
    """(push, pop) of an NVTX range, or None when neither a CUDA build of torch nor the nvtx
    package is installed."""
    try:
        import torch.cuda.nvtx as tnvtx

        tnvtx.range_push("ncu_steps_probe")  # a CPU-only torch raises here
        tnvtx.range_pop()
        return (lambda: tnvtx.range_push(RANGE)), tnvtx.range_pop
    except (ImportError, RuntimeError):
        pass
    try:
        import nvtx

        return (lambda: nvtx.push_range(RANGE)), nvtx.pop_range
    except ImportError:
        return None


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    parser.add_argument("--warmup", type=int, default=3, help="unmarked steps first")
    parser.add_argument("--steps", type=int, default=2, help="steps inside the NVTX range")
    parser.add_argument("--words", type=int, default=200_000)
    parser.add_argument("--no-nvtx", action="store_true", help="no NVTX range (a dry check)")
    # Trainer's configuration: the course's.
    parser.add_argument("--batch-size", type=int, default=256, help=argparse.SUPPRESS)
    parser.add_argument("--seq-len", type=int, default=20, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.warmup < 0 or args.steps < 1:
        parser.error("--warmup must be >= 0 and --steps at least 1")
    marks = None if args.no_nvtx else nvtx_range()
    if marks is None and not args.no_nvtx:
        print("ncu_steps: no NVTX: needs PyTorch (torch.cuda.nvtx) or the nvtx package")
        return 1
    device = ndl.cpu() if args.device == "cpu" else ndl.cuda()
    if not device.enabled():
        print(f"ncu_steps: {device} is unavailable: {ndl.cuda.unavailable_reason()}")
        return 1
    with tempfile.TemporaryDirectory(prefix="needle-ncu-") as tmp:
        corpus = write_synthetic_corpus(os.path.join(tmp, "corpus"), num_words=args.words, seed=0)
        trainer = Trainer(str(corpus), args, device)
    for _ in range(args.warmup):
        trainer.step()  # each step reads its loss: the GPU is idle when the range opens
    if marks:
        marks[0]()
    losses = [trainer.step() for _ in range(args.steps)]
    if marks:
        marks[1]()
    row = {"device": str(device), "warmup": args.warmup, "steps": args.steps, "losses": losses}
    print(json.dumps(row))
    return 0


if __name__ == "__main__":
    sys.exit(main())
