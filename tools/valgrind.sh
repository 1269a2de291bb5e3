#!/usr/bin/env bash
# valgrind memcheck over tests/stress/smoke.py (every public call, success and error paths, a
# fork, a threaded run) with PYTHONMALLOC=malloc, twice: with the glibc backend (valgrind
# redirects libc's malloc in place, so dlsym still finds libc's and detection says glibc) and
# with the 'unknown' backend (malloc_trim hidden through MEMRECLAIM_TEST_HIDE_SYMBOLS, which takes
# the UnsupportedAllocatorError paths). Fails when any memcheck error (invalid
# read/write, uninitialised value, bad free, overlap) has a frame in memreclaim's own code (in
# any of its stacks: a use after free also names where the block was freed);
# the interpreter's own errors are counted and listed, not failed on.
#
#   tools/valgrind.sh     # CALLS (default 100) per case, THREAD_SECONDS (default 2) threaded
#
# Environment: PYTHON (default .venv/bin/python; the in-place build is what is checked), OUT
# (default build/valgrind: XML logs).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
PYTHON=${PYTHON:-$ROOT/.venv/bin/python}
OUT=${OUT:-$ROOT/build/valgrind}
CALLS=${CALLS:-100}
THREAD_SECONDS=${THREAD_SECONDS:-2}
command -v valgrind >/dev/null || { echo "valgrind is not installed (apt-get install valgrind)"; exit 1; }
rm -rf "$OUT"
mkdir -p "$OUT"
status=0
started=$(date +%s)

for mode in glibc unknown; do
    hide=""
    [ "$mode" = unknown ] && hide=malloc_trim
    echo "== valgrind, allocator backend: $mode"
    MEMRECLAIM_TEST_HIDE_SYMBOLS=$hide PYTHONMALLOC=malloc valgrind --tool=memcheck --leak-check=no \
        --child-silent-after-fork=no --trace-children=no --xml=yes \
        --xml-file="$OUT/$mode.%p.xml" \
        "$PYTHON" tests/stress/smoke.py --calls "$CALLS" --seconds "$THREAD_SECONDS" \
        >"$OUT/$mode.stdout" 2>"$OUT/$mode.stderr" || {
        echo "smoke run failed under valgrind ($mode):"; tail -20 "$OUT/$mode.stderr"; status=1; }
    tail -1 "$OUT/$mode.stdout"
done

"$PYTHON" - "$OUT" <<'PY' || status=1
"""Count memcheck errors; fail on any with a frame in memreclaim's code."""
import collections
import pathlib
import sys
import xml.etree.ElementTree as ET

ours, theirs = [], collections.Counter()
files = sorted(pathlib.Path(sys.argv[1]).glob("*.xml"))
for path in files:
    try:
        root = ET.parse(path).getroot()
    except ET.ParseError as exc:  # a child killed mid-write
        print(f"{path.name}: unreadable XML ({exc})")
        continue
    for error in root.findall("error"):
        kind = error.findtext("kind") or "?"
        if kind.startswith("Leak_"):
            continue
        # Every stack: where it happened, and for a use after free where the block was freed.
        frames = [frame for stack in error.findall("stack") for frame in stack.findall("frame")]
        objects = [frame.findtext("obj") or "" for frame in frames]
        if any("memreclaim" in obj or "_core" in obj for obj in objects):
            where = [f"{f.findtext('fn')} ({f.findtext('file')}:{f.findtext('line')})" for f in frames[:12]]
            ours.append(f"{path.name}: {kind}: {error.findtext('what') or error.findtext('xwhat/text')}\n    " + "\n    ".join(where))
        else:
            top = (objects[0].rsplit("/", 1)[-1] if objects else "?")
            theirs[(kind, top)] += 1
print(f"== {len(files)} valgrind logs; errors in memreclaim's code: {len(ours)};"
      f" elsewhere (interpreter, libc): {sum(theirs.values())}")
for (kind, top), count in sorted(theirs.items()):
    print(f"   not ours: {count} x {kind} in {top}")
for report in ours:
    print(report)
sys.exit(1 if ours else 0)
PY
echo "== valgrind.sh: $(( $(date +%s) - started )) s, status $status"
exit $status
