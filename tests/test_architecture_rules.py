"""docs/architecture.md rule 4, "one unproductive-trim floor": the C core's UNPRODUCTIVE_BELOW is
the only such constant; the process totals and the policy's default min_release both use it."""

from __future__ import annotations

import ast
from pathlib import Path

from memreclaim import _accounting, _core
from memreclaim.policy import PacingPolicy

PACKAGE = Path(__file__).resolve().parent.parent / "src" / "memreclaim"


def test_the_policy_and_the_totals_share_the_c_floor() -> None:
    assert _core.UNPRODUCTIVE_BELOW == 1 << 20
    assert PacingPolicy(limit=None).min_release == _core.UNPRODUCTIVE_BELOW
    assert _accounting.UNPRODUCTIVE_BELOW is _core.UNPRODUCTIVE_BELOW


def test_no_python_module_defines_its_own_unproductive_floor() -> None:
    defined = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            targets = node.targets if isinstance(node, ast.Assign) else []
            if isinstance(node, ast.AnnAssign):
                targets = [node.target]
            for target in targets:
                if isinstance(target, ast.Name) and "UNPRODUCTIVE" in target.id:
                    value = ast.unparse(node.value) if node.value is not None else ""
                    if value != "_core.UNPRODUCTIVE_BELOW":
                        defined.append(f"{path.relative_to(PACKAGE)}: {target.id} = {value}")
    assert defined == [], defined
