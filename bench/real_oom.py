"""A real out-of-memory error from the course's leak, recovery in the same process, and the hook.

    python bench/real_oom.py [--device cuda|cpu] [--limit SIZE] [--max-steps 1000]
                             [--recover-steps 3] [--hook-steps N]
                             [--batch-size 256] [--seq-len 20] [--words 200000]

The course's PTB Transformer (needle.repro's setup) trains in the course's graph mode
("needle": every backward pass leaves reference cycles) with Python's automatic collector
disabled (``gc.disable()``), so nothing frees a step's graph. With no emulated limit the
garbage fills the device's own memory: on a GPU cudaMalloc fails, on needle's CUDA simulator
the same past ``NEEDLE_SIM_MEMORY``; on the CPU ``--limit`` stands in for a capacity (required
there: the host's memory is not a device's). Three phases in one process:

1. ``leak``, needle's hook off: trains until ``needle.OutOfMemoryError``, whose figures
   (``requested``, ``allocated``, ``reserved``, ``limit``) must be the device's: no limit and
   the request past what the GPU had left (needle's reservation plus the request over 90% of
   its memory), or with ``--limit`` the request past that limit.
2. ``recover``: drops the graph (the gradients and the attention layers' last maps),
   ``gc.collect()``, then trains ``--recover-steps`` steps with a ``gc.collect()`` after each:
   the same process trains again, below what one leaking step held.
3. ``hook``, needle's hook on, the collector still disabled: trains ``--hook-steps`` (default
   1.5 times the steps that ran out, at least 3 more) and must not run out; the hook's
   collections must have run. Its soft path honours ``gc.disable()`` (it counts skips and
   deferrals instead), so here the out-of-memory path does the work: release the cache,
   collect, retry; the error never reaches the loop.

Prints one JSON line per phase, then a summary line (``real_oom: PASS ...`` or ``real_oom:
FAIL ...``); exit status 1 when an expectation fails.
"""

import argparse
import gc
import json
import math
import os
import sys
import tempfile
import time

import needle as ndl
from needle import memory
from needle.data import get_batch, write_synthetic_corpus
from needle.repro import course_setup

MiB = 2**20


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    parser.add_argument(
        "--limit",
        help="an emulated limit ('256MiB', '0.5' of the device); required on the cpu, "
        "default on a GPU: none (its own memory)",
    )
    parser.add_argument("--max-steps", type=int, default=1000, help="leak steps before giving up")
    parser.add_argument("--recover-steps", type=int, default=3)
    parser.add_argument("--hook-steps", type=int, help="default: 1.5x the steps that ran out")
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--seq-len", type=int, default=20)
    parser.add_argument("--words", type=int, default=200_000)
    args = parser.parse_args(argv)
    if args.device == "cpu" and args.limit is None:
        parser.error("--device cpu needs --limit (the host's memory is not a device's)")
    for name in ("max_steps", "recover_steps", "batch_size", "seq_len", "words"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1")
    if args.hook_steps is not None and args.hook_steps < 1:
        parser.error("--hook-steps must be at least 1")
    return args


class Trainer:
    """The course's training step on the course's model, over the corpus in order."""

    def __init__(self, corpus_dir, args, device):
        self.device, self.seq_len = device, args.seq_len
        self.corpus, self.train, self.model, self.opt, self.loss_fn = course_setup(
            corpus_dir, args.batch_size, args.seq_len, device
        )
        self.position = 0

    def step(self):
        """One step; returns the loss. Its graph is left to whatever collects it."""
        if self.position >= self.train.shape[0] - 1 - self.seq_len:
            self.position = 0
        X, y = get_batch(self.train, self.position, self.seq_len, device=self.device)
        logits, _ = self.model(X)
        loss = self.loss_fn(logits, y)
        self.opt.reset_grad()
        loss.backward()
        self.opt.step()
        self.position += self.seq_len
        return float(loss.numpy().reshape(-1)[0])

    def drop_graph(self):
        """Drops what still reaches the last graph: the parameters' gradients and each
        attention layer's last attention map (the course keeps it in ``probs``)."""
        self.opt.reset_grad()
        for module in self.model._children():
            if hasattr(module, "probs"):
                module.probs = None


def device_state(device):
    """needle's allocated and reserved bytes, and on a GPU the driver's free and total."""
    state = {
        "allocated": memory.memory_allocated(device),
        "reserved": memory.memory_reserved(device),
    }
    if device.name == "cuda":
        state["free"], state["total"] = ndl.cuda.mem_get_info(device)
    return state


def leak(trainer, args, limit):
    """Phase 1: trains with the hook and the collector off until the device runs out."""
    device = trainer.device
    memory.set_gc_policy(enabled=False)
    start, t0 = device_state(device), time.perf_counter()
    row = {"phase": "leak", "device": str(device), "limit_bytes": limit, "start": start}
    row["max_steps"] = args.max_steps
    after_first = None
    for step in range(1, args.max_steps + 1):
        try:
            trainer.step()
        except ndl.OutOfMemoryError as err:
            row.update(
                oom=True,
                oom_step=step,
                message=str(err),
                error={k: getattr(err, k) for k in ("requested", "allocated", "reserved", "limit")},
                error_device=str(err.device),
                at_oom=device_state(device),
            )
            break
        if step == 1:
            after_first = memory.memory_allocated(device)
    else:
        row.update(oom=False, oom_step=None)
    row["allocated_after_first_step"] = after_first
    row["seconds"] = time.perf_counter() - t0
    return row


def leak_failures(row, device, limit):
    """What is wrong with phase 1's outcome ([] when it is what the script expects)."""
    if not row["oom"]:
        return [f"the leak did not run out of memory in {row['max_steps']} steps"]
    failures = []
    e = row["error"]
    if row["oom_step"] < 2:
        failures.append("out of memory at the first step: the configuration never fits")
    if row["error_device"] != str(device):
        failures.append(f"the error names {row['error_device']}, not {device}")
    if not (e["requested"] > 0 and 0 <= e["allocated"] <= e["reserved"]):
        failures.append(f"implausible figures {e}")
    if limit is not None:
        if e["limit"] != limit or e["reserved"] + e["requested"] <= limit:
            failures.append(f"the error's figures {e} do not pass the limit {limit}")
    elif e["limit"] is not None:
        failures.append(f"no limit was set, yet the error reports limit {e['limit']}")
    elif device.name == "cuda" and e["reserved"] + e["requested"] <= 0.9 * row["at_oom"]["total"]:
        failures.append(
            f"the device refused with only {e['reserved'] + e['requested']} of "
            f"{row['at_oom']['total']} bytes reserved or asked for"
        )
    return failures


def recover(trainer, args, leak_row):
    """Phase 2: drops the leaked graphs and trains again in the same process."""
    device, t0 = trainer.device, time.perf_counter()
    before = memory.memory_allocated(device)
    trainer.drop_graph()
    collected = gc.collect()
    after = device_state(device)
    row = {"phase": "recover", "allocated_before": before, "after_cleanup": after}
    row["collected_objects"] = collected
    losses, failures = [], []
    try:
        for _ in range(args.recover_steps):
            losses.append(trainer.step())
            gc.collect()  # the course's workaround: the recovery must not leak again
    except ndl.OutOfMemoryError as err:
        failures.append(f"out of memory again after cleanup: {err}")
    row.update(losses=losses, seconds=time.perf_counter() - t0)
    first = leak_row["allocated_after_first_step"]
    if first is not None and after["allocated"] >= first:
        failures.append(
            f"cleanup left {after['allocated']} bytes allocated, not below the "
            f"{first} one leaking step held"
        )
    if len(losses) != args.recover_steps or not all(math.isfinite(x) for x in losses):
        failures.append(f"did not train {args.recover_steps} steps after cleanup: {losses}")
    return row, failures


def hook(trainer, args, steps_to_oom):
    """Phase 3: the hook on, the collector still disabled, past where the leak ran out."""
    device = trainer.device
    steps = args.hook_steps or max(math.ceil(1.5 * steps_to_oom), steps_to_oom + 3)
    trainer.drop_graph()
    gc.collect()
    memory.set_gc_policy(enabled=True)
    memory.reset_peak_memory_stats(device)
    s0, t0 = memory.memory_stats(device), time.perf_counter()
    done, failures, loss = 0, [], None
    try:
        for done in range(1, steps + 1):
            loss = trainer.step()
    except ndl.OutOfMemoryError as err:
        failures.append(f"out of memory with the hook at step {done}: {err}")
    s = memory.memory_stats(device)
    row = {
        "phase": "hook",
        "steps": done,
        "steps_asked": steps,
        "pressure_collections": s["num_pressure_collections"] - s0["num_pressure_collections"],
        "oom_collections": s["num_oom_collections"] - s0["num_oom_collections"],
        "pressure_skips": s["num_pressure_skips"] - s0["num_pressure_skips"],
        "pressure_deferrals": s["num_pressure_deferrals"] - s0["num_pressure_deferrals"],
        "gc_trigger_bytes": s["gc_trigger_bytes"],
        "gc_seconds": s["gc_seconds"] - s0["gc_seconds"],
        "peak_allocated": s["allocated_bytes.all.peak"],
        "peak_reserved": s["reserved_bytes.all.peak"],
        "last_loss": loss,
        "end": device_state(device),
        "seconds": time.perf_counter() - t0,
    }
    if not failures and row["pressure_collections"] + row["oom_collections"] == 0:
        failures.append("the hook ran no collection, so this run did not test it")
    if loss is not None and not math.isfinite(loss):
        failures.append(f"the loss is {loss}")
    return row, failures


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    device = ndl.cpu() if args.device == "cpu" else ndl.cuda()
    if not device.enabled():
        print(f"real_oom: FAIL: {device} is unavailable: {ndl.cuda.unavailable_reason()}")
        return 1
    limit = None
    if args.limit is not None:
        capacity = memory.memory_stats(device)["device_capacity_bytes"]
        limit = memory.parse_size(args.limit, capacity)
    with tempfile.TemporaryDirectory(prefix="needle-real-oom-") as tmp:
        corpus = write_synthetic_corpus(os.path.join(tmp, "corpus"), num_words=args.words, seed=0)
        trainer = Trainer(str(corpus), args, device)
    ndl.autograd.set_graph_mode("needle")
    memory.set_memory_limit(device, limit)
    gc.collect()
    gc.disable()
    try:
        leak_row = leak(trainer, args, limit)
        print(json.dumps(leak_row), flush=True)
        failures = leak_failures(leak_row, device, limit)
        recover_row, recover_failures = recover(trainer, args, leak_row)
        print(json.dumps(recover_row), flush=True)
        failures += recover_failures
        steps_to_oom = leak_row["oom_step"] or args.max_steps
        hook_row, hook_failures = hook(trainer, args, steps_to_oom)
        print(json.dumps(hook_row), flush=True)
        failures += hook_failures
    finally:
        gc.enable()
        memory.set_gc_policy(enabled=True)
    summary = {"phase": "summary", "ok": not failures, "failures": failures}
    print(json.dumps(summary))
    if leak_row["oom"]:
        e = leak_row["error"]
        limit_text = "none" if e["limit"] is None else f"{e['limit'] / MiB:.1f} MiB"
        print(
            f"leak: out of memory at step {leak_row['oom_step']} on {device}: requested "
            f"{e['requested'] / MiB:.1f} MiB with {e['allocated'] / MiB:.1f} MiB allocated, "
            f"{e['reserved'] / MiB:.1f} MiB reserved, limit {limit_text}"
            + (
                f"; the driver had {leak_row['at_oom']['free'] / MiB:.1f} of "
                f"{leak_row['at_oom']['total'] / MiB:.1f} MiB free"
                if "free" in leak_row["at_oom"]
                else ""
            )
        )
    print(
        f"recover: {recover_row['after_cleanup']['allocated'] / MiB:.1f} MiB allocated after "
        f"cleanup; losses {', '.join(f'{x:.3f}' for x in recover_row['losses'])}"
    )
    print(
        f"hook: {hook_row['steps']} of {hook_row['steps_asked']} steps, "
        f"{hook_row['pressure_collections']} pressure and {hook_row['oom_collections']} "
        f"out-of-memory collections ({hook_row['gc_seconds']:.2f} s), peak "
        f"{hook_row['peak_allocated'] / MiB:.1f} MiB allocated, "
        f"{hook_row['peak_reserved'] / MiB:.1f} MiB reserved"
    )
    verdict = "PASS" if not failures else "FAIL: " + "; ".join(failures)
    print(f"real_oom: {verdict}")
    return 0 if not failures else 1


if __name__ == "__main__":
    sys.exit(main())
