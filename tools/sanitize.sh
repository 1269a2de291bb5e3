#!/usr/bin/env bash
# Build memreclaim's C extension(s) with -fsanitize=address,undefined and run the core tests
# under it. Fails on any ASan/UBSan report (from pytest or from any subprocess it starts) and on
# any test failure.
#
#   tools/sanitize.sh                      # core tests: hardening, fuzz (+ test_core*/test_api*)
#   tools/sanitize.sh tests/               # any pytest arguments instead
#
# Environment: PYTHON (default .venv/bin/python, with the test extra installed), BUILD (default
# build/sanitize), BUILD_VENV (default build/sanitize-venv: setuptools for setup.py), JOBS (pytest
# -n, default 2), CC (default gcc: the ASan runtime preloaded is gcc's), MEMRECLAIM_FUZZ_SEED
# (the fuzz cases' seed, default 0: printed; the same seed reruns the same cases).
#
# The normal in-place build is untouched: the sanitized extension and a copy of the Python package
# go to $BUILD/lib, which comes first on PYTHONPATH. ASan serves malloc itself, so allocator
# detection would (correctly) say 'unknown'; MEMRECLAIM_TEST_MALLOC_SYMBOL=__libc_malloc makes it
# take libc for the malloc object, so the glibc backend runs too (against libc's idle heap).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
PYTHON=${PYTHON:-$ROOT/.venv/bin/python}
BUILD=${BUILD:-$ROOT/build/sanitize}
BUILD_VENV=${BUILD_VENV:-$ROOT/build/sanitize-venv}
JOBS=${JOBS:-2}
CC=${CC:-gcc}
started=$(date +%s)

rm -rf "$BUILD"
mkdir -p "$BUILD/lib/memreclaim" "$BUILD/reports"
# The Python package, without any in-place extension build.
(cd src/memreclaim && find . -type f ! -name '*.so' ! -path '*/__pycache__/*' -print0 |
    xargs -0 -I{} cp --parents {} "$BUILD/lib/memreclaim/")

# setup.py runs in a small venv of its own holding pyproject's [build-system] requirements
# (kept across runs), so neither the development venv nor its in-place build changes.
if [ ! -x "$BUILD_VENV/bin/python" ]; then
    "$PYTHON" -m venv "$BUILD_VENV"
    requires=$("$PYTHON" -c 'import tomllib; print(" ".join(tomllib.load(open("pyproject.toml", "rb"))["build-system"]["requires"]))')
    # shellcheck disable=SC2086
    "$BUILD_VENV/bin/python" -m pip install -q --disable-pip-version-check $requires \
        2> >(grep -v '^WARNING: Location' >&2)
fi

# Python's own CFLAGS carry -fwrapv, which would hide signed overflow from UBSan: undo it.
SAN_FLAGS="-fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer -g -O1 -fno-wrapv"
echo "== building with $CC $SAN_FLAGS"
CC=$CC CFLAGS="$SAN_FLAGS -Werror" LDFLAGS="-fsanitize=address,undefined" \
    "$BUILD_VENV/bin/python" setup.py -q build_ext --build-lib "$BUILD/lib" \
    --build-temp "$BUILD/tmp" >"$BUILD/build.log" 2>&1 || { cat "$BUILD/build.log"; exit 1; }
built=$(date +%s)

for so in "$BUILD"/lib/memreclaim/*.so; do  # really instrumented?
    grep -q __asan_report <(nm -D "$so") || { echo "$so has no ASan instrumentation"; exit 1; }
done

ASAN_RUNTIME=$("$CC" -print-file-name=libasan.so)
[ -f "$ASAN_RUNTIME" ] || { echo "no ASan runtime from $CC ($ASAN_RUNTIME)"; exit 1; }
export LD_PRELOAD=$ASAN_RUNTIME
export ASAN_OPTIONS="detect_leaks=0:halt_on_error=1:detect_stack_use_after_return=1:log_path=$BUILD/reports/asan"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1:log_path=$BUILD/reports/ubsan"
export PYTHONMALLOC=malloc
export PYTHONPATH="$BUILD/lib${PYTHONPATH:+:$PYTHONPATH}"
export MEMRECLAIM_TEST_MALLOC_SYMBOL=__libc_malloc

"$PYTHON" - "$BUILD/lib" <<'PY'
import sys
import memreclaim._core as core
assert core.__file__.startswith(sys.argv[1]), f"not the sanitized build: {core.__file__}"
print(f"== {core.__file__}: allocator {core.allocator()}")
PY

if [ $# -eq 0 ]; then
    set -- tests/test_hardening.py tests/test_fuzz.py
    for extra in tests/test_core*.py tests/test_api*.py tests/test_units*.py \
        tests/test_interpreters.py; do
        [ -f "$extra" ] && set -- "$@" "$extra"
    done
fi
# The fuzz cases are a fixed number from a fixed seed: the same seed reruns the same cases.
export MEMRECLAIM_FUZZ_SEED=${MEMRECLAIM_FUZZ_SEED:-0}
echo "== fuzz seed $MEMRECLAIM_FUZZ_SEED (MEMRECLAIM_FUZZ_SEED)"
PLUGIN=()
"$PYTHON" -c 'import memreclaim.pytest_plugin' 2>/dev/null || PLUGIN=(-p no:memreclaim)
status=0
PYTHONPATH="$ROOT/tools:$PYTHONPATH" "$PYTHON" -m pytest -q -p no:cacheprovider -p sanitize_plugin \
    "${PLUGIN[@]}" -n "$JOBS" --durations=15 "$@" 2>&1 | tee "$BUILD/pytest.log" || status=$?
finished=$(date +%s)

reports=$(find "$BUILD/reports" -type f | sort)
if [ -n "$reports" ]; then
    echo "== sanitizer reports:"
    for report in $reports; do echo "--- $report"; cat "$report"; done
    status=1
fi
echo "== build $((built - started)) s, tests $((finished - built)) s;" \
    "reports: $(echo -n "$reports" | grep -c . || true); pytest status $status"
exit $status
