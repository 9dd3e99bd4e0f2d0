"""needle's fuzzer (issue 11: no input, finalizer, collection or thread can crash needle or
make it lie).

Random programs over needle's Tensor ops (``tensor_gen`` draws them as a list of
instructions with a float64 NumPy mirror, ``tensor_run`` executes them, ``disturb``
interferes while they run) and over NDArray views and ``__setitem__`` (``ndarray_prog``,
mirrored by NumPy views of one buffer). ``driver.run_seed`` runs one program by seed and
raises ``FuzzFailure`` on any finding: an exception other than the documented ones,
a forward value or gradient that disagrees with NumPy / a finite difference / an
undisturbed rerun in the other graph mode, an unraisable exception from a finalizer, or
device bytes not returned at the end.

The CI slice is ``test_fuzz.py`` (fixed seeds). The long run, from ``tests/``::

    PYTHONPATH=../python python -m fuzz --programs 10000 --seed 100000

and under the sanitizer build (from the repository root; builds build/sanitize first)::

    NEEDLE_FUZZ_PROGRAMS=10000 NEEDLE_FUZZ_SEED=100000 bash tests/sanitize.sh tests/fuzz

or ``python -m fuzz`` with the environment tests/sanitize.sh sets (LD_PRELOAD of libasan
and libstdc++, ASAN_OPTIONS, UBSAN_OPTIONS, NEEDLE_SANITIZE=1,
PYTHONPATH=build/sanitize/lib:python). ``hostile`` adds programs that set graph
attributes to inconsistent values on purpose (only clear exceptions may come out).

``python -m fuzz`` prints one line per failure (the seed reproduces it:
``python -m fuzz --programs 1 --seed SEED -v``) and a summary.
"""
