#!/bin/sh
# Exercise the free-threaded (PEP 703, Py_GIL_DISABLED) build path of memreclaim._core without a
# free-threaded interpreter (neither Debian nor PyPI ships one).
#
#   tools/freethreaded_build.sh [PYTHON]      (default: python3; needs CPython >= 3.13 headers,
#                                              setuptools importable, a C compiler)
#
# 1. Builds the extension through setup.py (the real build path: its macros and options) with
#    Py_GIL_DISABLED defined, against PYTHON's headers, with -Werror. Python.h #errors when the
#    limited API meets Py_GIL_DISABLED, so an abi3 setting fails here.
# 2. Checks the object really is a free-threaded build: it calls the free-threaded refcounting
#    helpers (_Py_DecRefShared / _Py_MergeZeroLocalRefcount), which a regular build never uses.
# 3. Compiles module.c again into a small program with the same macro and reads the module's slot
#    table at run time: it must declare Py_mod_gil = Py_MOD_GIL_NOT_USED (and per-interpreter GIL
#    support). The program never calls Python, so it links without libpython.
# Exits non-zero (with the reason) when any step fails.
set -eu

PYTHON=${1:-python3}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
WORK=$(mktemp -d "${TMPDIR:-/tmp}/memreclaim-ft.XXXXXX")
trap 'rm -rf "$WORK"' EXIT INT TERM

fail() {
    echo "freethreaded_build: FAIL: $*" >&2
    exit 1
}

"$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 13))' ||
    fail "$PYTHON is older than 3.13: its headers know no free-threaded build"
"$PYTHON" -c 'import setuptools' 2>/dev/null ||
    fail "setuptools is not importable by $PYTHON (pip install setuptools)"
INCLUDE=$("$PYTHON" -c 'import sysconfig; print(sysconfig.get_paths()["include"])')
[ -f "$INCLUDE/Python.h" ] || fail "no Python.h in $INCLUDE (install the -dev package)"
VERSION=$("$PYTHON" -c 'import platform; print(platform.python_version())')
echo "freethreaded_build: CPython $VERSION headers in $INCLUDE"

# 1. setup.py build_ext from a copy of the tree (no in-tree build/ objects).
mkdir "$WORK/tree"
cp -R "$ROOT/setup.py" "$ROOT/pyproject.toml" "$ROOT/README.md" "$ROOT/LICENSE" "$ROOT/src" \
    "$WORK/tree/"
(
    cd "$WORK/tree"
    CFLAGS="-DPy_GIL_DISABLED=1 -Werror" "$PYTHON" setup.py -q build_ext \
        --build-lib "$WORK/lib" --build-temp "$WORK/tmp" >"$WORK/build.log" 2>&1
) || {
    cat "$WORK/build.log" >&2
    fail "setup.py build_ext with Py_GIL_DISABLED failed"
}
SO=$(find "$WORK/lib" -name '_core*.so' | head -n 1)
[ -n "$SO" ] || fail "setup.py built no memreclaim/_core*.so"
echo "freethreaded_build: built $(basename "$SO")"

# 2. The free-threaded object layout and refcounting were compiled in.
nm -D --undefined-only "$SO" | grep -Eq '_Py_DecRefShared|_Py_MergeZeroLocalRefcount' ||
    fail "$(basename "$SO") uses no free-threaded refcounting: Py_GIL_DISABLED did not take"

# 3. The slot table, read at run time from the same sources compiled the same way.
SRC="$ROOT/src/memreclaim"
cat >"$WORK/slots.c" <<'EOF'
#include "module.c"
#include <stdio.h>
#ifndef Py_GIL_DISABLED
#error "Py_GIL_DISABLED is not defined"
#endif
int main(void)
{
    const char *gil = "absent", *interp = "absent";
    for (PyModuleDef_Slot *slot = core_module.m_slots; slot->slot != 0; slot++) {
        if (slot->slot == Py_mod_gil) {
            gil = slot->value == Py_MOD_GIL_NOT_USED ? "Py_MOD_GIL_NOT_USED" : "other";
        }
        if (slot->slot == Py_mod_multiple_interpreters) {
            interp = slot->value == Py_MOD_PER_INTERPRETER_GIL_SUPPORTED
                         ? "Py_MOD_PER_INTERPRETER_GIL_SUPPORTED"
                         : "other";
        }
    }
    printf("Py_mod_gil=%s Py_mod_multiple_interpreters=%s\n", gil, interp);
    return strcmp(gil, "Py_MOD_GIL_NOT_USED") == 0 &&
                   strcmp(interp, "Py_MOD_PER_INTERPRETER_GIL_SUPPORTED") == 0
               ? 0
               : 1;
}
EOF
# The Python API symbols stay unresolved (never called); a non-PIE executable tolerates that.
${CC:-cc} -std=c11 -Wall -Wextra -Werror -DPy_GIL_DISABLED=1 -I"$SRC" -I"$INCLUDE" \
    "$WORK/slots.c" "$SRC/heap.c" "$SRC/inspect.c" "$SRC/knobs.c" "$SRC/procfs.c" \
    "$SRC/detect.c" "$SRC/backends.c" "$SRC/thp.c" "$SRC/diag.c" -ldl -no-pie \
    -Wl,--unresolved-symbols=ignore-all -o "$WORK/slots" >"$WORK/cc.log" 2>&1 || {
    cat "$WORK/cc.log" >&2
    fail "compiling the slot-table check failed"
}
SLOTS=$("$WORK/slots") || fail "slot table: $SLOTS"
echo "freethreaded_build: $SLOTS"
echo "freethreaded_build: OK (CPython $VERSION, Py_GIL_DISABLED build)"
