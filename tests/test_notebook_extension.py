"""``%load_ext needle`` (needle/notebook_extension.py): the memory line after each cell, the
``%needle_memory`` and ``%needle_holders`` magics, in a real Jupyter kernel (nbclient) and in a
terminal-style IPython shell (text only).

The kernel test builds its notebook here with nbformat and runs it in a fresh python3 kernel
whose PYTHONPATH names this checkout (tests/test_notebook.py's ``_execute``).
"""

import os
import re
import subprocess
import sys
import textwrap

import pytest

from devices import DEVICES

pytest.importorskip("IPython")

KIB_256 = "256.00 KiB"  # a (256, 256) float32 tensor


def _code(source, tags=()):
    import nbformat

    cell = nbformat.v4.new_code_cell(textwrap.dedent(source).strip())
    if tags:
        cell.metadata["tags"] = list(tags)
    return cell


def _lines(cell):
    """The memory lines a cell displayed: ``[(text/plain, text/html)]``."""
    return [
        (out["data"]["text/plain"], out["data"].get("text/html", ""))
        for out in cell.outputs
        if out.get("output_type") == "display_data"
        and out["data"].get("text/plain", "").startswith("needle: ")
    ]


def _part(text, name):
    """The part of a line about device ``name``."""
    parts = [p for p in text[len("needle: ") :].split(" | ") if p.startswith(name + " ")]
    assert len(parts) == 1, text
    return parts[0]


def _stream(cell, name):
    return "".join(
        out.get("text", "")
        for out in cell.outputs
        if out.get("output_type") == "stream" and out.get("name") == name
    )


def _display_text(cell):
    return "".join(
        out["data"].get("text/plain", "")
        for out in cell.outputs
        if out.get("output_type") == "display_data"
    )


def _display_html(cell):
    return "".join(
        out["data"].get("text/html", "")
        for out in cell.outputs
        if out.get("output_type") == "display_data"
    )


CELLS = [
    ("load", "%load_ext needle\nimport numpy as np, needle as ndl\nDEV = ndl.{device}()", ()),
    (
        "alloc",
        "x = ndl.Tensor(np.ones((256, 256), np.float32), device=DEV, requires_grad=True)",
        (),
    ),
    ("shown", "(x * 2).sum()", ()),
    (
        "define",
        """
        def f(a):
            big = ndl.Tensor(np.ones((128, 128), np.float32), device=DEV) * 3
            raise RuntimeError("boom")
        """,
        (),
    ),
    ("raise", "f(x)", ("raises-exception",)),
    ("holders", "%needle_holders", ()),
    ("holders_other", "%needle_holders cpu_numpy", ()),
    ("release", "freed = ndl.memory.release_notebook_references()\nprint('freed', freed)", ()),
    ("holders_after", "%needle_holders", ()),
    ("off", "%needle_memory off", ()),
    ("silent", "y = ndl.Tensor(np.ones((256, 256), np.float32), device=DEV)", ()),
    ("on", "%needle_memory on", ()),
    ("del", "del y", ()),
    ("quiet", "n = 1 + 1", ()),
    ("bad", "%needle_memory sideways", ("raises-exception",)),
    ("summary", "%needle_memory", ()),
    (
        "twice",
        """
        %load_ext needle
        ndl.load_ipython_extension(get_ipython())  # the function itself, past %load_ext's check
        posts = get_ipython().events.callbacks["post_run_cell"]
        print("callbacks", sum("CellMemoryLine" in cb.__qualname__ for cb in posts))
        """,
        (),
    ),
    ("unload", "%unload_ext needle", ()),
    ("after_unload", "z = ndl.Tensor(np.ones((256, 256), np.float32), device=DEV)", ()),
    ("magic_gone", "%needle_holders", ("raises-exception",)),
]


@pytest.fixture(scope="module")
def kernel_runs():
    """One kernel run per device, made on first use: ``{device name: {cell name: cell}}``."""
    return {}


def _run(device, kernel_runs, tmp_path_factory):
    if device.name not in kernel_runs:
        nbformat = pytest.importorskip("nbformat")
        pytest.importorskip("nbclient")
        pytest.importorskip("ipykernel")
        from test_notebook import _execute

        nb = nbformat.v4.new_notebook()
        names = []
        for name, source, tags in CELLS:
            nb.cells.append(_code(source.replace("{device}", device.name), tags))
            names.append(name)
        _execute(nb, tmp_path_factory.mktemp("kernel"))
        kernel_runs[device.name] = dict(zip(names, nb.cells))
    return kernel_runs[device.name]


def _label(device):
    return "cpu" if device.name == "cpu" else f"cuda:{device.index}"


@pytest.mark.parametrize("device", DEVICES)
def test_line_after_a_cell_that_allocates(device, kernel_runs, tmp_path_factory):
    cells = _run(device, kernel_runs, tmp_path_factory)
    label = _label(device)
    assert _lines(cells["load"]) == []  # loading moved nothing
    [(text, markup)] = _lines(cells["alloc"])
    part = _part(text, label)
    assert re.fullmatch(
        rf"{label} allocated {KIB_256} \(\+{KIB_256}\), cell peak {KIB_256}, "
        r"reserved \d+\.\d\d [KMG]iB",
        part,
    ), part
    assert f"<b>{label}</b> allocated {KIB_256} (+{KIB_256}), cell peak {KIB_256}" in markup
    assert markup.startswith("<div style=") and markup.endswith("</div>")
    # x * 2 (256 KiB) and its sum (4 bytes) stay, kept by Out[n].
    [(text, _)] = _lines(cells["shown"])
    assert _part(text, label).startswith(f"{label} allocated 512.00 KiB (+{KIB_256})")
    # The failed call's big and its input (2 x 64 KiB) stay with the traceback.
    [(text, _)] = _lines(cells["raise"])
    assert _part(text, label).startswith(f"{label} allocated 640.00 KiB (+128.00 KiB)")
    assert any(out["output_type"] == "error" for out in cells["raise"].outputs)
    # A cell that moves no memory shows no line.
    assert _lines(cells["define"]) == [] and _lines(cells["quiet"]) == []


@pytest.mark.parametrize("device", DEVICES)
def test_holders_names_the_output_cache_and_the_traceback(device, kernel_runs, tmp_path_factory):
    cells = _run(device, kernel_runs, tmp_path_factory)
    n = cells["shown"].execution_count
    text = _display_text(cells["holders"])
    rows = [line.split() for line in text.splitlines()]
    assert rows[0] == ["holder", "kind", "bytes", "tensors", "graph", "tensors"]
    assert rows[1] == [f"Out[{n}]", "output_cache", "512.00", "KiB", "3", "2"]
    assert rows[2][0] == "traceback:" and rows[2][1] == "f"
    assert rows[2][-5:] == ["traceback", "384.00", "KiB", "3", "1"]
    assert rows[3] == ["x", "name", "256.00", "KiB", "1", "0"]
    assert text.splitlines()[4] == (
        "ndl.memory.release_notebook_references() frees 384.00 KiB held by "
        f"Out[{n}] and the last traceback"
    )
    markup = _display_html(cells["holders"])
    assert markup.startswith("<table>") and f'<td style="text-align: left">Out[{n}]</td>' in (
        markup
    )
    assert "release_notebook_references() frees 384.00 KiB" in markup
    other = _display_text(cells["holders_other"])
    assert other == "no name, Out[] entry or traceback frame holds a needle tensor on cpu_numpy()"


@pytest.mark.parametrize("device", DEVICES)
def test_release_frees_them(device, kernel_runs, tmp_path_factory):
    cells = _run(device, kernel_runs, tmp_path_factory)
    label = _label(device)
    # x * 2 and its sum (Out[n]), big and its input (the traceback's frame of f).
    assert _stream(cells["release"], "stdout") == f"freed {2 * 65536 + 262144 + 4}\n"
    [(text, _)] = _lines(cells["release"])
    assert _part(text, label).startswith(f"{label} allocated {KIB_256} (-384.00 KiB)")
    rows = _display_text(cells["holders_after"]).splitlines()
    assert [r.split() for r in rows] == [
        ["holder", "kind", "bytes", "tensors", "graph", "tensors"],
        ["x", "name", "256.00", "KiB", "1", "0"],
    ]


@pytest.mark.parametrize("device", DEVICES)
def test_memory_magic_off_on_summary_and_bad_argument(device, kernel_runs, tmp_path_factory):
    cells = _run(device, kernel_runs, tmp_path_factory)
    label = _label(device)
    assert "memory line after each cell is off" in _stream(cells["off"], "stdout")
    assert _lines(cells["silent"]) == []  # y allocated 256 KiB, silently
    assert _lines(cells["on"]) == []
    [(text, _)] = _lines(cells["del"])
    assert _part(text, label).startswith(f"{label} allocated {KIB_256} (-{KIB_256})")
    bad = _stream(cells["bad"], "stderr")
    assert "UsageError: unknown device 'sideways'" in bad
    assert "usage: %needle_memory [on|off|DEVICE]" in bad
    assert _stream(cells["summary"], "stdout").startswith("needle memory summary for cpu()")
    assert _stream(cells["twice"], "stdout").endswith(
        "already loaded. To reload it, use:\n  %reload_ext needle\ncallbacks 1\n"
    )
    assert _lines(cells["after_unload"]) == []
    assert "needle_holders" in _stream(cells["magic_gone"], "stderr")


SHELL = """
import needle

print("ipython imported by needle:", "IPython" in sys.modules)
from IPython.core.interactiveshell import InteractiveShell  # noqa: E402

shell = InteractiveShell.instance()
cells = [
    "%load_ext needle",
    "import numpy as np, needle as ndl",
    "x = ndl.Tensor(np.ones((256, 256), np.float32))",
    "s = (x * 2).sum().numpy()",
    "h = [ndl.Tensor(np.ones((256, 256), np.float32)) for _ in range(2)]",
    "ndl.memory.set_memory_limit('cpu', 1 << 20)",
    "ndl.Tensor(np.ones((1024, 1024), np.float32))",
    "%needle_holders",
    "%needle_holders cuda:99",
    "%needle_memory on off",
    "del h",
    "print('user peak', ndl.memory.max_memory_allocated())",
]
for cell in cells:
    print(">>>", cell)
    shell.run_cell(cell, store_history=True)
"""


def test_terminal_shell_prints_text(tmp_path):
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(sys.path)
    env.pop("NEEDLE_MEMORY_LIMIT", None)
    out = subprocess.run(
        [sys.executable, "-c", "import sys\n" + SHELL],
        env=env,
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert out.returncode == 0, out.stderr
    blocks = {}
    for chunk in out.stdout.split(">>> ")[1:]:
        head, _, body = chunk.partition("\n")
        blocks[head] = body
    assert out.stdout.startswith("ipython imported by needle: False\n")
    assert blocks["%load_ext needle"] == ""
    assert blocks["x = ndl.Tensor(np.ones((256, 256), np.float32))"] == (
        f"needle: cpu allocated {KIB_256} (+{KIB_256}), cell peak {KIB_256}, reserved {KIB_256}\n"
    )
    # A cell that allocated and freed: its own peak, not the process's.
    assert re.fullmatch(
        rf"needle: cpu allocated {KIB_256} \(unchanged\), cell peak 512.00 KiB, "
        r"reserved \d+\.\d\d KiB\n",
        blocks["s = (x * 2).sum().numpy()"],
    )
    assert blocks["h = [ndl.Tensor(np.ones((256, 256), np.float32)) for _ in range(2)]"] == (
        "needle: cpu allocated 768.00 KiB (+512.00 KiB), cell peak 768.00 KiB, "
        "reserved 768.00 KiB\n"
    )
    assert blocks["ndl.memory.set_memory_limit('cpu', 1 << 20)"] == ""
    # 4 MiB past a 1 MiB limit: needle collects before it raises, and the line counts that.
    line = blocks["ndl.Tensor(np.ones((1024, 1024), np.float32))"].splitlines()[-1]
    assert re.fullmatch(
        r"needle: cpu allocated 768.00 KiB \(unchanged\), cell peak 768.00 KiB, "
        r"reserved 768.00 KiB; [1-9]\d* collections? \d+\.\d ms, freed 0 B",
        line,
    ), line
    assert "<div" not in out.stdout and "<table" not in out.stdout  # no HTML in a terminal
    holders = blocks["%needle_holders"].splitlines()
    assert [r.split() for r in holders] == [
        ["holder", "kind", "bytes", "tensors", "graph", "tensors"],
        ["h", "name", "512.00", "KiB", "2", "0"],
        ["x", "name", "256.00", "KiB", "1", "0"],
    ]
    assert "UsageError: %needle_memory takes at most one argument" in out.stderr
    assert "UsageError: invalid CUDA device index 99\nusage: %needle_holders [DEVICE]" in (
        out.stderr
    )
    assert blocks["%needle_holders cuda:99"] == ""
    assert blocks["del h"].startswith(f"needle: cpu allocated {KIB_256} (-512.00 KiB), cell peak")
    # The line's per-cell peaks left the user's peak alone: x and h, three cells back.
    assert blocks["print('user peak', ndl.memory.max_memory_allocated())"] == "user peak 786432\n"


def test_import_needle_imports_no_ipython():
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(sys.path)
    code = (
        "import sys, needle\n"
        "print('IPython' in sys.modules, 'needle.notebook_extension' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert out.stdout == "False False\n", out.stderr
