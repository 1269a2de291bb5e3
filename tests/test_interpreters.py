"""The module under subinterpreters, and a fresh import in a child process."""

from __future__ import annotations

import subprocess
import sys

import pytest


def test_import_in_a_subinterpreter() -> None:
    # Run in a child: a subinterpreter shares the process, and a crash must fail this test only.
    code = """
import _xxsubinterpreters as interpreters
import memreclaim
interp = interpreters.create()
interpreters.run_string(interp, '''
import memreclaim
assert memreclaim.rss() > 0
assert memreclaim.trim().allocator == memreclaim.allocator()
assert memreclaim.stats().rss > 0
''')
interpreters.destroy(interp)
interp = interpreters.create()
interpreters.run_string(interp, 'import memreclaim; memreclaim.rss()')
interpreters.destroy(interp)
print("ok", memreclaim.rss() > 0)
"""
    if sys.version_info >= (3, 13):
        pytest.skip("_xxsubinterpreters is gone in 3.13; covered by 3.11 CI")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "ok True"
