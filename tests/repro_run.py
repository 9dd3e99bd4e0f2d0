"""Runs ``python -m needle.repro`` in a subprocess for the tests that check it (test_pressure.py,
test_repro_options.py, test_cuda_memory.py): the command, the small configuration that keeps a
run to seconds, the report read back from repro.json, and an environment in which tqdm is
missing or a stand-in, so the progress output does not depend on what the machine has installed.
"""

import json
import os
import subprocess
import sys
import textwrap

# A batch of 32 sequences of 10 tokens from a 20k-word corpus: each mode trains in about a second.
SMALL = ("--batch-size", "32", "--seq-len", "10", "--words", "20000")

# tqdm as the stand-in package writes it: one line per update, so a test can see the bar was used.
_FAKE_TQDM = """
    import sys


    class tqdm:
        def __init__(self, total, desc, **kwargs):
            self.total, self.desc, self.n = total, desc, 0

        def set_postfix(self, **kwargs):
            pass

        def update(self, n):
            self.n += n
            print(f"fake tqdm {self.desc} {self.n}/{self.total}", file=sys.stderr, flush=True)

        def close(self):
            pass
"""


def run_repro(*args, out=None, small=True, env=None, timeout=600):
    """``python -m needle.repro *args`` (after SMALL unless ``small`` is false, and with
    ``--out out`` when given); returns the CompletedProcess, whatever its exit status."""
    cmd = [sys.executable, "-m", "needle.repro", *(SMALL if small else ()), *args]
    if out is not None:
        cmd += ["--out", str(out)]
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout)


def repro_report(tmp_path, *args, **kwargs):
    """Runs the repro (``run_repro``'s arguments) writing to ``tmp_path/out``, asserts that it
    succeeded and returns (the CompletedProcess, {mode: its record in repro.json})."""
    out = tmp_path / "out"
    proc = run_repro(*args, out=out, **kwargs)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = {r["mode"]: r for r in json.loads((out / "repro.json").read_text())}
    return proc, report


def env_with_tqdm(tmp_path, installed):
    """This process's environment with a ``tqdm`` package first on the path: one whose import
    fails (``installed`` false: tqdm is not there) or the stand-in above."""
    package = tmp_path / "tqdm_path" / "tqdm"
    package.mkdir(parents=True)
    if installed:
        (package / "__init__.py").write_text("")
        (package / "auto.py").write_text(textwrap.dedent(_FAKE_TQDM))
    else:
        (package / "__init__.py").write_text("raise ImportError('tqdm is not installed')\n")
    path = [str(package.parent)] + [p for p in [os.environ.get("PYTHONPATH")] if p]
    return dict(os.environ, PYTHONPATH=os.pathsep.join(path))
