"""The end of a test run: pyproject.toml's addopts list failures and errors (``-rfE``), not
every skip, and tests/conftest.py prints one line per distinct skip reason with its count,
also under pytest-xdist, whose workers' skip reports reach the controller's reporter.

Inner runs are subprocesses over a generated suite, with this repository's conftest.py and
pytest options copied in."""

import importlib.util
import re
import tomllib
from pathlib import Path

import pytest

pytest_plugins = ["pytester"]

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent

SUITE = {
    "test_many": """
        import pytest

        NO_GPU = pytest.mark.skipif(True, reason="CUDA unavailable: no GPU here")

        @NO_GPU
        @pytest.mark.parametrize("k", range(5))
        def test_on_the_gpu(k):
            pass

        def test_skips_while_running():
            pytest.skip("no MPI")

        @pytest.mark.skip(reason="no MPI")
        def test_marked():
            pass

        @pytest.mark.xfail(reason="known bug")
        def test_expected_to_fail():
            assert False

        def test_passes():
            pass

        def test_fails():
            assert 1 == 2
    """,
    "test_whole_module": """
        import pytest

        pytest.skip("needs a compiler", allow_module_level=True)

        def test_never_collected():
            pass
    """,
}

XDIST = pytest.mark.skipif(
    importlib.util.find_spec("xdist") is None, reason="pytest-xdist is not installed"
)


@pytest.fixture
def suite(pytester):
    options = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]
    pytester.makepyprojecttoml(
        f"[tool.pytest.ini_options]\naddopts = {options['ini_options']['addopts']!r}\n"
    )
    pytester.makeconftest((TESTS / "conftest.py").read_text())
    pytester.makepyfile(**SUITE)
    return pytester


@pytest.mark.parametrize("args", [(), pytest.param(("-n", "2"), marks=XDIST)], ids=["one", "xdist"])
def test_skips_are_summed_up_by_reason(suite, args):
    result = suite.runpytest_subprocess("-p", "no:cacheprovider", *args)
    out = result.stdout.str()
    result.assert_outcomes(passed=1, failed=1, skipped=8, xfailed=1)
    lines = out.splitlines()
    start = next(k for k, line in enumerate(lines) if re.match(r"=+ skips by reason =+$", line))
    # most frequent first; a module skipped whole counts once; xfail is not a skip
    assert lines[start + 1 : start + 4] == [
        "5 skipped: CUDA unavailable: no GPU here",
        "2 skipped: no MPI",
        "1 skipped: needs a compiler",
    ]
    assert "skipped:" not in lines[start + 4]
    # the short summary lists the failure, not the skips, and the result line comes last
    assert "FAILED test_many.py::test_fails - assert 1 == 2" in out
    assert "SKIPPED [" not in out
    assert start < lines.index("FAILED test_many.py::test_fails - assert 1 == 2")


def test_no_skips_print_no_section(pytester):
    pytester.makeconftest((TESTS / "conftest.py").read_text())
    pytester.makepyfile(test_plain="def test_passes():\n    pass\n")
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=1)
    assert "skips by reason" not in result.stdout.str()
