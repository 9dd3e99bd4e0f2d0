"""Shared by the pytest plugin's tests (test_plugin.py, test_plugin_peak.py): reading a
pytester run's report, where the plugin's failure messages are checked line by line."""

import re


def source_line(source, tag):
    """The 1-based line of ``source`` (as makepyfile writes it) that carries ``tag``."""
    lines = source.strip().splitlines()
    return next(i for i, line in enumerate(lines, 1) if tag in line)


def failure_section(out, test_name):
    """The text of ``test_name``'s entry in the FAILURES section of a pytest run."""
    match = re.search(rf"_+ {test_name} _+\n(.*?)(?=\n_{{3,}} \w|\n=+ )", out, re.S)
    assert match, f"no failure section for {test_name}"
    return match.group(1)
