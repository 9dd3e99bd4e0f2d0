"""Gradient checkpointing: peak allocated bytes and step time of the course's 4-layer
transformer with each layer checkpointed (ndl.utils.checkpoint_wrapper) against none.

Two models at COURSE's sizes with num_layers=4: the whole LanguageModel (embedding,
transformer, the vocabulary's Linear and SoftmaxLoss) and its nn.Transformer stack alone
(with the sum of squares of its output as the loss). A step is forward, loss, backward and
an Adam step; the peak is that of a step after a warm-up step (so Adam's state is in both), each
configuration alone in the process; the time is the median over the steps, the two
configurations' steps interleaved (plain, checkpointed, plain, ...) so that the machine's drift
falls on both alike. Targets: peak <= 0.6x, time <= 1.4x.

    python bench/checkpoint_bench.py [--steps 3] [--batch 256] [--vocab 10000] [--dropout 0.0]
        [--device cpu|cuda]
"""

import argparse
import json
import statistics
import time

import numpy as np

import needle as ndl
from needle import nn
from needle.apps.course_config import COURSE
from needle.apps.models import LanguageModel

from benchutil import print_machine

LAYERS = 4


def build(kind, args, device, use_checkpoint):
    """(model, the layer stack, loss_fn(model) -> loss) for one configuration, seeded alike."""
    np.random.seed(0)
    if kind == "language_model":
        model = LanguageModel(
            COURSE.embedding_size,
            args.vocab,
            COURSE.hidden_size,
            num_layers=LAYERS,
            seq_model="transformer",
            device=device,
        )
        stack = model.seq_model
        tokens = np.random.randint(0, args.vocab, (COURSE.seq_len, args.batch))
        x = ndl.Tensor(tokens.astype(np.float32), device=device, requires_grad=False)
        labels = np.random.randint(0, args.vocab, (COURSE.seq_len * args.batch,))
        y = ndl.Tensor(labels.astype(np.float32), device=device, requires_grad=False)
        softmax_loss = nn.SoftmaxLoss()

        def loss_fn():
            return softmax_loss(model(x)[0], y)
    else:
        model = stack = nn.Transformer(
            COURSE.embedding_size,
            COURSE.hidden_size,
            LAYERS,
            num_head=COURSE.num_head,
            dim_head=COURSE.dim_head,
            device=device,
        )
        shape = (COURSE.seq_len, args.batch, COURSE.embedding_size)
        x = ndl.Tensor(np.random.randn(*shape).astype(np.float32), device=device)

        def loss_fn():
            out, _ = model(x)
            return (out * out).sum()

    for module in model._children():
        if isinstance(module, nn.Dropout):
            module.p = args.dropout
    if use_checkpoint:
        stack.transformer_layers = [
            ndl.utils.checkpoint_wrapper(layer) for layer in stack.transformer_layers
        ]
    return model, loss_fn


class _Run:
    """One configuration (plain or checkpointed) ready to step."""

    def __init__(self, kind, args, device, use_checkpoint):
        self.model, self.loss_fn = build(kind, args, device, use_checkpoint)
        self.opt = ndl.optim.Adam(self.model.parameters(), lr=COURSE.lr)
        self.device = device

    def step(self):
        """One training step; returns its wall time in seconds."""
        start = time.perf_counter()
        self.opt.reset_grad()
        loss = self.loss_fn()
        loss.backward()
        self.opt.step()
        loss.numpy()  # the step has finished (a GPU's work too)
        return time.perf_counter() - start


def peak_bytes(kind, args, device, use_checkpoint):
    """max_memory_allocated() over a step after a warm-up step (Adam's state made), with this
    configuration alone in the process."""
    run = _Run(kind, args, device, use_checkpoint)
    run.step()
    ndl.memory.reset_peak_memory_stats(device)
    run.step()
    peak = ndl.memory.max_memory_allocated(device)
    del run
    return peak


def step_times(kind, args, device):
    """The median step time of each configuration, their steps interleaved (plain, checkpointed,
    plain, ...) after a warm-up step each, so that a machine's drift falls on both alike."""
    runs = [_Run(kind, args, device, False), _Run(kind, args, device, True)]
    for run in runs:
        run.step()
    times = [[], []]
    for _ in range(args.steps):
        for k, run in enumerate(runs):
            times[k].append(run.step())
    return [statistics.median(t) for t in times]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=3, help="timed steps after one warm-up")
    parser.add_argument("--batch", type=int, default=COURSE.batch_size)
    parser.add_argument("--vocab", type=int, default=COURSE.vocab_size)
    parser.add_argument("--dropout", type=float, default=0.0, help="the course's is 0.0")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--models", default="language_model,transformer")
    args = parser.parse_args()
    device = ndl.cpu() if args.device == "cpu" else ndl.cuda()
    print_machine(device=args.device)
    print(json.dumps({"config": vars(args) | {"layers": LAYERS, "seq_len": COURSE.seq_len}}))
    for kind in args.models.split(","):
        peaks = [peak_bytes(kind, args, device, use) for use in (False, True)]
        seconds = step_times(kind, args, device)
        plain, ckpt = (
            {"model": kind, "checkpoint": use, "peak_bytes": peak, "step_s": step_s}
            for use, peak, step_s in zip((False, True), peaks, seconds)
        )
        print(json.dumps(plain), flush=True)
        print(json.dumps(ckpt), flush=True)
        ratios = {
            "model": kind,
            "peak_ratio": round(ckpt["peak_bytes"] / plain["peak_bytes"], 3),
            "time_ratio": round(ckpt["step_s"] / plain["step_s"], 3),
            "targets": {"peak_ratio": 0.6, "time_ratio": 1.4},
        }
        print(json.dumps(ratios), flush=True)


if __name__ == "__main__":
    main()
