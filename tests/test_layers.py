"""The package's layers, as docs/architecture.md states them, against the imports in the code.

docs/architecture.md has a table under "## Layers" whose rows go from the top layer down and
whose second column names every module of the package (`memreclaim.x`, `memreclaim.x.y`, a
folder as `x/`). This test fails when a module is missing from the table, when the table names a
module that does not exist, or when a module imports (at its top or inside a function) from a
layer above its own.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "src" / "memreclaim"
DOC = ROOT / "docs" / "architecture.md"
C_MODULES = ("_core", "_pools")


def _modules() -> set[str]:
    names = {f"memreclaim.{name}" for name in C_MODULES}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        names.add(".".join(parts))
    return names


def _layers() -> list[tuple[str, list[str]]]:
    text = DOC.read_text()
    section = text.split("\n## Layers", 1)[1].split("\n## ", 1)[0]
    rows = []
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) < 2 or set(cells[0]) <= set("-: ") or cells[0] == "layer":
            continue
        rows.append((cells[0], re.findall(r"`([^`]+)`", cells[1])))
    return rows


def _rank() -> dict[str, int]:
    """Module -> layer index, 0 the bottom."""
    rank: dict[str, int] = {}
    layers = _layers()
    for index, (_, names) in enumerate(reversed(layers)):
        for name in names:
            rank[name if name.startswith("memreclaim") else f"memreclaim.{name}"] = index
    return rank


def _layer_of(module: str, rank: dict[str, int]) -> int | None:
    """The layer of a module: its own row, or the row of the package folder it sits in (the
    top-level package's row counts for itself only)."""
    if module in rank:
        return rank[module]
    parts = module.split(".")[:-1]
    while len(parts) > 1:
        name = ".".join(parts)
        if name in rank:
            return rank[name]
        parts.pop()
    return None


def _type_only(tree: ast.Module) -> set[int]:
    """ids of the import nodes under `if TYPE_CHECKING:` (names for the type checker alone)."""
    ids: set[int] = set()
    for node in ast.walk(tree):
        if not isinstance(node, ast.If):
            continue
        if isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING":
            ids.update(id(n) for stmt in node.body for n in ast.walk(stmt))
    return ids


def _imports(path: Path, module: str) -> set[str]:
    """Every memreclaim module `module` imports, at any depth of its code."""
    tree = ast.parse(path.read_text())
    package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    found: set[str] = set()
    skip = _type_only(tree)
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("memreclaim"))
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if not target.startswith("memreclaim"):
                continue
            found.add(target)
            for alias in node.names:  # `from . import glibc`: a module, when one has that name
                found.add(f"{target}.{alias.name}")
    return found


def test_architecture_names_every_module() -> None:
    rank = _rank()
    modules = _modules()
    missing = sorted(m for m in modules if _layer_of(m, rank) is None)
    assert not missing, f"docs/architecture.md's layer table does not name: {missing}"
    unknown = sorted(
        name
        for name in rank
        if name not in modules and not any(m.startswith(name + ".") for m in modules)
    )
    assert not unknown, f"docs/architecture.md names modules that do not exist: {unknown}"


def test_no_module_imports_from_a_layer_above_its_own() -> None:
    rank = _rank()
    modules = _modules()
    wrong = []
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        module = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        own = _layer_of(module, rank)
        for target in sorted(_imports(path, module)):
            if target not in modules and not any(m.startswith(target + ".") for m in modules):
                continue  # `from .x import name`: the name, not a module
            theirs = _layer_of(target, rank)
            if own is not None and theirs is not None and theirs > own:
                wrong.append(f"{module} imports {target}")
    assert not wrong, "imports across the layers docs/architecture.md states:\n" + "\n".join(wrong)
