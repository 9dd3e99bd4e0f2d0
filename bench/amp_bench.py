"""Automatic mixed precision: the course's PTB transformer step in float32, under
autocast(bfloat16) and under autocast(float16) with a GradScaler, on one device.

The course's LanguageModel (COURSE: vocabulary 10k, sequence length 20, batch 256, the
transformer) on random tokens; a step is forward, SoftmaxLoss, reset_grad, backward and an
Adam step (with the scaler's scale/step/update for float16), ending with the loss read. The
peak is ``max_memory_allocated`` over one step after a warm-up step, each mode alone in the
process; the time is the median step, the modes' steps interleaved so that the machine's drift
falls on all alike. Each timed step follows an untimed step of its own mode, as in a training
loop: what a step leaves running falls on its own mode, not on the next one (the BLAS's threads
spin for a while after a call and take a core from whatever runs next: float32's cost, which
the mode after float32 paid when the modes' steps simply alternated). Ratios are to float32's,
the time's pair by pair (the median over steps of a mode's step over the float32 step taken
beside it). Issue 22's targets on the CPU: peak <= 0.6x, time <= 1.0x.

    python bench/amp_bench.py [--steps 5] [--device cpu|cuda] [--modes float32,bfloat16,float16]
        [--batch 256] [--vocab 10000]
"""

import argparse
import contextlib
import json
import statistics
import time

import numpy as np

import needle as ndl
from needle import nn
from needle.apps.course_config import COURSE

from benchutil import paired_time_ratio, print_machine, step_peak_bytes


class _Run:
    """One mode's model, optimizer and data, seeded alike, ready to step."""

    def __init__(self, mode, device, batch, vocab):
        np.random.seed(0)
        self.mode = mode
        self.device = device
        self.model = COURSE.language_model(vocab_size=vocab, device=device)
        self.opt = ndl.optim.Adam(self.model.parameters(), lr=COURSE.lr)
        self.loss_fn = nn.SoftmaxLoss()
        tokens = np.random.randint(0, vocab, (COURSE.seq_len, batch))
        labels = np.random.randint(0, vocab, (COURSE.seq_len * batch,))
        self.x = ndl.Tensor(tokens.astype(np.float32), device=device, requires_grad=False)
        self.y = ndl.Tensor(labels.astype(np.float32), device=device, requires_grad=False)
        self.scaler = ndl.amp.GradScaler(init_scale=2.0**12) if mode == "float16" else None

    def _context(self):
        if self.mode == "float32":
            return contextlib.nullcontext()
        return ndl.autocast(self.device, dtype=self.mode)

    def step(self):
        """One training step; returns (seconds, loss)."""
        start = time.perf_counter()
        self.opt.reset_grad()
        with self._context():
            loss = self.loss_fn(self.model(self.x)[0], self.y)
        if self.scaler is None:
            loss.backward()
            self.opt.step()
        else:
            self.scaler.scale(loss).backward()
            self.scaler.step(self.opt)
            self.scaler.update()
        value = float(loss.numpy().reshape(-1)[0])
        return time.perf_counter() - start, value


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--modes", default="float32,bfloat16,float16")
    parser.add_argument("--batch", type=int, default=COURSE.batch_size)
    parser.add_argument("--vocab", type=int, default=COURSE.vocab_size)
    args = parser.parse_args()
    device = ndl.cpu() if args.device == "cpu" else ndl.cuda()
    modes = args.modes.split(",")
    if modes[0] != "float32":
        parser.error("--modes must start with float32, the ratios' basis")
    print_machine(device=args.device)
    print(json.dumps({"config": vars(args)}), flush=True)
    peaks = {
        mode: step_peak_bytes(lambda m=mode: _Run(m, device, args.batch, args.vocab), device)
        for mode in modes
    }
    runs = [_Run(mode, device, args.batch, args.vocab) for mode in modes]
    for run in runs:
        run.step()
    times = {mode: [] for mode in modes}
    losses = {mode: [] for mode in modes}
    for _ in range(args.steps):
        for run in runs:
            run.step()  # the lead-in: see the docstring
            seconds, loss = run.step()
            times[run.mode].append(seconds)
            losses[run.mode].append(loss)
    base_peak = peaks["float32"]
    for mode in modes:
        row = {
            "mode": mode,
            "peak_bytes": peaks[mode],
            "step_s": statistics.median(times[mode]),
            "steps_s": times[mode],
            "peak_ratio": round(peaks[mode] / base_peak, 3),
            "time_ratio": round(paired_time_ratio(times[mode], times["float32"]), 3),
            "last_loss": round(losses[mode][-1], 4),
            "targets": {"peak_ratio": 0.6, "time_ratio": 1.0},
        }
        print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
