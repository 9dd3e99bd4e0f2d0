"""Train a PTB language model from the command line: ``python -m needle.apps.train_ptb``.

With no ``--data`` it writes needle's synthetic PTB-format corpus to a temporary directory and
trains on that; with ``--data DIR`` it reads ``DIR/train.txt`` and ``DIR/test.txt`` (or the
upstream names ``ptb.train.txt`` / ``ptb.test.txt``; when DIR has only ``ptb.valid.txt`` and
``ptb.test.txt``, ``ptb.valid.txt`` is the training text, and the script says so). Each epoch
trains on the training split, evaluates on the test split and prints one line with the train
and test loss, perplexity and accuracy, the time and the peak device memory
(``ndl.memory.max_memory_allocated``). The defaults are the course's Transformer configuration
(``needle.apps.course_config.COURSE``: embedding 20, hidden 32, 1 layer, seq_len 20, batch 256,
Adam lr 3e-3) on a small synthetic corpus, which runs in seconds per epoch on two CPU cores.

Examples::

    python -m needle.apps.train_ptb
    python -m needle.apps.train_ptb --model lstm --epochs 3
    python -m needle.apps.train_ptb --data ../shared/data/ptb --max-lines 2000
    python -m needle.distributed.run -n 2 -m needle.apps.train_ptb --distributed mpi

With ``--distributed mpi|nccl``, started by ``mpiexec -n N`` or ``python -m
needle.distributed.run -n N``, each rank trains on its ``--batch-size / N`` columns of every
batch with the model wrapped in ``needle.distributed.DistributedDataParallel`` (aligned
collections on), so N ranks train like one process at ``--batch-size``; rank 0 prints, and the
figures are over every rank's tokens.
"""

import argparse
import math
import os
import sys
import tempfile
import time

import numpy as np

import needle as ndl
from needle import nn, optim
from needle.data import Corpus, batchify, write_synthetic_corpus

from .course_config import COURSE
from .models import LanguageModel
from .simple_ml import epoch_general_ptb, format_bytes


def parse_args(argv=None):
    """The parsed command line (an argparse.Namespace)."""
    p = argparse.ArgumentParser(
        prog="python -m needle.apps.train_ptb",
        description="Train a needle LanguageModel on PTB-format text and report loss, "
        "perplexity, accuracy, time and peak device memory per epoch.",
    )
    p.add_argument(
        "--data",
        default=None,
        metavar="DIR",
        help="corpus directory (train.txt/test.txt or ptb.*.txt); default: write a "
        "synthetic corpus to a temporary directory",
    )
    p.add_argument("--model", choices=("transformer", "lstm", "rnn"), default=COURSE.seq_model)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=COURSE.batch_size)
    p.add_argument("--seq-len", type=int, default=COURSE.seq_len)
    p.add_argument("--lr", type=float, default=COURSE.lr)
    p.add_argument("--optimizer", choices=("adam", "sgd"), default="adam")
    p.add_argument("--weight-decay", type=float, default=0.0)
    p.add_argument("--clip", type=float, default=None, help="gradient-norm clip (default: none)")
    p.add_argument("--embedding-size", type=int, default=COURSE.embedding_size)
    p.add_argument("--hidden-size", type=int, default=COURSE.hidden_size)
    p.add_argument("--num-layers", type=int, default=COURSE.num_layers)
    p.add_argument(
        "--max-lines", type=int, default=None, help="read at most this many lines of each split"
    )
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument(
        "--synthetic-words",
        type=int,
        default=60_000,
        help="words in the synthetic corpus when no --data is given",
    )
    p.add_argument(
        "--synthetic-vocab",
        type=int,
        default=2_000,
        help="vocabulary bound of the synthetic corpus",
    )
    p.add_argument(
        "--graph-mode",
        choices=ndl.autograd.GRAPH_MODES,
        default="cycle_free",
        help="'needle' reproduces the course's reference cycles (memory grows "
        "until the garbage collector runs)",
    )
    p.add_argument("--seed", type=int, default=0, help="NumPy seed for the model's parameters")
    p.add_argument(
        "--distributed",
        choices=("mpi", "nccl"),
        default=None,
        help="data-parallel over the ranks of mpiexec / needle.distributed.run with this "
        "backend; --batch-size is the global batch, split evenly over the ranks",
    )
    p.add_argument("--progress", action="store_true", help="show per-step progress")
    args = p.parse_args(argv)
    for name in (
        "epochs",
        "batch_size",
        "seq_len",
        "embedding_size",
        "hidden_size",
        "num_layers",
        "synthetic_words",
    ):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1")
    if args.max_lines is not None and args.max_lines < 1:
        p.error("--max-lines must be >= 1")
    return args


def fail(message):
    """Exits with status 1 after printing ``train_ptb: error: message`` on stderr."""
    sys.exit(f"train_ptb: error: {message}")


def _device(name):
    dev = ndl.cuda() if name == "cuda" else ndl.cpu()
    if not dev.enabled():
        fail(f"device {name!r} is not available in this build / on this machine")
    return dev


def _perplexity(loss):
    return math.exp(loss) if loss < 700 else float("inf")


def _load_corpus(args, tmpdir):
    if args.data is None:
        path = write_synthetic_corpus(
            tmpdir, num_words=args.synthetic_words, seed=0, vocab_size=args.synthetic_vocab
        )
        print(
            f"no --data given: wrote a synthetic PTB-format corpus "
            f"({args.synthetic_words} words, vocabulary <= {args.synthetic_vocab}, seed 0) "
            f"to the temporary directory {path} (deleted once read)"
        )
    else:
        path = args.data
        if not os.path.exists(path):
            fail(f"data directory {path!r} does not exist")
        if not os.path.isdir(path):
            fail(f"--data {path!r} is not a directory")
    try:
        corpus = Corpus(path, max_lines=args.max_lines)
    except (FileNotFoundError, UnicodeDecodeError) as err:
        fail(f"cannot read the corpus in {path!r}: {err}")
    train_name = os.path.basename(corpus.train_path)
    test_name = os.path.basename(corpus.test_path)
    if train_name == "ptb.valid.txt":
        print(
            f"note: {path} has no training split; using ptb.valid.txt as the training text "
            f"and {test_name} as the evaluation text"
        )
    else:
        print(f"data: training text {train_name}, evaluation text {test_name}")
    return corpus


def _join_group(args):
    """(rank, world size): joins the process group for --distributed (the group of one
    otherwise). The global batch must split evenly over the ranks."""
    if args.distributed is None:
        return 0, 1
    from needle import distributed

    try:
        distributed.init_process_group(backend=args.distributed)
    except distributed.DistributedError as err:
        fail(str(err))
    world = distributed.get_world_size()
    if args.batch_size % world:
        fail(f"--batch-size {args.batch_size} is not a multiple of the {world} ranks")
    return distributed.get_rank(), world


def main(argv=None):
    """Runs the command line; returns 0 on success (errors exit with status 1 or 2)."""
    args = parse_args(argv)
    device = _device(args.device)
    ndl.autograd.set_graph_mode(args.graph_mode)
    rank, world = _join_group(args)
    if rank != 0:  # rank 0 speaks for the job; errors still reach stderr
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115 (for the life of the process)
    with tempfile.TemporaryDirectory(prefix="needle-ptb-") as tmpdir:
        corpus = _load_corpus(args, tmpdir)
    vocab = len(corpus.dictionary)
    bs = args.batch_size
    if len(corpus.train) < 2 * bs:
        fail(
            f"the training text has {len(corpus.train)} tokens, too few for --batch-size {bs} "
            f"(need at least {2 * bs}); use a smaller batch size or more lines"
        )
    if len(corpus.test) < 2:
        fail("the evaluation text has fewer than 2 tokens")
    eval_bs = min(bs, len(corpus.test) // 2) // world * world
    if eval_bs < 1:
        fail(f"the evaluation text has {len(corpus.test)} tokens, too few for {world} ranks")
    if eval_bs < bs:
        print(
            f"note: the evaluation text has {len(corpus.test)} tokens; evaluating with batch "
            f"size {eval_bs}"
        )
    train_data = batchify(corpus.train, bs, device, "float32")
    test_data = batchify(corpus.test, eval_bs, device, "float32")
    print(
        f"tokens: train {len(corpus.train)}, test {len(corpus.test)}; vocabulary {vocab}; "
        f"batches of {args.seq_len} x {bs}: train {train_data.shape[0]} rows, "
        f"test {test_data.shape[0]} rows"
    )
    if world > 1:
        from needle.distributed import ptb_rank_columns

        train_data = ptb_rank_columns(train_data)
        test_data = ptb_rank_columns(test_data)
        print(f"data-parallel: {world} ranks ({args.distributed}), {bs // world} columns each")

    np.random.seed(args.seed)
    model = LanguageModel(
        args.embedding_size,
        vocab,
        args.hidden_size,
        num_layers=args.num_layers,
        seq_model=args.model,
        seq_len=args.seq_len,
        device=device,
        dtype="float32",
    )
    n_params = sum(int(np.prod(p.shape)) for p in model.parameters())
    if args.distributed is not None:
        from needle.distributed import DistributedDataParallel

        model = DistributedDataParallel(model)
    opt_cls = optim.Adam if args.optimizer == "adam" else optim.SGD
    opt = opt_cls(model.parameters(), lr=args.lr, weight_decay=args.weight_decay)
    print(
        f"model: {args.model}, embedding {args.embedding_size}, hidden {args.hidden_size}, "
        f"{args.num_layers} layer(s), {n_params} parameters; {args.optimizer} lr {args.lr}; "
        f"device {device}; graph mode {args.graph_mode}"
    )

    progress = True if args.progress else None
    for epoch in range(1, args.epochs + 1):
        ndl.memory.reset_peak_memory_stats(device)
        start = time.perf_counter()
        train_acc, train_loss = epoch_general_ptb(
            train_data,
            model,
            seq_len=args.seq_len,
            loss_fn=nn.SoftmaxLoss(),
            opt=opt,
            clip=args.clip,
            device=device,
            dtype="float32",
            progress=progress,
        )
        test_acc, test_loss = epoch_general_ptb(
            test_data,
            model,
            seq_len=args.seq_len,
            loss_fn=nn.SoftmaxLoss(),
            opt=None,
            device=device,
            dtype="float32",
            progress=progress,
        )
        elapsed = time.perf_counter() - start
        peak = ndl.memory.max_memory_allocated(device)
        print(
            f"epoch {epoch}/{args.epochs}  "
            f"train loss {train_loss:.4f} ppl {_perplexity(train_loss):.2f} acc {train_acc:.4f}  "
            f"test loss {test_loss:.4f} ppl {_perplexity(test_loss):.2f} acc {test_acc:.4f}  "
            f"time {elapsed:.1f}s  peak memory {format_bytes(peak)}",
            flush=True,
        )
    if args.distributed is not None:
        from needle import distributed

        distributed.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
