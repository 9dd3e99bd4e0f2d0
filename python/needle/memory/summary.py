"""needle.memory.summary: ``memory_summary``, the readable report that puts together the
statistics (:mod:`.stats`), the live tensors (:mod:`.diagnostics`), the collection policy
(:mod:`.policy`) and the recorded collections' pauses (:mod:`.collection_log`) of one device.
"""

import needle_c as _c

from .collection_log import collection_history
from .diagnostics import live_tensors_summary
from .policy import gc_visible, get_gc_policy
from .stats import _flag, _format_bytes, _resolve, memory_stats


def memory_summary(device=None, abbreviated=False):
    """A readable report of the device's memory, as one string (``torch.cuda``'s signature):
    the statistics table (allocated, active, reserved and inactive-split bytes; blocks,
    active blocks, segments and inactive splits), the allocator's settings, the limit and
    out-of-memory line, the largest groups of live tensors by op, the gc pressure policy and
    the collection statistics (num_pressure_collections, num_oom_collections, gc_seconds,
    gc_freed_bytes), the pause histogram of the collections recorded for the device
    (:func:`~needle.memory.collection_history`: how many took under 1 ms, 1-10 ms, 10-100 ms,
    0.1-1 s and 1 s or more) and the ladder's steps (scoped collections, their time, objects
    examined and bytes freed, full collections and fallbacks).

    ``abbreviated=True`` leaves the breakdowns out, as torch's abbreviated summary leaves out
    its per-pool rows: the table, the limit line, one line of collection totals and the pause
    histogram remain, without the live tensors by op (which walk every object of the heap),
    the policy's parameters and the ladder's steps."""
    _flag("abbreviated", abbreviated)
    dev = _resolve(device)
    stats = memory_stats(dev)
    if not stats:
        return f"{dev!r}: not available\n"
    rows = [
        ("allocated", "allocated_bytes.all"),
        ("reserved", "reserved_bytes.all"),
    ]
    lines = [
        f"needle memory summary for {dev!r}",
        f"{'':<12}{'current':>14}{'peak':>14}{'total alloc':>14}{'total freed':>14}",
    ]
    rows.insert(1, ("active", "active_bytes.all"))
    rows.append(("inact split", "inactive_split_bytes.all"))
    counts = [
        ("blocks", "allocation.all"),
        ("active blks", "active.all"),
        ("segments", "segment.all"),
        ("inact splits", "inactive_split.all"),
    ]
    for label, key in rows:
        lines.append(
            f"{label:<12}"
            + "".join(
                f"{_format_bytes(stats[f'{key}.{field}']):>14}"
                for field in ("current", "peak", "allocated", "freed")
            )
        )
    for label, key in counts:
        lines.append(
            f"{label:<12}"
            + "".join(
                f"{stats[f'{key}.{field}']:>14}"
                for field in ("current", "peak", "allocated", "freed")
            )
        )
    settings = _c._get_allocator_settings(dev._id)
    lines.append(
        f"allocator: max_split_size "
        f"{_format_bytes(settings[0]) if settings[0] > 0 else 'none'}; "
        f"garbage_collection_threshold {settings[1] if settings[1] > 0 else 'none'}; "
        f"expandable_segments {'on' if settings[2] else 'off'}; "
        f"oversize allocations {stats['oversize_allocations.current']}, "
        f"segments {stats['oversize_segments.current']}; "
        f"cache releases by the threshold {stats['num_gc_releases']}"
    )
    limit = stats["memory_limit_bytes"]
    lines.append(
        f"limit: {'none' if limit < 0 else _format_bytes(limit)}; "
        f"OOMs: {stats['num_ooms']}; retries: {stats['num_alloc_retries']}; "
        f"collections run: {stats['num_collect_calls']} "
        f"(freed {_format_bytes(stats['gc_freed_bytes'])})"
    )
    if abbreviated:
        lines.append(_collections_line(stats))
        lines.append(_pauses_line(dev))
    else:
        lines.extend(_summary_diagnostics(dev, stats))
    return "\n".join(lines) + "\n"


def _describe_watermark(watermark):
    """The policy's watermark in words: computed, a size, or a share of each budget."""
    if watermark is None:
        return "computed"
    if isinstance(watermark, float):
        return f"{watermark:.0%} of each device's budget"
    return _format_bytes(watermark)


def _collections_line(stats):
    """The collector's totals on the device: one line, in both forms of the summary."""
    return (
        f"collections: pressure {stats.get('num_pressure_collections', 0)} "
        f"({stats.get('num_safe_point_collections', 0)} at safe points); "
        f"out-of-memory {stats.get('num_oom_collections', 0)}; "
        f"skipped {stats.get('num_pressure_skips', 0)}; "
        f"deferred {stats.get('num_pressure_deferrals', 0)}; "
        f"gc time {stats.get('gc_seconds', 0.0):.3f} s; "
        f"freed {_format_bytes(stats.get('gc_freed_bytes', 0))}"
    )


# The pause histogram's buckets: (label, upper bound in seconds), the last one open.
_PAUSE_BUCKETS = (
    ("<1 ms", 1e-3),
    ("1-10 ms", 1e-2),
    ("10-100 ms", 1e-1),
    ("0.1-1 s", 1.0),
    (">=1 s", float("inf")),
)


def _pause_histogram(records):
    """How many of ``records`` (collection_history's dicts) took the time of each bucket:
    a list of (label, count), in _PAUSE_BUCKETS' order."""
    counts = [0] * len(_PAUSE_BUCKETS)
    for record in records:
        counts[
            next(i for i, (_, bound) in enumerate(_PAUSE_BUCKETS) if record["seconds"] < bound)
        ] += 1
    return [(label, count) for (label, _), count in zip(_PAUSE_BUCKETS, counts)]


def _pauses_line(dev):
    """The pause histogram of the collections recorded for ``dev`` (its own and the
    process-wide ones), one line in both forms of the summary."""
    records = collection_history(dev)
    buckets = "; ".join(f"{label} {count}" for label, count in _pause_histogram(records))
    return f"pauses ({len(records)} collections recorded): {buckets}"


def _summary_diagnostics(dev, stats, top=10):
    """The lines memory_summary appends: live-tensor groups, gc policy, collection stats."""
    lines = []
    rows = live_tensors_summary(dev, "op")
    lines.append(f"live tensors by op (top {min(top, len(rows))} of {len(rows)} groups):")
    if rows:
        lines.append(f"  {'op':<24}{'count':>8}{'bytes':>14}{'storage':>14}")
        for row in rows[:top]:
            lines.append(
                f"  {str(row['key']):<24}{row['count']:>8}"
                f"{_format_bytes(row['bytes']):>14}"
                f"{_format_bytes(row['storage_bytes']):>14}"
            )
    else:
        lines.append("  (none)")
    policy = get_gc_policy()
    watermark = policy["watermark"]
    lines.append(
        f"gc policy: {'enabled' if policy['enabled'] else 'disabled'}; "
        f"growth {policy['growth']:g}; min_growth {_format_bytes(policy['min_growth'])}; "
        f"high_water {policy['high_water']:g}; max_gc_fraction {policy['max_gc_fraction']:g}; "
        f"watermark {_describe_watermark(watermark)}; "
        f"gc visible: {gc_visible()}"
    )
    lines.append(_collections_line(stats))
    lines.append(_pauses_line(dev))
    lines.append(
        f"ladder: scoped {stats.get('num_scoped_collections', 0)} "
        f"({stats.get('scoped_gc_seconds', 0.0) * 1e3:.2f} ms, "
        f"{stats.get('scoped_objects_examined', 0)} objects examined, "
        f"freed {_format_bytes(stats.get('scoped_freed_bytes', 0))}); "
        f"full {stats.get('num_full_collections', 0)} "
        f"(of which {stats.get('num_full_fallbacks', 0)} after a scoped one freed too little; "
        f"{stats.get('num_fallbacks_skipped', 0)} more skipped by the back-off)"
    )
    return lines
