#!/usr/bin/env bash
# The interpreter matrix: the README's test command (`pip install -e '.[test]'`, then
# `python -m pytest -n 2`) on every interpreter CI covers besides the main one, each from a clean
# `git archive HEAD` export (never the in-tree build/), each in a venv of its own:
#
#   debian-3.11   this machine's /usr/bin/python3 (Debian 12's non-PIE 3.11)
#   pyenv-3.12    /root/.pyenv/versions/3.12.1   } when present (CI machines have them);
#   pyenv-3.13    /root/.pyenv/versions/3.13.0   } skipped with a printed line otherwise
#   trixie-3.13   Debian trixie chroot: python3.13, glibc 2.41, mimalloc 3
#   forky-3.14    Debian forky chroot: python3.14, glibc 2.43
#   forky-3.15    Debian forky chroot: python3.15
#
# Chroots are made with debootstrap from the mirror in this machine's apt sources (forky with
# debootstrap's `sid` script; its Release file is verified with the host's Debian keyring, but
# it has expired, so apt inside runs with Check-Valid-Until false), get the host's resolv.conf
# and CA bundle, /proc mounted while they are used (unmounted at exit, also on failure), and are
# cached in $MATRIX_CACHE/<suite>, reused once a stamp file (written last) says they are complete.
# Inside: python3.X-dev python3.X-venv gcc libc6-dev ca-certificates and the allocators
# (jemalloc, mimalloc, tcmalloc), whose package names are looked up in the suite and whose
# libraries are found from the packages' contents.
#
# Each interpreter prints one summary line; the script exits 1 if any run fails. Run as root:
#
#   tools/matrix.sh                         # every interpreter
#   tools/matrix.sh forky-3.15 debian-3.11  # only these
#
# Environment:
#   MATRIX_CACHE      chroot cache (default /var/tmp/memreclaim-chroots)
#   MATRIX_CHROOT_<suite>=DIR  use a ready chroot DIR as is (no debootstrap, no apt, no stamp;
#                     only DIR$MATRIX_INSIDE is written), e.g. MATRIX_CHROOT_forky=/srv/forky
#   MATRIX_INSIDE     work directory inside a chroot (default /opt/memreclaim-matrix.PID, one per
#                     run, so that runs sharing a cached chroot do not collide; the venv
#                     must be readable by other users: a CLI test runs as nobody)
#   MATRIX_MIRROR     Debian mirror (default: the first `URIs:`/`deb` entry in the apt sources)
#   MATRIX_KEEP=1     keep the work directories (logs, venvs) instead of removing them at exit
#   MATRIX_CHROOT_TIMEOUT, MATRIX_INSTALL_TIMEOUT, MATRIX_TEST_TIMEOUT   seconds (900/900/1200;
#                     a foreign-architecture chroot gets 3x MATRIX_CHROOT_TIMEOUT)
#   MATRIX_PYTEST_ARGS  extra pytest arguments (default none: the README's command exactly)
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
CACHE=${MATRIX_CACHE:-/var/tmp/memreclaim-chroots}
INSIDE=${MATRIX_INSIDE:-/opt/memreclaim-matrix.$$}  # not under /root: some tests run as nobody
CHROOT_TIMEOUT=${MATRIX_CHROOT_TIMEOUT:-900}
INSTALL_TIMEOUT=${MATRIX_INSTALL_TIMEOUT:-900}
TEST_TIMEOUT=${MATRIX_TEST_TIMEOUT:-1200}
read -r -a EXTRA_PYTEST <<<"${MATRIX_PYTEST_ARGS:-}"
ALL_RUNS=(debian-3.11 pyenv-3.12 pyenv-3.13 trixie-3.13 forky-3.14 forky-3.15)
# Allocator packages: the first name the suite has wins (Debian renamed them over time).
ALLOCATOR_PACKAGES=("libjemalloc2" "libmimalloc3 libmimalloc2.0" "libtcmalloc-minimal4t64 libtcmalloc-minimal4")
HOST_CA=/etc/ssl/certs/ca-certificates.crt
export DEBIAN_FRONTEND=noninteractive

[ "$(id -u)" -eq 0 ] || { echo "matrix: needs root (debootstrap, chroot, mount)" >&2; exit 2; }
git -C "$ROOT" rev-parse --verify -q HEAD >/dev/null || { echo "matrix: not a git checkout" >&2; exit 2; }

RUNS=("$@")
[ ${#RUNS[@]} -gt 0 ] || RUNS=("${ALL_RUNS[@]}")
for run in "${RUNS[@]}"; do
    case " ${ALL_RUNS[*]} " in *" $run "*) ;; *)
        echo "matrix: unknown run '$run' (one of: ${ALL_RUNS[*]})" >&2; exit 2 ;;
    esac
done

WORK=$(mktemp -d /var/tmp/memreclaim-matrix.XXXXXX)
chmod 755 "$WORK"  # readable by nobody, as the venv on a developer's machine is
MOUNTED=()         # mount points this script mounted, unmounted at exit
INSIDE_DIRS=()     # work directories made inside chroots, removed at exit
cleanup() {
    local i
    for ((i = ${#MOUNTED[@]} - 1; i >= 0; i--)); do
        umount "${MOUNTED[i]}" 2>/dev/null || umount -l "${MOUNTED[i]}" || true
    done
    if [ "${MATRIX_KEEP:-}" = 1 ]; then
        echo "matrix: kept $WORK ${INSIDE_DIRS[*]}"
    else
        rm -rf "$WORK" "${INSIDE_DIRS[@]}"
    fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

log() { echo "matrix: $*"; }

# The Debian mirror of this machine's apt sources (deb822 first, then one-line format).
mirror() {
    if [ -n "${MATRIX_MIRROR:-}" ]; then echo "$MATRIX_MIRROR"; return; fi
    local uri
    uri=$(cat /etc/apt/sources.list.d/*.sources 2>/dev/null |
        awk '/^URIs:/ && $2 !~ /security/ {print $2; exit}')
    [ -n "$uri" ] || uri=$(cat /etc/apt/sources.list /etc/apt/sources.list.d/*.list 2>/dev/null |
        awk '$1 == "deb" && $0 !~ /security/ {for (i = 2; i <= NF; i++) if ($i ~ /^[a-z]+:\/\//) {print $i; exit}}')
    echo "${uri:-http://deb.debian.org/debian}"
}

mount_proc() {  # DIR: /proc inside the chroot, unless something already mounted it
    if ! mountpoint -q "$1/proc"; then
        mount -t proc proc "$1/proc"
        MOUNTED+=("$1/proc")
    fi
}

in_chroot() {  # DIR CMD...: a clean environment (nothing of the host's pip or venv set-up)
    local dir=$1
    shift
    chroot "$dir" /usr/bin/env -i PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
        HOME=/root LANG=C.UTF-8 DEBIAN_FRONTEND=noninteractive "$@"
}

# PACKAGE...: the first alternative of each group that the chroot DIR's apt knows ($1 = DIR).
pick_packages() {
    local dir=$1 group name found
    shift
    for group in "$@"; do
        found=
        for name in $group; do
            if in_chroot "$dir" apt-cache show --no-all-versions "$name" >/dev/null 2>&1; then
                found=$name
                break
            fi
        done
        [ -n "$found" ] || { echo "matrix: none of '$group' exists in $dir" >&2; return 1; }
        echo "$found"
    done
}

# Make (or reuse) the chroot of SUITE with the given Python versions: sets CHROOT_DIR.
# ARCH (optional, e.g. arm64; default the host's) makes a foreign chroot, cached as SUITE-ARCH
# and run through qemu-user (binfmt_misc must already send its binaries to qemu: tools/wheels.sh
# registers that): python and the allocators only, no compiler (a wheel test runs there).
CHROOT_DIR=
chroot_for() {
    local suite=$1 versions=$2 arch=${3:-} name ready_var dir stamp script spec pkgs v
    local arch_opt=() limit=$CHROOT_TIMEOUT
    name=$suite
    if [ -n "$arch" ] && [ "$arch" != "$(dpkg --print-architecture)" ]; then
        name=$suite-$arch
        arch_opt=(--arch="$arch")
        limit=$((3 * CHROOT_TIMEOUT))  # every binary emulated: dpkg, maintainer scripts, apt
    else
        arch=
    fi
    ready_var="MATRIX_CHROOT_${name//-/_}"
    CHROOT_DIR=
    if [ -n "${!ready_var:-}" ]; then
        dir=${!ready_var}
        [ -x "$dir/bin/sh" ] || { echo "matrix: $ready_var=$dir is not a chroot" >&2; return 1; }
        log "$name: using the ready chroot $dir as is"
        mount_proc "$dir" || return 1
        CHROOT_DIR=$dir
        return 0
    fi
    dir=$CACHE/$name
    stamp=$dir/.memreclaim-complete
    spec="python ${versions}; allocators ${ALLOCATOR_PACKAGES[*]}"
    [ -z "$arch" ] || spec="$spec; $arch, no compiler"
    if [ -f "$stamp" ] && [ "$(head -1 "$stamp")" = "$spec" ]; then
        log "$name: reusing $dir (complete since $(sed -n 2p "$stamp"))"
    else
        if [ ! -f "$stamp" ]; then  # absent, or left incomplete: start over
            if mountpoint -q "$dir/proc"; then umount "$dir/proc" || return 1; fi
            rm -rf "$dir" && mkdir -p "$CACHE" || return 1
            script=/usr/share/debootstrap/scripts/$suite
            [ -e "$script" ] || script=/usr/share/debootstrap/scripts/sid  # e.g. forky
            log "$name: debootstrap from $(mirror) (script $(basename "$script"))"
            timeout --kill-after=30 "$limit" debootstrap --variant=minbase "${arch_opt[@]}" \
                --include=ca-certificates "$suite" "$dir" "$(mirror)" "$script" \
                >"$WORK/debootstrap-$name.log" 2>&1 ||
                { tail -30 "$WORK/debootstrap-$name.log" >&2; return 1; }
        fi
        # testing's Release file expires when the archive is not refreshed (e.g. a snapshot).
        echo 'Acquire::Check-Valid-Until "false";' \
            >"$dir/etc/apt/apt.conf.d/99memreclaim-valid-until" || return 1
        cp /etc/resolv.conf "$dir/etc/resolv.conf" && mount_proc "$dir" || return 1
        timeout --kill-after=30 "$limit" chroot "$dir" apt-get update -qq \
            >"$WORK/apt-$name.log" 2>&1 || { tail -30 "$WORK/apt-$name.log" >&2; return 1; }
        pkgs="ca-certificates"
        [ -n "$arch" ] || pkgs="gcc libc6-dev $pkgs"
        for v in $versions; do
            if [ -n "$arch" ]; then pkgs="$pkgs python$v-venv"; else pkgs="$pkgs python$v-dev python$v-venv"; fi
        done
        pkgs="$pkgs $(pick_packages "$dir" "${ALLOCATOR_PACKAGES[@]}" | tr '\n' ' ')" || return 1
        log "$name: apt-get install $pkgs"
        # shellcheck disable=SC2086
        timeout --kill-after=30 "$limit" chroot "$dir" /usr/bin/env \
            DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $pkgs \
            >>"$WORK/apt-$name.log" 2>&1 || { tail -30 "$WORK/apt-$name.log" >&2; return 1; }
        in_chroot "$dir" apt-get clean || return 1
        printf '%s\n%s\n' "$spec" "$(date -u +%FT%TZ)" >"$stamp" || return 1  # last: complete
    fi
    cp /etc/resolv.conf "$dir/etc/resolv.conf" && mount_proc "$dir" || return 1
    # pip inside must trust what the host trusts (after apt: ca-certificates rewrites the file)
    if [ -f "$HOST_CA" ]; then cp "$HOST_CA" "$dir/etc/ssl/certs/ca-certificates.crt" || return 1; fi
    CHROOT_DIR=$dir
}

# The allocator libraries installed in DIR (/ for the host), from the packages' contents.
allocator_libs() {
    local dir=$1 group name
    for group in "${ALLOCATOR_PACKAGES[@]}"; do
        for name in $group; do
            if chroot "$dir" dpkg-query -W -f '${Status}' "$name" 2>/dev/null | grep -q 'ok installed'; then
                chroot "$dir" dpkg-query -L "$name" | grep -E '/lib[a-z_]+\.so\.[0-9]+$' | head -1
                break
            fi
        done
    done | tr '\n' ' '
}

SUMMARY=()
FAILED=0
summarize() {  # NAME STATUS DETAIL
    SUMMARY+=("$(printf '%-12s %-4s %s' "$1" "$2" "$3")")
    log "$(printf '%-12s %-4s %s' "$1" "$2" "$3")"
    [ "$2" = ok ] || [ "$2" = skip ] || FAILED=1
}

# One interpreter: export, venv, install, the README's test command, a summary line.
# NAME ROOTDIR PYTHON  (ROOTDIR / for this machine)
run_one() {
    local name=$1 root=$2 python=$3 inside host_dir run_log rc counts info
    if [ "$root" = / ]; then inside=$WORK/$name; else inside=$INSIDE/$name; fi
    host_dir=${root%/}$inside
    run_log=$WORK/$name.log
    rm -rf "$host_dir"
    mkdir -p "$host_dir/src"
    [ "$root" = / ] || INSIDE_DIRS+=("$host_dir")
    git -C "$ROOT" archive HEAD | tar -x -C "$host_dir/src"
    local env=(/usr/bin/env -i PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
        HOME=/root LANG=C.UTF-8 PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_CERT=/etc/ssl/certs/ca-certificates.crt
        MEMRECLAIM_REQUIRE_ALLOCATORS=1)
    local wrap=()
    [ "$root" = / ] || wrap=(chroot "$root")

    log "$name: $python in ${root}, allocators: $(allocator_libs "$root")"
    # CPU seconds (user+sys, children included) next to wall time: on a busy machine only the
    # former says what a step would take alone (at best cpu/2 on 2 cores).
    local TIMEFORMAT='%R %U %S' installed took
    set +e
    {
        time timeout --kill-after=30 "$INSTALL_TIMEOUT" "${wrap[@]}" "${env[@]}" bash -c '
            set -e
            "$1" -m venv "$2/venv"
            "$2/venv/bin/pip" install -q -e "$2/src[test]"
        ' _ "$python" "$inside" >"$run_log" 2>&1
    } 2>"$WORK/$name.install-time"
    rc=$?
    set -e
    installed=$(awk '{printf "install %.0f s wall, %.0f s cpu", $1, $2 + $3}' "$WORK/$name.install-time")
    if [ "$rc" -ne 0 ]; then
        tail -40 "$run_log" | sed "s/^/  $name| /"
        summarize "$name" FAIL "install failed (exit $rc$([ "$rc" = 124 ] && echo ": timeout ${INSTALL_TIMEOUT}s")); $installed"
        return 0
    fi
    info=$("${wrap[@]}" "${env[@]}" "$inside/venv/bin/python" -c '
import platform, memreclaim
print(f"CPython {platform.python_version()}, glibc {platform.libc_ver()[1]}, allocator {memreclaim.allocator()}")
' 2>&1 | tail -1 || true)
    set +e
    {
        time timeout --kill-after=30 "$TEST_TIMEOUT" "${wrap[@]}" "${env[@]}" bash -c '
            cd "$1/src" && shift && exec "$@"
        ' _ "$inside" "$inside/venv/bin/python" -m pytest -n 2 --junitxml="$inside/junit.xml" \
            "${EXTRA_PYTEST[@]}" >>"$run_log" 2>&1
    } 2>"$WORK/$name.time"
    rc=$?
    set -e
    took=$(awk '{printf "pytest %.0f s wall, %.0f s cpu", $1, $2 + $3}' "$WORK/$name.time")
    counts=$(python3 - "$host_dir/junit.xml" <<'PY' 2>/dev/null || echo "no junit report"
import sys, xml.etree.ElementTree as ET
root = ET.parse(sys.argv[1]).getroot()
suites = [root] if root.tag == "testsuite" else root.findall("testsuite")
t = {k: sum(int(s.get(k, 0)) for s in suites) for k in ("tests", "failures", "errors", "skipped")}
passed = t["tests"] - t["failures"] - t["errors"] - t["skipped"]
print(f"passed={passed} failed={t['failures']} errors={t['errors']} skipped={t['skipped']}")
PY
)
    grep -E '^(FAILED|ERROR) ' "$run_log" | awk '!seen[$0]++' | head -40 | sed "s/^/  $name| /" || true
    if [ "$rc" -ne 0 ]; then
        tail -5 "$run_log" | sed "s/^/  $name| /"
    fi
    local status=ok why=""
    case $rc in
        0) ;;
        124) status=FAIL why=" (timeout ${TEST_TIMEOUT}s)" ;;
        5) status=FAIL why=" (no tests collected)" ;;
        *) status=FAIL why=" (pytest exit $rc)" ;;
    esac
    summarize "$name" "$status" "$info: $counts$why; $installed; $took"
}

# tools/wheels.sh sources this file for the chroot functions above (MATRIX_LIBRARY=1, no runs).
if [ "${MATRIX_LIBRARY:-}" = 1 ]; then return 0; fi

log "HEAD $(git -C "$ROOT" rev-parse --short HEAD), runs: ${RUNS[*]}, work dir $WORK"
for run in "${RUNS[@]}"; do
    case $run in
        debian-3.11)
            if [ ! -x /usr/bin/python3 ]; then summarize "$run" skip "no /usr/bin/python3"; continue; fi
            if [ "$(dpkg-query -W -f '${Status}\n' python3-dev python3-venv 2>/dev/null |
                grep -c 'ok installed')" != 2 ]; then
                log "installing python3-dev python3-venv for /usr/bin/python3"
                apt-get update -qq && apt-get install -y -qq --no-install-recommends python3-dev python3-venv >/dev/null
            fi
            run_one "$run" / /usr/bin/python3
            ;;
        pyenv-3.12 | pyenv-3.13)
            want=${run#pyenv-}
            py=$(ls -d /root/.pyenv/versions/"$want".*/bin/python3 2>/dev/null | sort -V | tail -1 || true)
            if [ -z "$py" ]; then
                summarize "$run" skip "no pyenv $want under /root/.pyenv/versions: not run"
                continue
            fi
            run_one "$run" / "$py"
            ;;
        trixie-3.13 | forky-3.14 | forky-3.15)
            suite=${run%-*}
            want=${run#*-}
            case $suite in trixie) versions="3.13" ;; forky) versions="3.14 3.15" ;; esac
            if ! chroot_for "$suite" "$versions"; then
                summarize "$run" FAIL "could not prepare the $suite chroot (see above)"
                continue
            fi
            run_one "$run" "$CHROOT_DIR" "/usr/bin/python$want"
            ;;
    esac
done

echo "== matrix summary (HEAD $(git -C "$ROOT" rev-parse --short HEAD))"
printf '%s\n' "${SUMMARY[@]}"
exit "$FAILED"
