"""The package's functions stay short: no function or method in src/memreclaim over 80 lines
(issue 23), the declarative argparse builder ``cli/__init__.py:build_parser`` up to 110.

Python functions (methods and nested functions included) are measured with ``ast``, from the
``def`` line (decorators aside) to the last line of the body. C functions are the top-level
brace blocks of ``*.c`` and ``*.h`` whose opening brace follows a parameter list; they are
measured from the line of the function's name to its closing brace, with comments, string and
character literals and preprocessor lines skipped while matching braces.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "src" / "memreclaim"
LIMIT = 80
EXCEPTIONS = {("cli/__init__.py", "build_parser"): 110}  # a declarative argparse builder


def python_functions(source: str) -> list[tuple[str, int, int]]:
    """(qualified name, first line, line count) of every function and method in ``source``."""
    found: list[tuple[str, int, int]] = []

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                name = f"{prefix}{child.name}"
                end = child.end_lineno or child.lineno
                found.append((name, child.lineno, end - child.lineno + 1))
                visit(child, f"{name}.")
            elif isinstance(child, ast.ClassDef):
                visit(child, f"{prefix}{child.name}.")
            else:
                visit(child, prefix)

    visit(ast.parse(source), "")
    return found


_IDENT = re.compile(r"([A-Za-z_]\w*)\s*$")


def _code_only(source: str) -> str:
    """``source`` with comments, literals and preprocessor lines blanked (newlines kept)."""
    out: list[str] = []
    i, n = 0, len(source)
    line_start = True
    while i < n:
        c = source[i]
        if line_start and (c == "#" or (c in " \t" and _directive(source, i))):
            while i < n and source[i] != "\n":  # a directive, with its continuation lines
                if source[i] == "\\" and i + 1 < n and source[i + 1] == "\n":
                    out.append(" \n")
                    i += 2
                    continue
                out.append(" ")
                i += 1
            continue
        if source.startswith("/*", i):
            end = source.find("*/", i + 2)
            end = n if end < 0 else end + 2
            out.append(re.sub(r"[^\n]", " ", source[i:end]))
            i = end
            continue
        if source.startswith("//", i):
            end = source.find("\n", i)
            end = n if end < 0 else end
            out.append(" " * (end - i))
            i = end
            continue
        if c in "\"'":
            j = i + 1
            while j < n and source[j] != c:
                j += 2 if source[j] == "\\" else 1
            out.append(c + re.sub(r"[^\n]", " ", source[i + 1 : j]) + c)
            i = j + 1
            continue
        out.append(c)
        line_start = c == "\n"
        i += 1
    return "".join(out)


def _directive(source: str, i: int) -> bool:
    """Whether the line from ``i`` (blanks so far) is a preprocessor line."""
    end = source.find("\n", i)
    return source[i : len(source) if end < 0 else end].lstrip().startswith("#")


def c_functions(source: str) -> list[tuple[str, int, int]]:
    """(name, first line, line count) of every top-level function body in C ``source``."""
    code = _code_only(source)
    found: list[tuple[str, int, int]] = []
    depth = 0
    start = -1
    name = ""
    for i, c in enumerate(code):
        if c == "{":
            if depth == 0:
                before = code[:i].rstrip()
                if before.endswith(")"):  # a parameter list: a function body
                    open_paren = _matching_open(before, len(before) - 1)
                    match = _IDENT.search(before[:open_paren])
                    name = match.group(1) if match else "?"
                    start = before.count("\n", 0, open_paren) + 1
                else:
                    start = -1  # a struct, enum or initializer
            depth += 1
        elif c == "}":
            depth -= 1
            if depth == 0 and start > 0:
                end = code.count("\n", 0, i) + 1
                found.append((name, start, end - start + 1))
                start = -1
    return found


def _matching_open(text: str, close: int) -> int:
    depth = 0
    for j in range(close, -1, -1):
        if text[j] == ")":
            depth += 1
        elif text[j] == "(":
            depth -= 1
            if depth == 0:
                return j
    return 0


def measured() -> list[tuple[str, str, int, int]]:
    """(file relative to the package, function, first line, lines) over the whole package."""
    rows = []
    for path in sorted(PACKAGE.rglob("*")):
        if path.suffix == ".py":
            functions = python_functions(path.read_text())
        elif path.suffix in (".c", ".h"):
            functions = c_functions(path.read_text())
        else:
            continue
        rel = path.relative_to(PACKAGE).as_posix()
        rows += [(rel, name, line, count) for name, line, count in functions]
    return rows


def too_long(rows: list[tuple[str, str, int, int]]) -> list[str]:
    return [
        f"src/memreclaim/{rel}:{line} {name}() is {count} lines"
        f" (at most {EXCEPTIONS.get((rel, name), LIMIT)})"
        for rel, name, line, count in rows
        if count > EXCEPTIONS.get((rel, name), LIMIT)
    ]


def test_no_function_is_over_the_limit() -> None:
    rows = measured()
    offenders = too_long(rows)
    assert not offenders, "functions over the limit:\n" + "\n".join(offenders)


def test_the_scan_sees_the_package() -> None:
    """The scan finds functions in both languages, the known long ones among them at their
    real size (so a scan that finds nothing, or cuts functions short, fails here)."""
    rows = measured()
    by_name = {(rel, name): count for rel, name, _, count in rows}
    assert sum(rel.endswith(".py") for rel, *_ in rows) > 300
    assert sum(rel.endswith(".c") for rel, *_ in rows) > 100
    assert by_name[("cli/__init__.py", "build_parser")] > LIMIT
    assert any(name.startswith("PyInit_") for _, name, _, _ in rows)
    for path in [*PACKAGE.glob("*.c"), *PACKAGE.glob("*.h")]:  # clang-format: a body's "{" alone
        bodies = sum(line == "{" for line in path.read_text().splitlines())
        rel = path.relative_to(PACKAGE).as_posix()
        assert sum(r == rel for r, *_ in rows) == bodies, f"{rel}: {bodies} bodies in the source"


def test_python_measure_counts_nested_and_methods() -> None:
    body = "\n".join(f"        x = {i}" for i in range(81))
    source = f"class A:\n    @staticmethod\n    def long():\n{body}\n"
    source += "    def short():\n        pass\n"
    rows = python_functions(source)
    assert ("A.long", 3, 82) in rows and ("A.short", 85, 2) in rows
    assert too_long([("m.py", "A.long", 3, 82)]) == [
        "src/memreclaim/m.py:3 A.long() is 82 lines (at most 80)"
    ]


C_SAMPLE = """\
#include <Python.h>
#define BRACE() { /* a macro's braces are no body */ }
static const char *text = "}{";
static struct pair { int a; } table[] = {{1}, {2}};

static int
longer(int a,
       int b)
{
    if (a) { /* } */ return '}'; }
    // {
    return b;
}

int g(void) { return 0; }
"""


def test_c_scan_skips_literals_comments_and_initializers() -> None:
    assert c_functions(C_SAMPLE) == [("longer", 7, 7), ("g", 15, 1)]


def test_the_builder_exception_is_only_for_the_builder() -> None:
    limit = EXCEPTIONS[("cli/__init__.py", "build_parser")]
    rows = [("cli/__init__.py", "build_parser", 1, limit), ("cli/run.py", "build_parser", 1, 81)]
    assert too_long(rows) == ["src/memreclaim/cli/run.py:1 build_parser() is 81 lines (at most 80)"]


# ---- _core.pyi's struct-sequence stubs ------------------------------------------------------

STUB = PACKAGE / "_core.pyi"


def _stub_fields() -> tuple[dict[str, set[str]], set[str]]:
    """Each stub class's properties, its bases' included; and the ``@type_check_only`` classes."""
    classes = {n.name: n for n in ast.parse(STUB.read_text()).body if isinstance(n, ast.ClassDef)}

    def fields(name: str) -> set[str]:
        node = classes[name]
        own = {
            f.name
            for f in node.body
            if isinstance(f, ast.FunctionDef)
            and any(isinstance(d, ast.Name) and d.id == "property" for d in f.decorator_list)
        }
        for base in node.bases:
            if isinstance(base, ast.Name) and base.id in classes:
                own |= fields(base.id)
        return own

    stub_only = {
        name
        for name, node in classes.items()
        if any(isinstance(d, ast.Name) and d.id == "type_check_only" for d in node.decorator_list)
    }
    return {name: fields(name) for name in classes}, stub_only


def test_struct_sequence_stubs_declare_the_runtime_fields() -> None:
    """Every struct sequence of _core has in the stub exactly its runtime fields (the stub-only
    bases that share fields between two types included), and those bases are absent at
    runtime, as ``@type_check_only`` says."""
    from memreclaim import _core

    declared, stub_only = _stub_fields()
    assert stub_only, "_core.pyi: the stub-only bases are gone: update this test"
    checked = 0
    for name, fields in declared.items():
        if name in stub_only:
            assert not hasattr(_core, name), f"_core.{name} exists at runtime: not stub-only"
            continue
        runtime = vars(getattr(_core, name))
        members = {k for k, v in runtime.items() if type(v).__name__ == "member_descriptor"}
        if not members:
            continue  # not a struct sequence (the exception class)
        assert fields == members, f"_core.pyi {name}: {sorted(fields ^ members)} differ"
        checked += 1
    assert checked >= 10, f"only {checked} struct sequences checked"
