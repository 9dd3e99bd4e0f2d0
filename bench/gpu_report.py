"""The markdown pieces of bench/gpu_validate.sh's report that need more than grep: one for each
step whose output is JSON or CSV, tested without a GPU (tests/test_gpu_validate.py).

    python bench/gpu_report.py census LOG          # gpu_census.py's JSON lines: a table
    python bench/gpu_report.py repro REPRO_JSON    # needle.repro's repro.json: memory, gc share
    python bench/gpu_report.py ncu LOG [--steps 2] [--top 15]
                                                   # ncu --csv per launch: per-kernel totals

Each prints a one-line summary (the report's "key figures") and then the markdown detail;
exit status 1 when the input holds nothing to report.
"""

import argparse
import csv
import json
import sys

MiB = 2**20
_TIME_UNITS = {"nsecond": 1e-3, "usecond": 1.0, "msecond": 1e3, "second": 1e6}


def json_lines(text):
    """The JSON objects among the lines of ``text`` (other output is skipped)."""
    rows = []
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("{"):
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return rows


def _cell(value):
    if isinstance(value, float):
        return f"{value:,.1f}"
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, (dict, list)):
        return json.dumps(value, separators=(",", ":"))
    return str(value)


def census(text):
    """(summary, markdown) for gpu_census.py's lines: one row per config, a column per key."""
    rows = [r for r in json_lines(text) if "config" in r]
    if not rows:
        return None
    keys = []
    for r in rows:
        keys += [k for k in r if k not in keys]
    lines = ["| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
    lines += ["| " + " | ".join(_cell(r.get(k, "")) for k in keys) + " |" for r in rows]
    summary = "; ".join(
        f"{r['config']}: {r.get('kernel_launches_per_step', '?')} launches + "
        f"{r.get('blas_calls_per_step', '?')} BLAS, {r.get('host_syncs_per_step', '?')} syncs, "
        f"{r.get('device_mallocs_per_step', '?')} mallocs per step"
        for r in rows
    )
    return summary, "\n".join(lines)


def repro(report):
    """(summary, markdown) for a repro.json: each mode's outcome, collector share and memory
    over the steps (allocated, reserved, the driver's free bytes)."""
    if not report:
        return None
    lines = [
        "| mode | steps | OOM | gc share | alloc min-max MiB | reserved max MiB | free min MiB |"
        " tracked objects |",
        "|---|---|---|---|---|---|---|---|",
    ]
    parts = []
    for r in report:
        samples = r.get("samples") or []
        allocated = [s["allocated"] for s in samples] or [0]
        reserved = [s["reserved"] for s in samples] or [0]
        free = [s["free"] for s in samples if s.get("free") is not None]
        share = r.get("gc_share")
        share_text = "-" if share is None else f"{100 * share:.1f}%"
        oom = f"at {r['oom_step']}" if r["oom"] else "no"
        free_text = f"{min(free) / MiB:,.0f}" if free else "-"
        lines.append(
            f"| {r['mode']} | {r['steps']} | {oom} | {share_text} | "
            f"{min(allocated) / MiB:,.0f}-{max(allocated) / MiB:,.0f} | "
            f"{max(reserved) / MiB:,.0f} | {free_text} | {r.get('tracked_objects', '-')} |"
        )
        parts.append(
            f"{r['mode']} {'OOM ' + oom if r['oom'] else 'ok'}, gc {share_text}, "
            f"max {max(allocated) / MiB:,.0f} MiB"
        )
    return "; ".join(parts), "\n".join(lines)


def ncu_kernels(text):
    """{kernel name: [launches, total microseconds]} from ``ncu --csv`` per-launch output
    (rows with "Kernel Name", "Metric Name" gpu__time_duration.sum, "Metric Unit" and
    "Metric Value"); lines that are not ncu's CSV (the program's own output) are skipped."""
    lines = [line for line in text.splitlines() if line.startswith('"')]
    kernels = {}
    for row in csv.DictReader(lines):
        if row.get("Metric Name") != "gpu__time_duration.sum" or "Kernel Name" not in row:
            continue
        scale = _TIME_UNITS.get((row.get("Metric Unit") or "").strip())
        try:
            value = float((row.get("Metric Value") or "").replace(",", ""))
        except ValueError:
            continue
        if scale is None:
            continue
        entry = kernels.setdefault(row["Kernel Name"], [0, 0.0])
        entry[0] += 1
        entry[1] += value * scale
    return kernels


def ncu(text, steps, top):
    """(summary, markdown) for ncu's per-launch CSV: the top kernels by total time."""
    kernels = ncu_kernels(text)
    if not kernels:
        return None
    launches = sum(n for n, _ in kernels.values())
    total_us = sum(t for _, t in kernels.values())
    ranked = sorted(kernels.items(), key=lambda kv: kv[1][1], reverse=True)
    lines = [
        f"{launches / steps:,.0f} kernel launches and {total_us / steps / 1e3:,.2f} ms of kernel "
        f"time per step ({len(kernels)} kernels, {steps} steps profiled)",
        "",
        "| kernel | launches per step | us per step | share | mean us |",
        "|---|---|---|---|---|",
    ]
    for name, (n, t) in ranked[:top]:
        short = name if len(name) <= 90 else name[:87] + "..."
        short = short.replace("|", "\\|")
        lines.append(
            f"| `{short}` | {n / steps:,.1f} | {t / steps:,.1f} | {100 * t / total_us:.1f}% | "
            f"{t / n:,.2f} |"
        )
    summary = (
        f"{launches / steps:,.0f} launches, {total_us / steps / 1e3:,.2f} ms kernel time per "
        f"step; top: {ranked[0][0][:60]} {100 * ranked[0][1][1] / total_us:.0f}%"
    )
    return summary, "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("kind", choices=("census", "repro", "ncu"))
    parser.add_argument("path")
    parser.add_argument("--steps", type=int, default=2, help="ncu: the steps profiled")
    parser.add_argument("--top", type=int, default=15, help="ncu: kernels listed")
    args = parser.parse_args(argv)
    if args.steps < 1 or args.top < 1:
        parser.error("--steps and --top must be at least 1")
    try:
        with open(args.path, encoding="utf-8", errors="replace") as f:
            text = f.read()
    except OSError as err:
        print(f"gpu_report: cannot read {args.path}: {err.strerror}", file=sys.stderr)
        return 1
    if args.kind == "census":
        result = census(text)
    elif args.kind == "repro":
        try:
            result = repro(json.loads(text))
        except (json.JSONDecodeError, KeyError, TypeError) as err:
            print(f"gpu_report: {args.path} is not a repro.json: {err}", file=sys.stderr)
            return 1
    else:
        result = ncu(text, args.steps, args.top)
    if result is None:
        print(f"gpu_report: nothing to report in {args.path}", file=sys.stderr)
        return 1
    summary, detail = result
    print(summary)
    print(detail)
    return 0


if __name__ == "__main__":
    sys.exit(main())
