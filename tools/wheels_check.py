"""The installed wheel's smoke check (tools/wheels.sh runs it in each test venv, before pytest).

    python wheels_check.py [PREFIX]      # PREFIX: the test venv (default sys.prefix)

1. ``memreclaim`` (and its two C modules) import from the venv's site-packages, not from a
   source tree, and the allocator is detected.
2. A load spike (the README demo's shape: 160,000 strings of 600-4,000 bytes, every 50th kept)
   is freed and trimmed in two twin subprocesses: one with ``memreclaim.trim()``, one with
   ``ctypes`` calling glibc's ``malloc_trim(0)`` directly. memreclaim must give back at least
   80 % of what the direct call gives back (RSS measured from /proc/self/statm in both), and the
   direct call must give back something (else the check proves nothing).

Prints one line: ``check ok: ...`` or raises.
"""

from __future__ import annotations

import json
import subprocess
import sys

TWIN = r"""
import ctypes, gc, json, os, random, sys
how = sys.argv[1]
if how == "memreclaim":
    import memreclaim
page = os.sysconf("SC_PAGE_SIZE")
def rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * page
rng = random.Random(1)
kept = []
for burst in range(2):
    spike = ["x" * rng.randint(600, 4000) for _ in range(160_000)]
    kept += spike[::50]
    del spike
    gc.collect()
before = rss()
if how == "memreclaim":
    reported = memreclaim.trim().released
else:
    ctypes.CDLL(None).malloc_trim(0)
    reported = None
after = rss()
print(json.dumps({"released": before - after, "reported": reported, "before": before}))
"""


def twin(how: str) -> dict[str, int]:
    proc = subprocess.run(
        [sys.executable, "-c", TWIN, how], capture_output=True, text=True, timeout=600, check=True
    )
    result: dict[str, int] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


def main() -> None:
    prefix = sys.argv[1] if len(sys.argv) > 1 else sys.prefix
    import memreclaim
    import memreclaim._core
    import memreclaim._pools

    for module in (memreclaim, memreclaim._core, memreclaim._pools):
        path = module.__file__ or ""
        if not path.startswith(prefix):
            raise SystemExit(f"check: {module.__name__} comes from {path}, not the venv {prefix}")
    allocator = memreclaim.allocator()
    if allocator != "glibc":
        raise SystemExit(f"check: allocator detected as {allocator!r}, expected 'glibc'")
    ours, direct = twin("memreclaim"), twin("ctypes")
    if direct["released"] <= 0:
        raise SystemExit(f"check: malloc_trim(0) released nothing in the twin ({direct}): no proof")
    if ours["released"] < 0.8 * direct["released"]:
        raise SystemExit(f"check: memreclaim.trim() released {ours} vs malloc_trim {direct}")
    mib = 1 << 20
    print(
        f"check ok: memreclaim {memreclaim.__version__} from {memreclaim._core.__file__}, "
        f"allocator {allocator}; spike trim released {ours['released'] / mib:.1f} MiB "
        f"(trim() reported {ours['reported'] / mib:.1f} MiB) vs ctypes malloc_trim(0) "
        f"{direct['released'] / mib:.1f} MiB"
    )


if __name__ == "__main__":
    main()
