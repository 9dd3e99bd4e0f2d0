"""pytest configuration for needle's array-layer tests.

Deliberately light: it only registers the markers the suite uses. Shared
parametrisation lives in ``devices.py`` (importable because pytest puts this
directory on ``sys.path``; ``tests/`` has no ``__init__.py``).
"""


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "cuda: test needs the CUDA backend (built and a GPU present)"
    )
    config.addinivalue_line(
        "markers",
        "paced: asserts what the collection pacer decides, which depends on how long "
        "collections take (deselected under the sanitizer build, which is several times slower)",
    )
