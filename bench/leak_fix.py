"""The leak and its fixes over a longer run: needle.repro's modes with the collector's share
of each mode's time.

    python bench/leak_fix.py [--steps 200] [--out bench_leak_fix]

Runs ``python -m needle.repro`` (course PTB Transformer, emulated device limit on the CPU) in
its five modes plus ``hook_frozen`` (``hook`` after ``needle.memory.freeze_heap()``), then
prints JSON lines and a table with, per mode: peak allocated bytes relative to cycle_free,
collections, seconds in the collector and their share of the run.
"""

import argparse
import json
import os

from needle import repro

from benchutil import print_machine


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--out", default="bench_leak_fix")
    parser.add_argument(
        "--extra", nargs=argparse.REMAINDER, default=[], help="further arguments for needle.repro"
    )
    args = parser.parse_args()
    print_machine()
    modes = (
        [] if "--modes" in args.extra else ["--modes", ",".join(repro.MODES + repro.EXTRA_MODES)]
    )
    repro.main(["--steps", str(args.steps), "--out", args.out, *modes, *args.extra])
    with open(os.path.join(args.out, "repro.json")) as f:
        results = json.load(f)
    cf_peak = next(r for r in results if r["mode"] == "cycle_free")["peak_allocated_bytes"]
    rows = []
    for r in results:
        run_seconds = (r["mean_step_seconds"] or 0.0) * r["steps"]
        share = (
            r["gc_seconds"] / run_seconds if run_seconds and r["gc_seconds"] is not None else None
        )
        row = {
            "mode": r["mode"],
            "steps": r["steps"],
            "oom_step": r["oom_step"],
            "peak_vs_cycle_free": r["peak_allocated_bytes"] / cf_peak,
            "collections": r["pressure_collections"],
            "gc_seconds": r["gc_seconds"],
            "gc_share": share,
        }
        rows.append(row)
        print(json.dumps(row))
    print()
    print(
        f"{'mode':<11}{'steps':>6}{'OOM at':>8}{'peak/cycle_free':>17}{'collections':>13}"
        f"{'gc s':>8}{'gc share':>10}"
    )
    for row in rows:
        share = "-" if row["gc_share"] is None else f"{100 * row['gc_share']:.2f}%"
        gc_s = "-" if row["gc_seconds"] is None else f"{row['gc_seconds']:.2f}"
        print(
            f"{row['mode']:<11}{row['steps']:>6}{str(row['oom_step'] or '-'):>8}"
            f"{row['peak_vs_cycle_free']:>17.2f}{row['collections']:>13}{gc_s:>8}{share:>10}"
        )


if __name__ == "__main__":
    main()
