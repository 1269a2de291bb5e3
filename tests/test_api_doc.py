"""docs/api.md's signatures against the code's.

Each heading of docs/api.md of the form ``### `name(parameters) -> result` `` (``name`` a public
name of ``memreclaim``, or a dotted path below it) is read as a Python signature and compared
with ``inspect.signature`` of the object: the same parameters, in the same order, of the same
kind, with the same defaults (literal defaults compared by value, others by their source text).
C functions whose signature Python cannot introspect are compared with their declaration in
``_core.pyi`` instead (defaults by source text); exception classes are headed by their base class
and skipped.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import re
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "api.md"
STUB = ROOT / "src" / "memreclaim" / "_core.pyi"
HEADING = re.compile(r"^###\s+`(?:async\s+)?([A-Za-z_][\w.]*)\((.*)\)(?:\s*->\s*[^`]+)?`\s*$")


def _headings() -> list[tuple[str, str]]:
    found = []
    for line in DOC.read_text().splitlines():
        match = HEADING.match(line)
        if match:
            found.append((match.group(1), match.group(2)))
    return found


def _resolve(name: str) -> Any:
    import memreclaim

    path = name.split(".")
    if path[0] == "memreclaim":
        path = path[1:]
    obj: Any = memreclaim
    for index, part in enumerate(path):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            module = ".".join(["memreclaim", *path[: index + 1]])
            obj = importlib.import_module(module)
    return obj


def _documented(params: str) -> list[tuple[str, str, str | None]]:
    """(name, kind, default source) per documented parameter."""
    fn = ast.parse(f"def f({params}): pass").body[0]
    assert isinstance(fn, ast.FunctionDef)
    return _parameters(fn.args)


def _stubbed(name: str) -> list[tuple[str, str, str | None]] | None:
    """The parameters of a C function as _core.pyi declares them, or None."""
    for node in ast.parse(STUB.read_text()).body:
        if isinstance(node, ast.FunctionDef) and node.name == name.rsplit(".", 1)[-1]:
            return _parameters(node.args)
    return None


def _parameters(args: ast.arguments) -> list[tuple[str, str, str | None]]:
    out: list[tuple[str, str, str | None]] = []
    positional = [*args.posonlyargs, *args.args]
    defaults: list[ast.expr | None] = [None] * (len(positional) - len(args.defaults))
    defaults += list(args.defaults)
    for i, (arg, default) in enumerate(zip(positional, defaults, strict=True)):
        kind = "POSITIONAL_ONLY" if i < len(args.posonlyargs) else "POSITIONAL_OR_KEYWORD"
        out.append((arg.arg, kind, None if default is None else ast.unparse(default)))
    if args.vararg:
        out.append((args.vararg.arg, "VAR_POSITIONAL", None))
    for arg, kw_default in zip(args.kwonlyargs, args.kw_defaults, strict=True):
        source = None if kw_default is None else ast.unparse(kw_default)
        out.append((arg.arg, "KEYWORD_ONLY", source))
    if args.kwarg:
        out.append((args.kwarg.arg, "VAR_KEYWORD", None))
    return out


def _same_default(documented: str | None, actual: Any) -> bool:
    if documented is None:
        return actual is inspect.Parameter.empty
    if actual is inspect.Parameter.empty:
        return False
    try:
        value = ast.literal_eval(documented)
    except ValueError:  # a name (REGISTRY, signal.SIGUSR2): its last part names the value
        last = documented.rsplit(".", 1)[-1]
        return last in (repr(actual), getattr(actual, "name", None), type(actual).__name__)
    if isinstance(value, str) and isinstance(actual, int) and not isinstance(actual, bool):
        from memreclaim.units import parse_bytes  # "1 MiB" documents 1048576

        return parse_bytes(value) == actual
    return bool(value == actual)


CASES = _headings()


def test_the_reference_has_signatures_to_check() -> None:
    assert len(CASES) >= 30, f"docs/api.md: only {len(CASES)} signature headings found"


@pytest.mark.parametrize(("name", "params"), CASES, ids=[name for name, _ in CASES])
def test_documented_signature_matches_the_code(name: str, params: str) -> None:
    obj = _resolve(name)
    if isinstance(obj, type) and issubclass(obj, BaseException):
        pytest.skip("an exception class, headed by its base")
    documented = _documented(params)
    try:
        got = [(p.name, p.kind.name, p.default) for p in inspect.signature(obj).parameters.values()]
    except ValueError:  # a C function without a text signature: its declaration in _core.pyi
        stub = _stubbed(name)
        assert stub is not None, f"{name}: no signature to read, and not in _core.pyi"
        assert documented == stub, f"{name}: api.md says {documented}, _core.pyi {stub}"
        return
    assert [d[0] for d in documented] == [g[0] for g in got], (
        f"{name}: api.md lists parameters {[d[0] for d in documented]}, the code has"
        f" {[g[0] for g in got]}"
    )
    for (pname, kind, default), (_, actual_kind, actual_default) in zip(
        documented, got, strict=True
    ):
        assert kind == actual_kind, f"{name}({pname}): api.md says {kind}, the code {actual_kind}"
        assert _same_default(default, actual_default), (
            f"{name}({pname}): api.md gives the default {default}, the code {actual_default!r}"
        )


# ---- methods named in a class's section, and every field of every result type ---------------

METHOD = re.compile(r"`(?:async\s+|await\s+)?([a-z_]\w*)\(([^`()]*(?:\([^`()]*\)[^`()]*)*)\)`")


def _sections() -> list[tuple[str, str]]:
    """(heading, text) of each ``###`` section of api.md."""
    parts = re.split(r"^(###\s+.*)$", DOC.read_text(), flags=re.MULTILINE)
    return [(parts[i], parts[i + 1].split("\n## ", 1)[0]) for i in range(1, len(parts) - 1, 2)]


def _method_cases() -> list[tuple[str, str, str]]:
    cases = []
    for heading, text in _sections():
        match = HEADING.match(heading)
        if match is None:
            continue
        try:
            owner = _resolve(match.group(1))
        except (AttributeError, ImportError):
            continue  # test_documented_signature_matches_the_code reports it
        if not isinstance(owner, type):
            continue
        for name, params in METHOD.findall(text):
            if inspect.isfunction(inspect.getattr_static(owner, name, None)):
                cases.append((match.group(1), name, params))
    return cases


METHOD_CASES = _method_cases()


def test_the_reference_names_methods_to_check() -> None:
    assert len(METHOD_CASES) >= 10, f"only {len(METHOD_CASES)} methods found: {METHOD_CASES}"


@pytest.mark.parametrize(
    ("owner", "name", "params"), METHOD_CASES, ids=[f"{o}.{n}" for o, n, _ in METHOD_CASES]
)
def test_documented_method_matches_the_code(owner: str, name: str, params: str) -> None:
    """A method written out with its parameters in its class's section, e.g. PacingPolicy's
    `decide(now, rss, *, traced=None, ...)`, has those parameters and defaults (self aside)."""
    method = getattr(_resolve(owner), name)
    documented = _documented(params)
    got = [
        (p.name, p.kind.name, p.default)
        for p in inspect.signature(method).parameters.values()
        if p.name != "self"
    ]
    where = f"api.md, {owner}: `{name}({params})`"
    assert [d[0] for d in documented] == [g[0] for g in got], (
        f"{where}: the code's parameters are {[g[0] for g in got]}"
    )
    for (pname, kind, default), (_, actual_kind, actual_default) in zip(
        documented, got, strict=True
    ):
        assert kind == actual_kind, f"{where}: {pname} is {actual_kind} in the code"
        assert _same_default(default, actual_default), (
            f"{where}: {pname}'s default is {actual_default!r} in the code"
        )


STRUCT_SEQUENCES = {  # a sample of each: their hidden fields are read from an instance
    "TrimResult": lambda m: m.trim(),
    "MemoryStats": lambda m: m.stats(heap=True),
    "TrimTotals": lambda m: m.totals(),
    "HeapStats": lambda m: m.heap_stats(),
}


def _result_types() -> dict[str, Any]:
    """Every public dataclass and TypedDict of memreclaim and memreclaim.pressure, by name."""
    import dataclasses

    import memreclaim
    from memreclaim import pressure

    found: dict[str, Any] = {}
    public = [getattr(memreclaim, name) for name in memreclaim.__all__]
    public += [getattr(pressure, name) for name in pressure.__all__]
    for cls in public:
        if not isinstance(cls, type):
            continue
        if dataclasses.is_dataclass(cls) or (
            issubclass(cls, dict) and "__annotations__" in vars(cls)
        ):
            found[cls.__name__] = cls
    return found


def _fields(name: str) -> tuple[str, ...]:
    import dataclasses

    import memreclaim

    if name in STRUCT_SEQUENCES:
        try:
            return tuple(memreclaim.asdict(STRUCT_SEQUENCES[name](memreclaim)))
        except memreclaim.UnsupportedAllocatorError as exc:
            pytest.skip(f"no {name} under this allocator: {exc}")
    cls = _result_types()[name]
    if dataclasses.is_dataclass(cls):
        return tuple(f.name for f in dataclasses.fields(cls) if not f.name.startswith("_"))
    return tuple(cls.__annotations__)  # a TypedDict


def _documented_fields(cls: str) -> set[str]:
    """The backticked names in the sections about ``cls``: its own, or those naming it."""
    sections = _sections()
    own = [text for heading, text in sections if re.search(rf"\b{cls}\b", heading)]
    texts = own or [text for _, text in sections if f"`{cls}`" in text]
    return {word for text in texts for word in re.findall(r"`([A-Za-z_]\w*)", text)}


RESULTS = sorted({*STRUCT_SEQUENCES, *_result_types()})


def test_there_are_result_types_to_check() -> None:
    assert {"TrimResult", "MemoryStats", "Report", "Counters", "PoolReclaimStatus"} <= set(RESULTS)


@pytest.mark.parametrize("cls", RESULTS)
def test_every_field_is_documented(cls: str) -> None:
    """Each field of a public result type (``Report.file_leak``, each ``PoolReclaimStatus``
    key, ...) is named in api.md, in the section about that type."""
    documented = _documented_fields(cls)
    assert documented, f"api.md has no section about {cls}"
    missing = [name for name in _fields(cls) if name not in documented]
    assert not missing, f"api.md does not document {cls}'s fields {missing}"
