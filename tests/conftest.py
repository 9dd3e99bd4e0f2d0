"""pytest configuration for needle's array-layer tests.

Deliberately light: it registers the markers the suite uses and, with
``NEEDLE_REQUIRE_CUDA=1``, fails every test marked ``cuda`` when CUDA is unavailable
(instead of letting it skip), with needle's reason in the message; and it holds the
``host_rng`` fixture. Shared parametrisation lives in ``devices.py`` (importable because
pytest puts this directory on ``sys.path``; ``tests/`` has no ``__init__.py``).

The skips are summed up by reason at the end of a run (``pytest_terminal_summary``): on a
machine without a GPU a thousand CUDA cases skip for one reason, and ``-rs``'s line per test
location would bury the failures above the result (pyproject.toml's addopts report failures
and errors, ``-rfE``; pass ``-rs`` for every skip's location).
"""

import collections
import os

import pytest

_REQUIRE_CUDA_TEXT = os.environ.get("NEEDLE_REQUIRE_CUDA", "").strip()
REQUIRE_CUDA = _REQUIRE_CUDA_TEXT == "1"


def pytest_configure(config):
    if _REQUIRE_CUDA_TEXT not in ("", "0", "1"):
        # A typo here would quietly turn the GPU run's failures back into skips.
        raise pytest.UsageError(
            f"NEEDLE_REQUIRE_CUDA={_REQUIRE_CUDA_TEXT!r}: expected 1 (CUDA tests fail without "
            "a usable GPU) or 0 (they skip, the default)"
        )
    config.addinivalue_line(
        "markers", "cuda: test needs the CUDA backend (built and a GPU present)"
    )
    config.addinivalue_line(
        "markers",
        "paced: asserts what the collection pacer decides, which depends on how long "
        "collections take (deselected under the sanitizer build, which is several times slower)",
    )


# tryfirst, and registered after pytest's skipping plugin (whose setup hook is tryfirst
# too), so this runs before a `skipif(no GPU)` mark can turn the test into a skip.
@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    if not REQUIRE_CUDA or item.get_closest_marker("cuda") is None:
        return
    import needle as ndl

    reason = ndl.cuda.unavailable_reason()
    if reason is not None:
        pytest.fail(f"NEEDLE_REQUIRE_CUDA=1 but CUDA is unavailable: {reason}", pytrace=False)


@pytest.fixture
def host_rng():
    """Runs the test with NumPy's draws on every device (needle.random's "host" mode),
    for tests that compare values with the course's after seeding NumPy: on CUDA devices
    the default is the device generator, whose values are not NumPy's."""
    import needle as ndl

    with ndl.random.rng_mode("host"):
        yield


def _skip_reason(report):
    """The reason a skipped report gives, as ``-rs`` prints it."""
    longrepr = report.longrepr
    # (path, line, "Skipped: reason"); an xdist worker's report arrives with it as a list
    reason = longrepr[2] if isinstance(longrepr, (tuple, list)) and len(longrepr) == 3 else longrepr
    return str(reason).removeprefix("Skipped: ")


def pytest_terminal_summary(terminalreporter):
    """One line per distinct skip reason, most frequent first, with its count. Under
    pytest-xdist the workers' reports reach the controller's reporter, so the counts are
    the whole run's."""
    counts = collections.Counter(
        _skip_reason(report) for report in terminalreporter.stats.get("skipped", [])
    )
    if not counts:
        return
    terminalreporter.write_sep("=", "skips by reason")
    for reason, count in sorted(counts.items(), key=lambda item: (-item[1], item[0])):
        terminalreporter.write_line(f"{count} skipped: {reason}")
