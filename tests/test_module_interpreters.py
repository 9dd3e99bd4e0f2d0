"""needle_c declares that it does not support subinterpreters (issue 24): needle keeps
process-wide state (the engine's devices and caches, the scoped collector's registry, the
collection policy), so its module carries Py_mod_multiple_interpreters =
Py_MOD_MULTIPLE_INTERPRETERS_NOT_SUPPORTED (needle_c/module.c), and importing it in a
subinterpreter fails cleanly with ImportError while the main interpreter's needle goes on
working. The slot exists from Python 3.12; on 3.11 the test is skipped.
"""

import os
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.skipif(
    sys.version_info < (3, 12),
    reason="Py_mod_multiple_interpreters and the subinterpreter API exist from Python 3.12",
)


def test_a_subinterpreter_import_fails_cleanly(tmp_path):
    out = tmp_path / "subinterpreter.txt"
    script = textwrap.dedent(
        f"""
        import sys
        import numpy as np
        import needle as ndl
        try:
            import _interpreters as interpreters  # 3.13 and later
        except ImportError:
            import _xxsubinterpreters as interpreters  # 3.12

        inner = '''
        import sys
        sys.path[:] = {sys.path!r}
        try:
            import needle_c
            result = "imported"
        except ImportError as e:
            result = "ImportError: " + str(e)
        with open({str(out)!r}, "w") as f:
            f.write(result)
        '''
        interp = interpreters.create()
        try:
            interpreters.run_string(interp, inner)
        finally:
            interpreters.destroy(interp)
        x = ndl.Tensor(np.ones((2, 3), np.float32))
        assert (x + 1).sum().numpy().item() == 12.0
        print("main ok")
        """
    )
    proc = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=120,
        env=os.environ.copy(),
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip() == "main ok"
    result = out.read_text()
    assert result.startswith("ImportError: "), result
    assert "needle_c" in result and "subinterpreter" in result, result
