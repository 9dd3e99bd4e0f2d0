"""needle.memory.holders() and release_notebook_references(): who holds device memory (names,
IPython's output cache, the last exception's frames) and letting go of what a notebook keeps.

Each case runs in a fresh interpreter (a script, or an IPython shell driven in-process), since
holders() reads ``__main__``, ``sys.last_*`` and the shell, which pytest's own process shares.
"""

import os
import subprocess
import sys
import textwrap

import pytest

import needle as ndl

from devices import DEVICES

pytest.importorskip("IPython")


def run(code, device):
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(sys.path)
    env.pop("NEEDLE_MEMORY_LIMIT", None)
    prelude = f"import numpy as np, needle as ndl\nDEV = ndl.{device.name}()\n"
    out = subprocess.run(
        [sys.executable, "-c", prelude + textwrap.dedent(code)],
        env=env,
        capture_output=True,
        text=True,
    )
    assert out.returncode == 0, out.stderr
    return out.stdout


SCRIPT = """
    import sys
    def ones(n):
        return ndl.Tensor(np.ones((n, n), np.float32), device=DEV, requires_grad=True)
    x = ones(64)                      # 16384 bytes
    y = (x * 2).sum()                 # 4 bytes, with x * 2 (16384) and x behind it
    model = ndl.nn.Linear(8, 4, device=DEV)
    unrelated = [1, 2.0, "three"]
    def f(a):
        big = ones(128) * 3           # 65536 bytes, with its input (65536)
        raise RuntimeError("boom")
    try:
        f(x)
    except RuntimeError:
        sys.last_type, sys.last_value, sys.last_traceback = sys.exc_info()
    line = f.__code__.co_firstlineno + 2
    for r in ndl.memory.holders():
        print(r["holder"], r["kind"], r["bytes"], r["tensors"], r["graph_tensors"])
    print("line", line)
    print("on other device", len(ndl.memory.holders(device="cpu_numpy")))
    print("freed", ndl.memory.release_notebook_references())
    print("after", [(r["holder"], r["bytes"]) for r in ndl.memory.holders()])
    print("last", sys.last_traceback, sys.last_value)
    print("allocated", ndl.memory.memory_allocated(DEV))
"""


@pytest.mark.parametrize("device", DEVICES)
def test_holders_outside_ipython(device):
    out = run(SCRIPT, device).splitlines()
    line = int(out[4].split()[1])
    assert out[:4] == [
        f"traceback: f (<string>:{line}) traceback 147456 3 1",
        "y global 32772 3 2",
        "x global 16384 1 0",
        "model global 144 2 0",
    ]
    assert out[5] == "on other device 0"
    assert out[6] == "freed 131072"  # big and its input; x is still named
    assert out[7] == "after [('y', 32772), ('x', 16384), ('model', 144)]"
    assert out[8] == "last None None"
    assert out[9] == f"allocated {16384 + 4 + 16384 + 144}"


SHELL = """
    import sys
    from IPython.core.interactiveshell import InteractiveShell
    shell = InteractiveShell.instance()
    cells = [
        "import numpy as np, needle as ndl",
        f"DEV = ndl.{DEVICE}()",
        "x = ndl.Tensor(np.ones((64, 64), np.float32), device=DEV, requires_grad=True)",
        "x * 2",
        "def f(a):\\n    big = ndl.Tensor(np.ones((128, 128), np.float32), device=DEV) * 3\\n"
        "    raise RuntimeError('boom')",
        "f(x)",
        "kept = 1",
    ]
    for cell in cells:
        shell.run_cell(cell, store_history=True)
    rows = ndl.memory.holders()
    print("ROWS", [(r["holder"].split(" (")[0], r["kind"], r["bytes"]) for r in rows])
    print("FREED", ndl.memory.release_notebook_references())
    print("AFTER", [(r["holder"], r["bytes"]) for r in ndl.memory.holders()])
    ns = shell.user_ns
    print("CACHE", dict(ns["Out"]), ns["_"], "_4" in ns, "_4" in shell.user_ns_hidden)
    print("NAMES", ns["kept"], type(ns["x"]).__name__, sys.last_traceback)
    print("ALLOCATED", ndl.memory.memory_allocated(DEV))
"""


@pytest.mark.parametrize("device", DEVICES)
def test_holders_and_release_in_an_ipython_shell(device):
    out = run("DEVICE = DEV.name\n" + textwrap.dedent(SHELL), device)
    keys = ("ROWS", "FREED", "AFTER", "CACHE", "NAMES", "ALLOCATED")
    lines = dict(line.split(" ", 1) for line in out.splitlines() if line.startswith(keys))
    assert lines["ROWS"] == (
        "[('traceback: f', 'traceback', 147456), ('Out[4]', 'output_cache', 32768), "
        "('x', 'name', 16384)]"
    )
    assert lines["FREED"] == str(131072 + 16384)  # big, its input, and x * 2
    assert lines["AFTER"] == "[('x', 16384)]"
    assert lines["CACHE"] == "{}  False False"
    assert lines["NAMES"] == "1 Tensor None"
    assert lines["ALLOCATED"] == "16384"


def test_holders_bad_device():
    with pytest.raises((ValueError, TypeError)):
        ndl.memory.holders(device="tpu")
    with pytest.raises(TypeError):
        ndl.memory.holders(device=3.5)
