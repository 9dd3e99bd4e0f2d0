"""The long run: ``python -m fuzz --programs N --seed S [-v] [--plain]`` from ``tests/``.

Runs seeds S .. S+N-1 through ``driver.run_seed`` and ``hostile.run_hostile``, prints
each failing seed with its findings, and a summary line (programs, failures, seconds).
Exit status 1 on any failure.
Under the sanitizer build, use the environment ``tests/sanitize.sh`` sets (see
``tests/fuzz/__init__.py``).
"""

import argparse
import gc
import sys
import time

from .disturb import STATS
from .driver import FuzzFailure, run_seed
from .hostile import run_hostile


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m fuzz")
    ap.add_argument("--programs", type=int, default=1000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--plain", action="store_true", help="no disturbance, no memory limits")
    ap.add_argument("--no-hostile", action="store_true", help="skip the hostile programs")
    ap.add_argument("-v", action="store_true", help="print every seed")
    args = ap.parse_args(argv)
    t0, failed = time.perf_counter(), 0
    for seed in range(args.seed, args.seed + args.programs):
        # the interpreter's own objects out of the programs' full collections (collected
        # first: frozen garbage would be freed mid-program by needle's scoped collection)
        gc.collect()
        gc.freeze()
        try:
            run_seed(seed, disturbed=not args.plain)
            if not args.no_hostile and not args.plain:
                findings = run_hostile(seed)
                if findings:
                    raise FuzzFailure("\n".join(findings))
            if args.v:
                print(f"seed {seed}: ok", flush=True)
        except FuzzFailure as err:
            failed += 1
            print(f"FAIL seed {seed}:\n  " + str(err).replace("\n", "\n  "), flush=True)
        if (seed - args.seed + 1) % 500 == 0:
            print(
                f"... {seed - args.seed + 1} programs, {failed} failed, "
                f"{time.perf_counter() - t0:.0f} s",
                flush=True,
            )
    gc.unfreeze()
    dt = time.perf_counter() - t0
    print(f"{args.programs} programs from seed {args.seed}: {failed} failed, {dt:.1f} s")
    print(f"disturbances: {STATS}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
