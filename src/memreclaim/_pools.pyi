"""Type stub of the C extension memreclaim._pools (Linux, CPython 3.11+)."""

from typing import Final

ARENA_SIZE: Final[int]
POOL_SIZE: Final[int]
SLICE_NS: Final[int]
_C_API: Final[object]

class PoolReclaimUnavailable(RuntimeError): ...

def enable() -> None: ...
def estimate() -> int: ...
def status() -> dict[str, bool | int | str | None]: ...
