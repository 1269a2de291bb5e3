"""Which Python modules name a /proc or /sys path in their code (docstrings and messages aside):
docs/architecture.md rule 1 has every /proc figure read by the C core, and the cgroup discovery
(memreclaim.memlimits) is the one Python module that names the kernel's files. The test fails
when any other module names one. KNOWN is for a module that must keep doing so for a while, each
with why (none does); a listed module that no longer names one must leave the list."""

from __future__ import annotations

import ast
import re
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "src" / "memreclaim"
PATH = re.compile(r"^/?(proc|sys)(/|$)")
ALLOWED = {"memlimits.py": "the one cgroup discovery"}
KNOWN: dict[str, str] = {}


def _docstrings(tree: ast.Module) -> set[int]:
    ids: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                ids.add(id(body[0].value))
    return ids


def _paths(source: str) -> list[str]:
    """The string literals of ``source``'s code that start like a /proc or /sys path."""
    tree = ast.parse(source)
    skip = _docstrings(tree)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.JoinedStr) and node.values:
            first = node.values[0]
            if isinstance(first, ast.Constant) and PATH.match(str(first.value)):
                found.append(str(first.value))
        elif (
            isinstance(node, ast.Constant)
            and isinstance(node.value, str)
            and id(node) not in skip
            and PATH.match(node.value)
        ):
            found.append(node.value)
    return found


def test_the_detector_sees_paths_and_skips_docstrings() -> None:
    code = '"""Reads /proc/self/statm."""\nx = open("/proc/self/statm")\ny = f"/proc/{1}/stat"\n'
    assert set(_paths(code)) == {"/proc/self/statm", "/proc/"}
    other = 'z = "sys/kernel/mm"\nmessage = "see /proc/pressure/memory"\n'
    assert _paths(other) == ["sys/kernel/mm"]


def test_only_the_cgroup_discovery_reads_proc_or_sys() -> None:
    readers = {
        str(path.relative_to(PACKAGE)) for path in PACKAGE.rglob("*.py") if _paths(path.read_text())
    }
    unexpected = sorted(readers - set(ALLOWED) - set(KNOWN))
    assert not unexpected, f"Python modules that name a /proc or /sys path: {unexpected}"
    gone = sorted(set(KNOWN) - readers)
    assert not gone, f"no longer read /proc or /sys: take them off KNOWN: {gone}"
