"""notebooks/leak_and_fix.ipynb: committed with the outputs of one clean run, and run afresh in
a new kernel: no cell fails, and the course's training loop run inside the kernel shows the leak
(without needle's hook it runs out of memory, above the hook's peak) and the Jupyter section
frees what the kernel kept.

To refresh the committed outputs after editing the notebook:

    PYTHONPATH=<needle_c's build dir>:python python tests/test_notebook.py --update
"""

import json
import os
import pathlib
import re
import sys
import tempfile

import pytest

NOTEBOOK = pathlib.Path(__file__).resolve().parent.parent / "notebooks" / "leak_and_fix.ipynb"
# Two PNG plots and text: a notebook much larger than this carries outputs it should not.
MAX_NOTEBOOK_BYTES = 300_000
RUNS_PREFIX = "in-kernel runs: "


def _execute(nb, workdir):
    """Runs ``nb`` in place in a fresh python3 kernel started in ``workdir``. The kernel inherits
    this process's environment; its PYTHONPATH entries are made absolute, so that a relative
    one (``python``) names this checkout's package, not another needle from the kernel's
    directory's point of view."""
    import nbclient

    entries = [e for e in os.environ.get("PYTHONPATH", "").split(os.pathsep) if e]
    saved = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join(os.path.abspath(e) for e in entries)
    try:
        client = nbclient.NotebookClient(
            nb,
            timeout=600,
            kernel_name="python3",
            record_timing=False,
            resources={"metadata": {"path": str(workdir)}},
        )
        client.execute()
    finally:
        if saved is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = saved


def _code_cells(nb):
    return [cell for cell in nb.cells if cell.cell_type == "code"]


def _stdout(nb):
    return "".join(
        out.get("text", "")
        for cell in _code_cells(nb)
        for out in cell.outputs
        if out.get("output_type") == "stream" and out.get("name") == "stdout"
    )


def _displayed(cell):
    """The text/plain of what a cell displayed (the extension's line, %needle_holders)."""
    return [
        out["data"].get("text/plain", "")
        for out in cell.outputs
        if out.get("output_type") == "display_data"
    ]


def _cell(nb, start, exact=False):
    """The one code cell whose source starts with ``start`` (is ``start``, when exact)."""
    found = [
        cell
        for cell in _code_cells(nb)
        if (cell.source == start if exact else cell.source.startswith(start))
    ]
    assert len(found) == 1, f"{len(found)} cells start with {start!r}"
    return found[0]


def _memory_line(cell):
    lines = [text for text in _displayed(cell) if text.startswith("needle: cpu allocated")]
    assert len(lines) == 1, _displayed(cell)
    return lines[0]


def _output_kinds(cell):
    """What a cell showed, as a set: ``stdout`` and the MIME types of its results (stderr left
    out: a first import of matplotlib may write a font-cache note there)."""
    kinds = set()
    for out in cell.outputs:
        if out.get("output_type") == "stream":
            if out.get("name") == "stdout":
                kinds.add("stdout")
        else:
            kinds.update(f"{out['output_type']}:{mime}" for mime in out.get("data", {}))
    return kinds


def _mib(pattern, text):
    match = re.search(pattern + r" (-?\d+\.\d) MiB", text)
    assert match, f"no line matching {pattern!r} in the notebook's output"
    return float(match.group(1))


def _check_outputs(nb):
    """The assertions that hold for the committed outputs and for a fresh run alike."""
    errors = [
        (i, out.get("ename"), out.get("evalue"))
        for i, cell in enumerate(nb.cells)
        if cell.cell_type == "code"
        for out in cell.outputs
        if out.get("output_type") == "error"
    ]
    assert errors == []
    text = _stdout(nb)
    # 1-2: one backward pass in the course's graph leaves a cycle; the default graph none.
    assert "cycle of 4 tensors" in text and "after find_cycles: 0 bytes" in text
    assert "after del, no collection: 0 bytes" in text
    # 3: the course's loop in the kernel, under the 512 MiB cap set by %env before the import.
    assert "cpu limit from NEEDLE_MEMORY_LIMIT: 512 MiB" in text
    lines = [line for line in text.splitlines() if line.startswith(RUNS_PREFIX)]
    assert len(lines) == 1
    runs = json.loads(lines[0][len(RUNS_PREFIX) :])
    assert set(runs) == {"leak", "hook", "cycle_free"}
    assert runs["leak"]["oom_step"] is not None
    assert runs["hook"]["oom_step"] is None and runs["cycle_free"]["oom_step"] is None
    peaks = {mode: run["peak_allocated_bytes"] for mode, run in runs.items()}
    assert peaks["leak"] > 2 * peaks["hook"]
    assert peaks["hook"] > peaks["cycle_free"] > 0
    # 4: after the out-of-memory error the traceback and the model held the step's memory;
    # releasing them frees it, as %xdel frees what Out and _ kept.
    assert _mib("a full collection freed", text) == 0.0
    held = _mib("held by the traceback and the model:", text)
    after_traceback = _mib("after releasing the traceback:", text)
    assert held > after_traceback > 0
    assert _mib("after dropping the model's attention map:", text) == 0.0
    assert _mib("names deleted, collected:", text) > 0
    assert _mib("after %xdel _:", text) == 0.0
    assert "needle memory summary for cpu()" in text and "live tensors by op" in text
    _check_extension(nb, text)
    # 5: the modes in fresh processes, a line each, without progress lines.
    assert re.search(r"^leak +OOM at step \d+", text, re.MULTILINE)
    repro = "".join(o.get("text", "") for o in _cell(nb, "from needle import repro").outputs)
    assert "  hook        10 steps" in repro and "step 1/10" not in repro
    assert len(repro.splitlines()) < 30
    images = [
        cell for cell in _code_cells(nb) if any("image/png" in k for k in _output_kinds(cell))
    ]
    assert len(images) == 2


def _check_extension(nb, text):
    """%load_ext needle: its line under the cells that moved memory, %needle_holders naming the
    traceback's frame and Out[n], and what release_notebook_references() frees."""
    assert "%load_ext needle" in _cell(nb, "%matplotlib inline").source
    assert _displayed(_cell(nb, "%env")) == []  # before the extension: no line
    # Section 1: the cycle came and went, the line shows the cell's peak.
    assert re.fullmatch(
        r"needle: cpu allocated 0 B \(unchanged\), cell peak 4\.00 MiB, reserved .*",
        _memory_line(_cell(nb, "gc.collect()\ngc.disable()  # switch")),
    )
    # Section 3: the hook's collections during the training cell, counted by the line.
    assert re.search(r"; [1-9]\d* collections ", _memory_line(_cell(nb, "workdir = ")))
    # Section 4: the failed step's memory stays, and the out-of-memory path collected.
    oom = _memory_line(_cell(nb, "corpus, train, model, opt, loss_fn = course_setup"))
    assert re.search(r"\(\+\d+\.\d\d MiB\).*; [1-9]\d* collections ", oom), oom
    [table] = _displayed(_cell(nb, "%needle_holders cpu"))
    rows = table.splitlines()
    assert rows[0].split() == ["holder", "kind", "bytes", "tensors", "graph", "tensors"]
    assert rows[1].startswith("traceback: epoch_general_ptb (") and " traceback " in rows[1]
    assert [r.split()[:2] for r in rows[2:4]] == [["model", "name"], ["opt", "name"]]
    hint = re.fullmatch(
        r"ndl\.memory\.release_notebook_references\(\) frees (\d+\.\d\d) MiB held by the "
        r"last traceback",
        rows[-1],
    )
    assert hint, rows[-1]
    freed = _mib("release_notebook_references\\(\\) freed", text)
    assert abs(freed - float(hint.group(1))) < 0.1 and freed > 100
    # The Out[] section: the displayed loss is Out[n], and only the cache holds its graph.
    n = _cell(nb, "X, y = get_batch(").execution_count
    [table] = _displayed(_cell(nb, "%needle_holders", exact=True))
    rows = table.splitlines()
    assert rows[1].split()[:2] == [f"Out[{n}]", "output_cache"]
    assert re.fullmatch(
        rf"ndl\.memory\.release_notebook_references\(\) frees \d+\.\d\d MiB held by Out\[{n}\]",
        rows[-1],
    ), rows[-1]
    assert "(-" in _memory_line(_cell(nb, "%xdel _"))


def test_committed_notebook_has_the_outputs_of_one_clean_run():
    nbformat = pytest.importorskip("nbformat")
    assert NOTEBOOK.stat().st_size < MAX_NOTEBOOK_BYTES
    nb = nbformat.read(NOTEBOOK, as_version=4)
    cells = _code_cells(nb)
    # Executed once, top to bottom, in one kernel.
    assert [cell.execution_count for cell in cells] == list(range(1, len(cells) + 1))
    _check_outputs(nb)


def test_notebook_runs(tmp_path):
    nbformat = pytest.importorskip("nbformat")
    pytest.importorskip("nbclient")
    pytest.importorskip("ipykernel")
    pytest.importorskip("matplotlib")
    committed = nbformat.read(NOTEBOOK, as_version=4)
    nb = nbformat.read(NOTEBOOK, as_version=4)
    _execute(nb, tmp_path)
    _check_outputs(nb)
    # The committed outputs are this source's: each cell shows the same kinds of output.
    assert [_output_kinds(c) for c in _code_cells(nb)] == [
        _output_kinds(c) for c in _code_cells(committed)
    ]


def _update():
    """Executes the notebook and saves it with its outputs."""
    import nbformat

    nb = nbformat.read(NOTEBOOK, as_version=4)
    with tempfile.TemporaryDirectory() as workdir:
        _execute(nb, workdir)
    _check_outputs(nb)
    nbformat.write(nb, NOTEBOOK)
    print(f"wrote {NOTEBOOK} ({NOTEBOOK.stat().st_size} bytes)")


if __name__ == "__main__":
    if sys.argv[1:] != ["--update"]:
        sys.exit(f"usage: python {sys.argv[0]} --update")
    _update()
