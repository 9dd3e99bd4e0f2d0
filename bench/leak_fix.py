"""The leak and its fixes over a longer run: needle.repro's modes with the collector's share
of each mode's time.

    python bench/leak_fix.py [--steps 200] [--out bench_leak_fix]

Runs ``python -m needle.repro`` (course PTB Transformer, emulated device limit on the CPU) in
its five modes plus ``hook_frozen`` (``hook`` after ``needle.memory.freeze_heap()``) and
``floor`` (a ``gc.collect()`` at each ``reset_grad()``: the least peak any collector can give
the course's graph mode), then prints JSON lines and a table with, per mode: peak allocated
bytes relative to cycle_free and to floor, collections, seconds in the collector and their
share of the run.
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
    peaks = {r["mode"]: r["peak_allocated_bytes"] for r in results}
    cf_peak, floor_peak = peaks.get("cycle_free"), peaks.get("floor")
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
            "peak_mib": r["peak_allocated_bytes"] / 2**20,
            "peak_vs_cycle_free": r["peak_allocated_bytes"] / cf_peak if cf_peak else None,
            "peak_vs_floor": r["peak_allocated_bytes"] / floor_peak if floor_peak else None,
            "collections": r["pressure_collections"],
            "gc_seconds": r["gc_seconds"],
            "gc_share": share,
        }
        rows.append(row)
        print(json.dumps(row))
    print()
    print(
        f"{'mode':<11}{'steps':>6}{'OOM at':>8}{'peak MiB':>10}{'peak/cycle_free':>17}"
        f"{'peak/floor':>12}{'collections':>13}{'gc s':>8}{'gc share':>10}"
    )
    for row in rows:
        share = "-" if row["gc_share"] is None else f"{100 * row['gc_share']:.2f}%"
        gc_s = "-" if row["gc_seconds"] is None else f"{row['gc_seconds']:.2f}"
        ratios = [
            "-" if row[k] is None else f"{row[k]:.2f}"
            for k in ("peak_vs_cycle_free", "peak_vs_floor")
        ]
        print(
            f"{row['mode']:<11}{row['steps']:>6}{str(row['oom_step'] or '-'):>8}"
            f"{row['peak_mib']:>10.1f}{ratios[0]:>17}{ratios[1]:>12}{row['collections']:>13}"
            f"{gc_s:>8}{share:>10}"
        )


if __name__ == "__main__":
    main()
