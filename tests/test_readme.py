"""README.md's and the documentation pages' code runs as written, and docs/design.md names every
source file.

Each fenced ``python`` block of README.md and of every docs/*.md page runs alone in a fresh
interpreter (its own imports, a temporary working directory), so a block that leans on another
block's names or prints nothing useful shows up here; a block marked
``<!-- readme-test: pytest -->`` on the line before it is a test module, run under pytest with
needle's plugin, and must give the outcome the page states. A block that cannot run here (it
needs a GPU, several ranks, the network) is marked ``<!-- docs-test: skip (REASON) -->`` on the
line before it and is listed, with its reason, in ``SKIPPED`` below, so that a skip is a
decision this file records, never a silent one. ``bash`` and untagged blocks are commands, not
run. The design document's file map is checked against the tree (csrc/, needle_c/,
python/needle/) so that it cannot drift as files come and go.
"""

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DESIGN = ROOT / "docs" / "design.md"
# The pages whose python blocks run: the README and every page of the documentation site.
PAGES = [README] + sorted((ROOT / "docs").glob("*.md"))

PYTEST_MARK = "<!-- readme-test: pytest -->"
SKIP_MARK = re.compile(r"^<!-- docs-test: skip \((.+)\) -->$")
# The blocks that do not run here: page -> the reasons of its skip markers, in page order. A
# marker not listed here, or an entry with no marker, fails test_skipped_blocks_are_listed.
SKIPPED = {
    "docs/cuda.md": [
        "needs a GPU: CUDA graphs; tests/test_cuda_graphs.py runs this on the simulator"
    ],
}
# A fence's info string (```python), its body, and the line before it (for the pytest mark).
_FENCE = re.compile(r"^```(\w*)\n(.*?)^```$", re.M | re.S)
# Seconds one block may take: each is a few steps of a tiny model.
_BLOCK_TIMEOUT = 120
# The source files the design document maps, by suffix.
_SOURCE_SUFFIXES = (".c", ".h", ".cu", ".cuh", ".cc", ".inc", ".py")
_SOURCE_DIRS = ("csrc", "needle_c", "python/needle")
# Headers the design document names that are not needle's own.
_EXTERNAL_HEADERS = {"Python.h", "structmember.h"}


def page_blocks(page, name=None):
    """``[(where, kind, source, reason)]`` of a page's python blocks: where is
    ``"docs/x.md:LINE"`` (the fence's line), kind ``"pytest"`` for a block marked as a test
    module, ``"skip"`` for one marked as not runnable here (reason: the marker's), ``"script"``
    otherwise. name: the page's name in ``where`` (default: its path in the checkout)."""
    text = page.read_text()
    rel = name or page.relative_to(ROOT).as_posix()
    blocks = []
    for match in _FENCE.finditer(text):
        if match.group(1) != "python":
            continue
        line = text.count("\n", 0, match.start()) + 1
        before = text[: match.start()].rstrip("\n").rsplit("\n", 1)[-1].strip()
        skip = SKIP_MARK.match(before)
        if before == PYTEST_MARK:
            kind, reason = "pytest", None
        elif skip:
            kind, reason = "skip", skip.group(1)
        else:
            kind, reason = "script", None
        blocks.append((f"{rel}:{line}", kind, match.group(2), reason))
    return blocks


def _env():
    """This process's environment with this checkout's needle first on the path, so a block
    imports the needle under test whether or not it is installed."""
    env = dict(os.environ)
    # Absolute: the blocks run in a temporary directory, where a relative entry (the usual
    # PYTHONPATH=python) would name nothing and an installed needle would be imported instead.
    paths = [os.path.abspath(p) for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    if not any(Path(p).resolve() == (ROOT / "python").resolve() for p in paths):
        # Keep a given path (a build's lib directory) first: it holds the built needle_c.
        paths.append(str(ROOT / "python"))
    env["PYTHONPATH"] = os.pathsep.join(paths)
    env.pop("NEEDLE_MEMORY_LIMIT", None)  # the blocks set their own limits
    env["MPLBACKEND"] = "Agg"
    return env


# The optional dependencies a block may need (the test extra brings both; repro has
# matplotlib, distributed mpi4py). In an environment without one, a block failing on its
# import is skipped with that reason; where it is installed, the block must run.
_OPTIONAL_MODULES = {"matplotlib": "test", "mpi4py": "test"}
_MISSING_MODULE = re.compile(r"^ModuleNotFoundError: No module named '([\w.]+)'", re.M)


def _skip_if_optional_missing(where, proc):
    """Skips the calling test when proc failed on importing an optional dependency that this
    interpreter does not have."""
    if proc.returncode == 0:
        return
    for name in _MISSING_MODULE.findall(proc.stderr):
        top = name.split(".")[0]
        if top in _OPTIONAL_MODULES and importlib.util.find_spec(top) is None:
            extra = _OPTIONAL_MODULES[top]
            pytest.skip(f"{where} needs {top}, not installed (pip install '.[{extra}]')")


def _run(args, cwd):
    return subprocess.run(
        [sys.executable, *args],
        cwd=cwd,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=_BLOCK_TIMEOUT,
    )


BLOCKS = [block for page in PAGES for block in page_blocks(page)]
SCRIPTS = [(where, src) for where, kind, src, _ in BLOCKS if kind == "script"]
PYTEST_BLOCKS = [(where, src) for where, kind, src, _ in BLOCKS if kind == "pytest"]


def test_the_pages_have_the_blocks_this_file_runs():
    # The README's own promise: a runnable first training and the leak; the site's: runnable
    # examples on every topic, one of them a pytest module.
    readme = [where for where, _ in SCRIPTS if where.startswith("README.md:")]
    assert len(readme) >= 2
    assert len(SCRIPTS) >= 20
    assert [where.split(":")[0] for where, _ in PYTEST_BLOCKS] == ["docs/pytest-plugin.md"]
    for where, source in SCRIPTS + PYTEST_BLOCKS:
        assert "import needle" in source or "from needle" in source, where


def test_skipped_blocks_are_listed():
    marked = {}
    for where, kind, _, reason in BLOCKS:
        if kind == "skip":
            marked.setdefault(where.rsplit(":", 1)[0], []).append(reason)
    assert marked == SKIPPED, "docs-test: skip markers and SKIPPED differ"


def test_the_skip_marker_is_read(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("<!-- docs-test: skip (needs a GPU) -->\n```python\nimport needle\n```\n")
    page.write_text(page.read_text() + PYTEST_MARK + "\n```python\nimport needle\n```\n")
    page.write_text(page.read_text() + "```python\nimport needle\n```\n```bash\nls\n```\n")
    blocks = page_blocks(page, "page.md")
    assert blocks == [
        ("page.md:2", "skip", "import needle\n", "needs a GPU"),
        ("page.md:6", "pytest", "import needle\n", None),
        ("page.md:9", "script", "import needle\n", None),
    ]


@pytest.mark.parametrize("where,source", SCRIPTS, ids=[where for where, _ in SCRIPTS])
def test_block_runs_alone(where, source, tmp_path):
    path = tmp_path / "block.py"
    path.write_text(source)
    proc = _run([str(path)], tmp_path)
    _skip_if_optional_missing(where, proc)
    assert proc.returncode == 0, f"{where} failed:\n{proc.stdout}\n{proc.stderr}"
    assert proc.stdout.strip(), f"{where} printed nothing"


def test_a_block_is_skipped_only_for_a_missing_optional_module(monkeypatch):
    def failed(name):
        return subprocess.CompletedProcess(
            [], 1, "", f"ModuleNotFoundError: No module named '{name}'"
        )

    monkeypatch.setitem(_OPTIONAL_MODULES, "needle_no_such_module", "test")
    monkeypatch.setitem(_OPTIONAL_MODULES, "numpy", "test")
    with pytest.raises(pytest.skip.Exception, match=r"page.md:3 needs needle_no_such_module"):
        _skip_if_optional_missing("page.md:3", failed("needle_no_such_module.sub"))
    _skip_if_optional_missing("page.md:3", failed("numpy"))  # installed: the block must run
    _skip_if_optional_missing("page.md:3", failed("some_required_module"))  # not optional
    ok = subprocess.CompletedProcess([], 0, "", "")
    _skip_if_optional_missing("page.md:3", ok)


def _block_at(fragment, page):
    """The script block of ``page`` whose source contains ``fragment`` (its output is checked
    below)."""
    found = [
        source for where, source in SCRIPTS if where.startswith(page + ":") and fragment in source
    ]
    assert len(found) == 1, f"{len(found)} blocks of {page} contain {fragment!r}"
    return found[0]


def test_the_first_training_shows_progress_and_flat_memory(tmp_path):
    path = tmp_path / "train.py"
    path.write_text(_block_at("train_ptb(", "README.md"))
    proc = _run([str(path)], tmp_path)
    assert proc.returncode == 0, proc.stderr
    # progress=True without tqdm: lines on stderr with the step, loss and allocated bytes.
    progress = re.findall(r"train step (\d+)/(\d+)  loss [\d.]+  allocated (.+)", proc.stderr)
    if progress:  # with tqdm installed the bar goes to stderr instead
        assert progress[0][0] == "1" and progress[-1][0] == progress[-1][1]
    else:
        assert "train" in proc.stderr
    assert re.search(r"train: loss [\d.]+, accuracy [\d.]+", proc.stdout)
    assert re.search(r"test:  loss [\d.]+, accuracy [\d.]+", proc.stdout)


def test_the_leak_block_runs_out_then_completes(tmp_path):
    path = tmp_path / "leak.py"
    path.write_text(_block_at("OutOfMemoryError", "README.md"))
    proc = _run([str(path)], tmp_path)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert len(lines) == 3, proc.stdout
    assert re.fullmatch(r"the leak: out of memory with \d+ bytes allocated", lines[0])
    collections = int(re.fullmatch(r"the fix: 100 steps, (\d+) collections", lines[1]).group(1))
    assert collections >= 1
    peak = int(re.fullmatch(r"no cycles: 100 steps, peak (\d+) bytes", lines[2]).group(1))
    assert 0 < peak < 8 * 2**20  # under the limit the leak ran into


def test_the_jupyter_simulation_frees_memory_when_the_error_is_dropped(tmp_path):
    path = tmp_path / "kernel.py"
    path.write_text(_block_at("after clearing sys.last_*", "docs/jupyter.md"))
    proc = _run([str(path)], tmp_path)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "still allocated: 16777216" in out
    assert re.search(r"kernel\.py:\d+ 1 16777216", out), out  # the site of `activations`
    assert "after clearing sys.last_*: 0" in out


def test_the_holders_block_names_the_frame_and_release_frees_it(tmp_path):
    path = tmp_path / "holders.py"
    path.write_text(_block_at("release_notebook_references()", "docs/jupyter.md"))
    proc = _run([str(path)], tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == [
        "traceback: step traceback 786432 3",
        "x global 262144 1",
        "freed 524288",
        "['x']",
    ]


def test_the_memory_report_block_shows_growth_and_a_cycle(tmp_path):
    path = tmp_path / "report.py"
    path.write_text(_block_at("MemoryMonitor()", "docs/memory-report.md"))
    proc = _run([str(path)], tmp_path)
    _skip_if_optional_missing("docs/memory-report.md", proc)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    readings = [int(v) for v in re.findall(r"\d+", lines[0])]
    assert len(readings) == 5 and readings == sorted(set(readings))  # grows every step
    assert re.search(r"report\.py:\d+ \d+ \d+", proc.stdout)
    assert re.search(r"^\d+ tensors, \d+ bytes, \{.*'EWiseMul'", proc.stdout, re.M)
    assert (tmp_path / "memory.csv").stat().st_size > 0
    assert (tmp_path / "memory.png").stat().st_size > 0


def test_the_pytest_example_fails_on_the_leak_and_passes_the_fix(tmp_path):
    (where, source) = PYTEST_BLOCKS[0]
    (tmp_path / "test_memory.py").write_text(source)
    # Load the plugin by its module whether or not needle is installed (the entry point
    # exists only in an installed needle), with autoloading off so it is not loaded twice.
    args = ["-m", "pytest", "-p", "needle.testing", "-p", "no:cacheprovider", "-rf"]
    proc = subprocess.run(
        [sys.executable, *args, "test_memory.py"],
        cwd=tmp_path,
        env={**_env(), "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"},
        capture_output=True,
        text=True,
        timeout=_BLOCK_TIMEOUT,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, f"{where}:\n{out}"
    assert "2 failed, 2 passed" in out, out
    assert "FAILED test_memory.py::test_leaky_step" in out
    assert re.search(r"device memory on cpu \(the default device\) grew by \d+ bytes", out)
    assert "FAILED test_memory.py::test_fixed_step" not in out
    # The culprit is named: the line of the example that made the kept graph, first.
    leak_line = 1 + source.splitlines().index("    loss = (model(x) ** 2).sum()")
    sites = re.findall(r"^  (test_memory\.py:\d+): \d+ tensors?, ", out, re.M)
    assert sites and sites[0] == f"test_memory.py:{leak_line}", out
    assert re.search(r"\d+ x Tensor\(shape=\(32, 8\), dtype=float32, bytes=1024, op=", out)
    assert "FAILED test_memory.py::test_forward_fits" not in out
    # The marker's failure says where the peak was: the backward pass, with the lines whose
    # arrays were live then, each line of the test that allocated.
    assert "FAILED test_memory.py::test_forward_too_big" in out
    lines = source.splitlines()
    peak_line = 1 + lines.index("    y.sum().backward()")
    assert (
        f"  peak at:         test_memory.py:{peak_line} in test_forward_too_big  "
        "(y.sum().backward())\n"
    ) in out, out
    # Read the failure's own section: on a CI machine (CI or BUILD_NUMBER set) pytest repeats
    # each whole message in the short summary, so its lines would be counted twice.
    failure = out.split("short test summary info")[0]
    live = re.findall(r"^    (test_memory\.py:\d+) +\d+ allocations?, \d+ bytes", failure, re.M)
    assert live[0] == f"test_memory.py:{peak_line}", out
    assert sorted(live) == sorted(f"test_memory.py:{peak_line - i}" for i in range(4)), out


# ------------------------------------------------------------------ docs/design.md


def _source_files():
    for top in _SOURCE_DIRS:
        for path in sorted((ROOT / top).rglob("*")):
            if path.suffix in _SOURCE_SUFFIXES and "__pycache__" not in path.parts:
                yield path


def test_design_names_every_source_file():
    design = DESIGN.read_text()
    missing = []
    for path in _source_files():
        rel = path.relative_to(ROOT).as_posix()
        if path.name == "__init__.py":
            # A package is named by its folder (`memory/`), not by its __init__.py.
            if f"{path.parent.name}/" not in design:
                missing.append(rel)
        elif path.name not in design:
            missing.append(rel)
    assert not missing, "docs/design.md does not name: " + ", ".join(missing)


def test_design_names_no_file_that_does_not_exist():
    names = {path.name for path in _source_files()}
    design = DESIGN.read_text()
    mentioned = set(re.findall(r"`([\w./]+\.(?:c|h|cu|cuh|cc|inc))`", design))
    stale = sorted(m for m in mentioned if Path(m).name not in names | _EXTERNAL_HEADERS)
    assert not stale, f"docs/design.md names files that do not exist: {stale}"
