"""Gradient checkpointing: peak allocated bytes and step time of the course's 4-layer
transformer with its layers checkpointed against none, in two schemes:

- ``wrapper``: every layer wrapped in ndl.utils.checkpoint_wrapper, the last one included;
- ``sequential``: the layers run through ndl.utils.checkpoint_sequential(layers, 4, x), each
  layer its own segment and the last one run plainly (PyTorch's checkpoint_sequential): the
  last layer's backward begins right after its forward, so recomputing it costs a forward for
  little memory in PyTorch, which frees saved tensors as its backward goes; needle's backward
  does not, so the plain last layer's graph lives through the others' recomputations (one
  layer's graph more at the peak: docs/benchmarks.md). Wrapping the first 3 layers would be the
  same computation; the bench calls checkpoint_sequential itself (nn.Transformer's list
  ``transformer_layers`` replaced by one module that runs it), so that it measures the
  library's helper, not a hand-made equivalent, and nn.Transformer's own forward is untouched.

Two models at COURSE's sizes with num_layers=4: the whole LanguageModel (embedding,
transformer, the vocabulary's Linear and SoftmaxLoss) and its nn.Transformer stack alone
(with the sum of squares of its output as the loss). A step is forward, loss, backward and
an Adam step; the peak is that of a step after a warm-up step (so Adam's state is in both), each
configuration alone in the process; the time is the median over the steps, the
configurations' steps interleaved (plain, wrapper, sequential, plain, ...) so that the machine's
drift falls on all alike. Each scheme's ratios are to the plain model's, the time's pair by
pair (the median over steps of its step over the plain step taken beside it). Targets: peak
<= 0.6x, time <= 1.4x.

    python bench/checkpoint_bench.py [--steps 10] [--batch 256] [--vocab 10000] [--dropout 0.0]
        [--device cpu|cuda] [--models language_model,transformer]
        [--scheme wrapper|sequential|both]
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

from benchutil import paired_time_ratio, print_machine, step_peak_bytes

LAYERS = 4
SCHEMES = ("wrapper", "sequential")
PLAIN = "none"


class CheckpointedSequence(nn.Module):
    """``layers`` run as one module through ndl.utils.checkpoint_sequential(layers,
    ``segments``, x): every segment but the last checkpointed."""

    def __init__(self, layers, segments):
        super().__init__()
        self.layers = list(layers)
        self.segments = segments

    def forward(self, x):
        return ndl.utils.checkpoint_sequential(self.layers, self.segments, x)


def checkpoint_layers(stack, scheme):
    """Checkpoints the layers of ``stack`` (an nn.Transformer) in place by ``scheme``: one of
    SCHEMES, or PLAIN for none."""
    layers = stack.transformer_layers
    if scheme == "wrapper":
        stack.transformer_layers = [ndl.utils.checkpoint_wrapper(layer) for layer in layers]
    elif scheme == "sequential":
        stack.transformer_layers = [CheckpointedSequence(layers, len(layers))]
    elif scheme != PLAIN:
        raise ValueError(f"checkpoint scheme must be one of {SCHEMES} or {PLAIN!r}, got {scheme!r}")


def build(kind, args, device, scheme):
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
    checkpoint_layers(stack, scheme)
    return model, loss_fn


class _Run:
    """One configuration (plain or a checkpointing scheme) ready to step."""

    def __init__(self, kind, args, device, scheme):
        self.model, self.loss_fn = build(kind, args, device, scheme)
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


def step_times(kind, args, device, schemes):
    """The step times of each of ``schemes``, their steps interleaved (plain, wrapper,
    sequential, plain, ...) after a warm-up step each, so that a machine's drift falls on all
    alike."""
    runs = [_Run(kind, args, device, scheme) for scheme in schemes]
    for run in runs:
        run.step()
    times = [[] for _ in runs]
    for _ in range(args.steps):
        for k, run in enumerate(runs):
            times[k].append(run.step())
    return times


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=10, help="timed steps after one warm-up")
    parser.add_argument("--batch", type=int, default=COURSE.batch_size)
    parser.add_argument("--vocab", type=int, default=COURSE.vocab_size)
    parser.add_argument("--dropout", type=float, default=0.0, help="the course's is 0.0")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--models", default="language_model,transformer")
    parser.add_argument(
        "--scheme",
        choices=(*SCHEMES, "both"),
        default="both",
        help="which layers are checkpointed (see the docstring); both: each, one line each",
    )
    args = parser.parse_args()
    device = ndl.cpu() if args.device == "cpu" else ndl.cuda()
    schemes = (PLAIN, *(SCHEMES if args.scheme == "both" else (args.scheme,)))
    print_machine(device=args.device)
    print(json.dumps({"config": vars(args) | {"layers": LAYERS, "seq_len": COURSE.seq_len}}))
    for kind in args.models.split(","):
        peaks = [
            step_peak_bytes(lambda s=scheme: _Run(kind, args, device, s), device)
            for scheme in schemes
        ]
        times = step_times(kind, args, device, schemes)
        rows = [
            {
                "model": kind,
                "scheme": scheme,
                "peak_bytes": peak,
                "step_s": statistics.median(t),
                "steps_s": t,
            }
            for scheme, peak, t in zip(schemes, peaks, times)
        ]
        for row in rows:
            print(json.dumps(row), flush=True)
        plain = rows[0]
        for row in rows[1:]:
            ratios = {
                "model": kind,
                "scheme": row["scheme"],
                "peak_ratio": round(row["peak_bytes"] / plain["peak_bytes"], 3),
                "time_ratio": round(paired_time_ratio(row["steps_s"], plain["steps_s"]), 3),
                "targets": {"peak_ratio": 0.6, "time_ratio": 1.4},
            }
            print(json.dumps(ratios), flush=True)


if __name__ == "__main__":
    main()
