"""Names kept for one release after they were made private or moved: a module's
``__getattr__`` answers them through :func:`lookup`, which warns (DeprecationWarning, naming
where the value lives now) and returns the value. One table per module: old name -> (where it
is now, as the warning says it; the value).
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping

__all__ = ["lookup"]


def lookup(module: str, name: str, table: Mapping[str, tuple[str, object]]) -> object:
    """The value of the deprecated ``module.name``, with a DeprecationWarning.

    Raises:
        AttributeError: ``name`` is not in ``table`` (as for any missing module attribute).
    """
    entry = table.get(name)
    if entry is None:
        raise AttributeError(f"module {module!r} has no attribute {name!r}")
    where, value = entry
    warnings.warn(
        f"{module}.{name} is deprecated and goes in the next release: use {where}",
        DeprecationWarning,
        stacklevel=3,
    )
    return value
