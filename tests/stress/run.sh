#!/usr/bin/env bash
# The long hardening run (not part of the normal suite): the scripts the suite runs briefly,
# run long. Prints one JSON summary per step; exits non-zero on the first failure.
#
#   tests/stress/run.sh      # SECONDS_PER_RUN=60 per concurrency run, EXAMPLES=3000 fuzz
#
# Steps: concurrency for SECONDS_PER_RUN under glibc, the 'unknown' backend, and each installed
# preloadable allocator (jemalloc, mimalloc, tcmalloc); FORKS (default 300) forks mid-trim and
# 50 exits with everything running (lifecycle.py); discipline with SCALE (default 1:
# 100,000 calls a case) natively and with the unknown backend; the argument fuzz with EXAMPLES
# per function. Environment: PYTHON (default .venv/bin/python).
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$ROOT"
PYTHON=${PYTHON:-$ROOT/.venv/bin/python}
STRESS_SECONDS=${SECONDS_PER_RUN:-60}
EXAMPLES=${EXAMPLES:-3000}
SCALE=${SCALE:-1}
LIBDIR=/usr/lib/x86_64-linux-gnu
started=$(date +%s)

step() {
    local name=$1 limit=$2
    shift 2
    echo "== $name"
    local begin=$(date +%s)
    # A hang is a failure: timeout(1) kills the step after `limit` seconds.
    timeout --signal=KILL "$limit" "$@" | tail -1
    echo "   ($(( $(date +%s) - begin )) s)"
}

conc=(tests/stress/concurrency.py --seconds "$STRESS_SECONDS" --grace 60)
limit=$((STRESS_SECONDS + 120))
step "concurrency glibc ${STRESS_SECONDS}s" "$limit" "$PYTHON" "${conc[@]}"
step "concurrency unknown ${STRESS_SECONDS}s" "$limit" \
    env MEMRECLAIM_TEST_HIDE_SYMBOLS=malloc_trim "$PYTHON" "${conc[@]}"
for lib in libjemalloc.so.2 libmimalloc.so.2 libtcmalloc_minimal.so.4; do
    if [ -f "$LIBDIR/$lib" ]; then
        step "concurrency $lib ${STRESS_SECONDS}s" "$limit" \
            env LD_PRELOAD="$LIBDIR/$lib" "$PYTHON" "${conc[@]}"
    fi
done
step "fork mid-trim, ${FORKS:-300} forks" 1200 "$PYTHON" tests/stress/lifecycle.py fork --forks "${FORKS:-300}"
echo "== exit with everything running, 50 times"
for _ in $(seq 50); do
    out=$(timeout --signal=KILL 60 "$PYTHON" tests/stress/lifecycle.py exit 2>&1 >/dev/null) ||
        { echo "exit run failed"; exit 1; }
    [ -z "$out" ] || { echo "exit run wrote to stderr: $out"; exit 1; }
done
echo "   50 clean exits"
step "discipline glibc" 1200 "$PYTHON" tests/stress/discipline.py --scale "$SCALE"
step "discipline unknown" 1200 \
    env MEMRECLAIM_TEST_HIDE_SYMBOLS=malloc_trim "$PYTHON" tests/stress/discipline.py --scale "$SCALE"
step "fuzz ${EXAMPLES} examples per function" 3600 \
    "$PYTHON" tests/stress/fuzz_surface.py --examples "$EXAMPLES"
echo "== stress run: $(( $(date +%s) - started )) s, all steps passed"
