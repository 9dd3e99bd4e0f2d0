"""The one table of NEEDLE_* variables (csrc/config.h, ``needle_c._config_table()``):
docs/environment.md's table is the table, every NEEDLE_* variable the sources read is in it (and
nothing it lists is read nowhere), the readers go through it, its defaults are the code's, and
the bad values found by trying them are each a ValueError naming the variable or argument (in a
fresh interpreter per variable, as tests/test_environment.py does).
"""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from test_environment import probe, refused, run_probe

import needle as ndl
import needle_c
from needle import _environ
from needle.distributed import _group
from needle.memory import alloc_conf

ROOT = Path(__file__).resolve().parent.parent
TABLE = _environ.VARIABLES
MiB = 2**20


# --------------------------------------------------------------- the table itself


def test_rows_are_well_formed():
    rows = needle_c._config_table()
    assert len(rows) == len(TABLE)  # no name twice
    for row in TABLE.values():
        assert re.fullmatch(r"NEEDLE_[A-Z0-9_]+", row.name), row
        assert row.section in ("run", "build", "test"), row
        kinds = (
            "count",
            "choice",
            "switch",
            "number",
            "size",
            "library",
            "capability",
            "list",
            "path",
        )
        assert row.kind in kinds, row
        assert (row.kind == "choice") == bool(row.choices), row
        assert row.lo <= row.hi if row.kind == "count" else row.lo == row.hi == 0, row
        for text in (row.default, row.accepts, row.doc):
            assert text and "\n" not in text and text == text.strip(), row


def test_the_issue_variables_are_listed():
    assert TABLE["NEEDLE_SIM_COMPUTE_CAPABILITY"].default == "9.0"
    assert TABLE["NEEDLE_NUM_THREADS"].kind == "count"
    assert (TABLE["NEEDLE_NUM_THREADS"].lo, TABLE["NEEDLE_NUM_THREADS"].hi) == (1, 256)


# ------------------------------------------------------- docs/environment.md


ENV_PAGE = ROOT / "docs" / "environment.md"


def readme_rows():
    """docs/environment.md's table: {name: (section, default, accepts, doc)}, and its lines as
    written."""
    lines = ENV_PAGE.read_text().splitlines()
    start = lines.index(_environ.README_HEADER[0])
    assert lines[start + 1] == _environ.README_HEADER[1]
    table = []
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        table.append(line)
    rows = {}
    for line in table:
        cells = [c.strip().replace("\\|", "|") for c in re.split(r"(?<!\\)\|", line)[1:-1]]
        assert len(cells) == 5, line
        name = cells[0].strip("`")
        assert name not in rows, f"{name} twice in docs/environment.md"
        rows[name] = tuple(cells[1:])
    return rows, table


def test_the_page_names_every_variable_of_the_table_and_no_other():
    rows, _ = readme_rows()
    assert sorted(set(TABLE) - set(rows)) == [], "in csrc/config.h, not in docs/environment.md"
    assert sorted(set(rows) - set(TABLE)) == [], "in docs/environment.md, not in csrc/config.h"


def test_the_readme_has_no_copy_of_the_table():
    # One place for the table: a second copy in README.md would drift from it unchecked.
    assert _environ.README_HEADER[0] not in (ROOT / "README.md").read_text()


@pytest.mark.parametrize("name", list(TABLE))
def test_page_row_is_the_table_row(name):
    rows, _ = readme_rows()
    row = TABLE[name]
    assert rows[name] == (row.section, row.default, row.accepts, row.doc), (
        f"docs/environment.md's row for {name} differs from csrc/config.h's; "
        f"needle._environ.readme_row gives:\n{_environ.readme_row(row)}"
    )


def test_page_table_is_written_in_the_table_order():
    _, table = readme_rows()
    assert "\n".join(_environ.README_HEADER + tuple(table)) == _environ.readme_table()


# ------------------------------------------------------ what the sources read

SOURCE_DIRS = ("csrc", "needle_c", "python", "tests", "bench")
CODE = (".py", ".c", ".h", ".cu", ".cuh", ".cc", ".inc")
# NEEDLE_* names in the sources that are preprocessor macros setup.py passes with -D, not
# environment variables (each checked below to be used as a macro).
MACROS = {"NEEDLE_WITH_CUDA"}
# Ways a variable is read: a name that is a whole string literal (getenv("NEEDLE_X"),
# os.environ.get("NEEDLE_X"), _environ.read("NEEDLE_X"), a tuple of names a reader loops
# over), a keyword argument (dict(os.environ, NEEDLE_X=...)), a shell expansion.
LITERAL = re.compile(r"""["'](NEEDLE_[A-Z0-9_]*[A-Z0-9])["']""")
KEYWORD = re.compile(r"[(,]\s*(NEEDLE_[A-Z0-9_]*[A-Z0-9])=")
SHELL = re.compile(r"\$\{?(NEEDLE_[A-Z0-9_]*[A-Z0-9])")


def source_files():
    files = [ROOT / "setup.py"]
    for d in SOURCE_DIRS:
        files += [p for p in sorted((ROOT / d).rglob("*")) if p.suffix in CODE + (".sh",)]
    here = Path(__file__).resolve()
    return [p for p in files if p.is_file() and p.resolve() != here and "build" not in p.parts]


def names_read():
    """{name: [files]} of every NEEDLE_* variable the sources read or set."""
    found = {}
    for path in source_files():
        text = path.read_text(errors="replace")
        patterns = (SHELL,) if path.suffix == ".sh" else (LITERAL, KEYWORD)
        for pattern in patterns:
            for name in pattern.findall(text):
                found.setdefault(name, set()).add(str(path.relative_to(ROOT)))
    return found


def test_the_scan_finds_the_readers_it_must():
    found = names_read()
    assert "python/needle/memory/alloc_conf.py" in found["NEEDLE_ALLOC_CONF"]
    assert "setup.py" in found["NEEDLE_STRICT"]
    assert "bench/gpu_validate.sh" in found["NEEDLE_VALIDATE_SUITE"]
    assert "csrc/cuda/sim/sim_runtime.cc" in found["NEEDLE_SIM_COMPUTE_CAPABILITY"]
    assert "tests/conftest.py" in found["NEEDLE_REQUIRE_CUDA"]


def test_every_variable_read_is_in_the_table_and_every_row_is_read():
    found = names_read()
    for macro in MACROS:
        used = [p for p in source_files() if re.search(rf"#if(def)? .*\b{macro}\b", p.read_text())]
        assert used, f"{macro} is listed as a macro but no #ifdef uses it"
    read = set(found) - MACROS
    missing = {name: sorted(found[name]) for name in read - set(TABLE)}
    assert missing == {}, "read but not in csrc/config.h (and docs/environment.md)"
    assert sorted(set(TABLE) - read) == [], "in csrc/config.h but read nowhere"


def test_the_engine_and_the_binding_read_only_through_the_table():
    """getenv("NEEDLE_...") only in the CUDA simulator (a stand-in driver with its own parsers);
    os.environ reads of NEEDLE_* in needle's Python only in _environ.py."""
    for path in source_files():
        rel = str(path.relative_to(ROOT))
        text = path.read_text(errors="replace")
        if rel.startswith(("csrc/", "needle_c/")) and not rel.startswith("csrc/cuda/sim/"):
            assert 'getenv("NEEDLE_' not in text, rel
        if rel.startswith("python/needle/") and rel != "python/needle/_environ.py":
            assert not re.search(r"environ(\.get)?\(?\[?[\"']NEEDLE_", text), rel


def test_read_refuses_names_outside_the_table():
    with pytest.raises(LookupError, match="NEEDLE_NOT_A_VARIABLE is not in needle's table"):
        _environ.read("NEEDLE_NOT_A_VARIABLE")
    with pytest.raises(LookupError, match="read by build"):
        _environ.read("NEEDLE_STRICT")
    with pytest.raises(LookupError, match="not a switch"):
        _environ.switch("NEEDLE_NUM_THREADS", None)


# ------------------------------------------------------- defaults are the code's


def test_defaults_are_the_code_defaults():
    defaults = needle_c._gc_policy_defaults()
    assert float(TABLE["NEEDLE_GC_GROWTH"].default) == defaults["growth"]
    assert ndl.memory.parse_size(TABLE["NEEDLE_GC_MIN_GROWTH"].default) == defaults["min_growth"]
    assert float(TABLE["NEEDLE_GC_HIGH_WATER"].default) == defaults["high_water"]
    assert float(TABLE["NEEDLE_GC_MAX_FRACTION"].default) == defaults["max_gc_fraction"]
    assert TABLE["NEEDLE_GC"].default == "1" and defaults["enabled"] is True
    assert float(TABLE["NEEDLE_DIST_TIMEOUT"].default) == _group.DEFAULT_TIMEOUT_S
    assert f"above {alloc_conf._MIN_SPLIT_MB}" in TABLE["NEEDLE_ALLOC_CONF"].accepts


def test_thread_bounds_are_the_setter_bounds():
    row = TABLE["NEEDLE_NUM_THREADS"]
    before = needle_c._num_threads()
    try:
        needle_c._set_num_threads(row.hi)
        assert needle_c._num_threads() == row.hi
        with pytest.raises(ValueError, match=f"1 to {row.hi}"):
            needle_c._set_num_threads(row.hi + 1)
    finally:
        needle_c._set_num_threads(before)


# ----------------------------------------------------- one parser per variable


@pytest.mark.parametrize("value, threads", [(" 3 ", 3), ("007", 7), ("256", 256)])
def test_num_threads_one_parser(value, threads):
    assert probe(NEEDLE_NUM_THREADS=value)["threads"] == threads


@pytest.mark.parametrize("value", ["+3", "0x10", "3 4", "1e2"])
def test_num_threads_values_neither_parser_takes(value):
    refused("NEEDLE_NUM_THREADS", value, "a thread count from 1 to 256")


# ------------------------------------------------------------ the bad values

HUGE = "99999999999999999999"


def test_alloc_conf_overflow_is_a_value_error_naming_the_variable():
    refused("NEEDLE_ALLOC_CONF", f"max_split_size_mb:{HUGE}", "max_split_size_mb must be")


def test_set_allocator_settings_overflow_names_the_option():
    before = ndl.memory.get_allocator_settings("cpu")
    with pytest.raises(ValueError, match=f"max_split_size_mb .* got '{HUGE}'"):
        ndl.memory.set_allocator_settings(f"max_split_size_mb:{HUGE}")
    largest = (2**63 - 1) // MiB
    with pytest.raises(ValueError, match="at most"):
        ndl.memory.set_allocator_settings(f"max_split_size_mb:{largest + 1}")
    assert ndl.memory.get_allocator_settings("cpu") == before
    try:  # the largest that fits is taken
        ndl.memory.set_allocator_settings(f"cpu:max_split_size_mb:{largest}")
        assert ndl.memory.get_allocator_settings("cpu")["max_split_size_mb"] == largest
    finally:
        ndl.memory.set_allocator_settings("cpu:max_split_size_mb:None")


@pytest.mark.parametrize("argument", ["min_growth", "watermark"])
def test_set_gc_policy_overflow_names_the_argument(argument):
    before = ndl.memory.get_gc_policy()
    for value in (2**70, 2**63, f"{2**70}"):
        with pytest.raises(ValueError, match=f"{argument} must be at most"):
            ndl.memory.set_gc_policy(**{argument: value})
    assert ndl.memory.get_gc_policy() == before


@pytest.mark.parametrize("name", ["NEEDLE_GC_MIN_GROWTH", "NEEDLE_GC_WATERMARK"])
def test_gc_size_overflow_names_the_variable(name):
    refused(name, HUGE, "must be at most")


@pytest.mark.parametrize(
    "value",
    [
        "cpu=1GiB,cpu=2GiB",
        "cpu=1GiB,cpu=1GiB",
        "cpu_numpy=1GiB,cpu=1GiB,cpu_numpy=2GiB",
        "cuda=1GiB,cuda:0=2GiB",  # one device twice, whether or not it is usable
    ],
)
def test_memory_limit_names_each_device_once(value):
    refused("NEEDLE_MEMORY_LIMIT", value, "both limit", "each device named once")


@pytest.mark.parametrize(
    "value",
    [
        "max_split_size_mb:128,max_split_size_mb:256",
        "garbage_collection_threshold:0.5,garbage_collection_threshold:0.5",
        "cpu:max_split_size_mb:128,max_split_size_mb:256",
        "max_split_size_mb:128,cuda:max_split_size_mb:256",
        "cuda:garbage_collection_threshold:0.5,cuda:garbage_collection_threshold:0.6",
    ],
)
def test_alloc_conf_sets_each_option_once_per_kind(value):
    refused("NEEDLE_ALLOC_CONF", value, "both set", "each option once per device kind")
    before = ndl.memory.get_allocator_settings("cpu")
    with pytest.raises(ValueError, match="both set"):
        ndl.memory.set_allocator_settings(value)
    assert ndl.memory.get_allocator_settings("cpu") == before  # nothing applied


def test_alloc_conf_one_option_per_kind_is_taken():
    out = run_probe(NEEDLE_ALLOC_CONF="cpu:max_split_size_mb:128,cuda:max_split_size_mb:256")
    assert out.returncode == 0, out.stderr[-2000:]


@pytest.mark.parametrize("value", ["0", "0MiB", "0 B", "0KiB"])
def test_gc_watermark_zero_is_refused(value):
    refused("NEEDLE_GC_WATERMARK", value, "would collect before every allocation")


def test_cuda_limit_where_no_gpu_can_be_used():
    """cuda= on a build without CUDA (or where no GPU is found) applies to nothing: a
    RuntimeWarning naming the variable says so, and the other limits apply. With a GPU it
    applies, with no warning."""
    value = "cpu=1GiB,cuda=256MiB"
    proc = run_probe(NEEDLE_MEMORY_LIMIT=value)
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = probe(NEEDLE_MEMORY_LIMIT=value)
    assert out["cpu"] == 2**30
    warning = (
        f"RuntimeWarning: NEEDLE_MEMORY_LIMIT={value!r}: the limit on cuda() applies to nothing"
    )
    if out["cuda"]:
        assert out["cuda_limit"] == 256 * MiB
        assert warning not in proc.stderr
    elif not needle_c._cuda_compiled():
        assert f"{warning}: this needle was built without CUDA" in proc.stderr, proc.stderr
    else:
        assert f"{warning}: no GPU can be used" in proc.stderr, proc.stderr


def test_cuda_limit_is_checked_where_no_gpu_can_be_used():
    refused("NEEDLE_MEMORY_LIMIT", "cpu=1GiB,cuda=lots", "cannot parse memory size 'lots'")


def test_cuda_limit_of_a_missing_ordinal_warns():
    last = needle_c.MAX_CUDA_DEVICES - 1
    if needle_c.cuda(last).enabled():
        pytest.skip(reason="every CUDA ordinal is a usable device here")
    proc = run_probe(NEEDLE_MEMORY_LIMIT=f"cuda:{last}=1GiB")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert f"the limit on cuda({last}) applies to nothing" in proc.stderr, proc.stderr


def test_a_warning_made_an_error_stops_the_import():
    """Under -W error the warning is the import's error, still naming the variable."""
    if needle_c.cuda(0).enabled():
        pytest.skip(reason="a GPU is usable here: a cuda limit applies")
    env = {k: v for k, v in os.environ.items() if not k.startswith("NEEDLE_")}
    env["NEEDLE_MEMORY_LIMIT"] = "cuda=1GiB"
    paths = [os.path.dirname(needle_c.__file__), os.path.dirname(os.path.dirname(ndl.__file__))]
    env["PYTHONPATH"] = os.pathsep.join(paths)
    proc = subprocess.run(
        [sys.executable, "-W", "error::RuntimeWarning", "-c", "import needle"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode != 0
    assert "RuntimeWarning: NEEDLE_MEMORY_LIMIT='cuda=1GiB'" in proc.stderr.splitlines()[-1]


@pytest.mark.cuda
@pytest.mark.skipif(not needle_c._cuda_simulated(), reason="needs the CUDA simulator")
def test_cuda_limit_on_a_cuda_build_whose_gpu_cannot_be_used():
    """A CUDA build whose only GPU has no code in it (the simulator reporting sm_70 to a CUDA 13
    build): the cuda limit applies to nothing, and the warning says why, with CUDA's reason."""
    value = "cpu=1GiB,cuda=256MiB"
    proc = run_probe(NEEDLE_MEMORY_LIMIT=value, NEEDLE_SIM_COMPUTE_CAPABILITY="7.0")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert (
        f"RuntimeWarning: NEEDLE_MEMORY_LIMIT={value!r}: the limit on cuda() applies to nothing: "
        "no GPU can be used (GPU 0 (needle CUDA simulator (CPU)): needle was built for"
    ) in proc.stderr, proc.stderr
