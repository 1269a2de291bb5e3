"""Which installed package an allocation site belongs to: the report's "inside ujson 5.12.0".

Two cases, both resolved when the report is made (nothing runs during the measured runs):

* the allocating frame's file lies in an installed distribution (a pure-Python package, or the
  Python layer of one): that distribution;
* the allocating frame is the caller's line of a C function (tracemalloc records Python frames
  only, so an object a C extension creates is charged to the line that called it): the line's
  source is parsed, each call's callee resolved by name in the globals of the module that owns
  the file (``ujson.dumps`` -> the ``ujson`` module -> its ``.so``), and a callee defined in a
  C extension module of an installed distribution names it. Static resolution was chosen over
  a profile hook or ``sys.monitoring`` (3.12+) because it costs nothing while the workload runs;
  it misses callees held in local variables, which are then not named.
"""

from __future__ import annotations

import ast
import functools
import importlib.metadata
import inspect
import linecache
import os
import sys
import sysconfig
from dataclasses import dataclass

_STDLIB = {
    os.path.realpath(p)
    for p in (sysconfig.get_paths().get("stdlib"), sysconfig.get_paths().get("platstdlib"))
    if p
}
_STDLIB_DYNLOAD = {os.path.join(p, "lib-dynload") for p in _STDLIB}
_EXTENSION_SUFFIXES = (".so", ".pyd")


@dataclass(frozen=True)
class Owner:
    """An installed distribution an allocation site belongs to."""

    name: str
    version: str
    extension: str | None  # the C extension's file name, when the allocation is made in C

    def __str__(self) -> str:
        text = f"{self.name} {self.version}"
        if self.extension is not None:
            text += f" (C extension {self.extension})"
        return text


def _site_packages_root(path: str) -> tuple[str, str] | None:
    """(site-packages dir, top-level name) of a file installed under site-/dist-packages."""
    parts = os.path.realpath(path).split(os.sep)
    for i in range(len(parts) - 2, -1, -1):
        if parts[i] in ("site-packages", "dist-packages"):
            top = parts[i + 1]
            for suffix in (".py", *_EXTENSION_SUFFIXES):
                if top.endswith(suffix):
                    top = top.split(".")[0]
            return os.sep.join(parts[: i + 1]), top
    return None


@functools.lru_cache(maxsize=256)
def distribution_of(path: str) -> tuple[str, str] | None:
    """(distribution name, version) of an installed file, or None (stdlib, the user's code,
    memreclaim itself)."""
    found = _site_packages_root(path)
    if found is None:
        return None
    top = found[1]
    try:
        dist = importlib.metadata.distribution(top)
        return dist.metadata["Name"] or top, dist.version
    except importlib.metadata.PackageNotFoundError:
        pass
    names = importlib.metadata.packages_distributions().get(top)  # ~1 s: only when needed
    if not names:
        return None
    try:
        return names[0], importlib.metadata.version(names[0])
    except importlib.metadata.PackageNotFoundError:
        return None


def _module_globals(filename: str) -> dict[str, object] | None:
    real = os.path.realpath(filename)
    for module in list(sys.modules.values()):
        name = getattr(module, "__file__", None)
        if isinstance(name, str) and os.path.realpath(name) == real:
            return vars(module)
    return None


def _callee_names(line: str) -> list[list[str]]:
    """Dotted names of the calls on one source line (``a.b.c(...)`` -> ["a", "b", "c"])."""
    try:
        tree = ast.parse(line.strip())
    except SyntaxError:
        return []
    chains = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        chain: list[str] = []
        func = node.func
        while isinstance(func, ast.Attribute):
            chain.insert(0, func.attr)
            func = func.value
        if isinstance(func, ast.Name):
            chains.append([func.id, *chain])
    return chains


def _extension_file(obj: object) -> str | None:
    """The C extension file that defines a builtin callable (or its type), if any."""
    candidates: list[object] = []
    if inspect.isbuiltin(obj):  # a C function: its module object is __self__
        candidates.append(getattr(obj, "__self__", None))
    for name in (getattr(obj, "__module__", None), getattr(type(obj), "__module__", None)):
        if isinstance(name, str):
            candidates.append(sys.modules.get(name))
    for module in candidates:
        path = getattr(module, "__file__", None) if inspect.ismodule(module) else None
        if isinstance(path, str) and path.endswith(_EXTENSION_SUFFIXES):
            return path
    return None


def called_extension(filename: str, lineno: int) -> Owner | None:
    """The installed C extension whose function is called on ``filename:lineno``, or None."""
    namespace = _module_globals(filename)
    line = linecache.getline(filename, lineno)
    if namespace is None or not line:
        return None
    for chain in _callee_names(line):
        obj: object = namespace.get(chain[0])
        for attr in chain[1:]:
            obj = getattr(obj, attr, None)
        if obj is None or not callable(obj):
            continue
        path = _extension_file(obj)
        if path is None:
            continue
        dist = distribution_of(path)
        if dist is not None:
            return Owner(dist[0], dist[1], os.path.basename(path))
        if os.path.realpath(os.path.dirname(path)) not in _STDLIB_DYNLOAD:
            # A C extension outside any distribution (built in place): named by its module.
            module = getattr(obj, "__module__", None) or os.path.basename(path).split(".")[0]
            return Owner(str(module), "(not an installed distribution)", os.path.basename(path))
    return None


def owner(filename: str, lineno: int) -> Owner | None:
    """The third-party distribution an allocation site belongs to: the file's own, or that of
    a C extension called on the line; None for the user's code and the standard library."""
    if os.path.realpath(os.path.dirname(filename)) in _STDLIB:
        return None
    dist = distribution_of(filename)
    if dist is not None:
        return Owner(dist[0], dist[1], None)
    return called_extension(filename, lineno)
