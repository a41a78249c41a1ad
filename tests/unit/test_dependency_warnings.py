"""A dependency's deprecation warnings go to the debug log once; prebake's own warnings show as before
(issue 49 item 8: torch's FutureWarning at every step shape a bake compiled). In a subprocess: pytest
replaces `warnings.showwarning` around each test, the engine's processes do not."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

from tests.support.baking import REPO

SCRIPT = textwrap.dedent(
    """
    import sys, warnings
    sys.path.insert(0, sys.argv[1])
    import dependency  # a module outside prebake, as torch is
    from prebake.engine.common import logs
    logs.configure()
    for _ in range(3):
        with warnings.catch_warnings():  # as torch's own code does around its compiles: the once-memory resets
            warnings.simplefilter("default")
            dependency.old_api()
            dependency.other_warning()
    warnings.warn_explicit("prebake's own deprecation", FutureWarning, logs.__file__, 1)
    """
)
DEPENDENCY = textwrap.dedent(
    """
    import warnings
    def old_api():
        warnings.warn("`isinstance(treespec, LeafSpec)` is deprecated", FutureWarning, stacklevel=1)
    def other_warning():
        warnings.warn("a real problem", RuntimeWarning, stacklevel=1)
    """
)


def _run(tmp_path, level: str) -> str:
    (tmp_path / "dependency.py").write_text(DEPENDENCY)
    env = {**os.environ, "PYTHONPATH": str(REPO), "PREBAKE_LOG_LEVEL": level}
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(tmp_path)], env=env, cwd=tmp_path, capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stderr


def test_a_dependencys_deprecation_is_not_shown_at_info(tmp_path):
    err = _run(tmp_path, "INFO")
    assert "LeafSpec" not in err
    assert err.count("RuntimeWarning: a real problem") == 3  # other categories as Python shows them
    assert "FutureWarning: prebake's own deprecation" in err


def test_a_dependencys_deprecation_is_in_the_debug_log_once(tmp_path):
    err = _run(tmp_path, "DEBUG")
    lines = [line for line in err.splitlines() if "LeafSpec" in line]
    assert len(lines) == 1 and " DEBUG py.warnings: " in lines[0] and "FutureWarning" in lines[0], err
