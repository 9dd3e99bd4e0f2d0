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

    python -m fuzz --programs 10000 --seed 1           # normal build (PYTHONPATH=../python)
    # under the sanitizer build: the environment tests/sanitize.sh sets, see README of
    # this package in docs/fuzzing.md, or simply
    bash tests/sanitize.sh tests/fuzz/test_fuzz.py --fuzz-programs 10000 --fuzz-seed 1

``python -m fuzz`` prints one line per failure (the seed reproduces it:
``python -m fuzz --programs 1 --seed SEED -v``) and a summary.
"""
