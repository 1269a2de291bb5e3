"""Cross-build one memreclaim wheel with ``zig cc`` (tools/wheels.sh runs this, once per wheel).

    python tools/wheels_build.py --base BASE.whl --python 3.14 --arch aarch64 --glibc 2.28 \
        --include DIR [--include DIR ...] --out OUTDIR

The extensions are the ones setup.py defines (read by running setup.py with ``setup()``
replaced: the same sources, libraries and compile arguments as ``pip install``), compiled with
CPython's release flags (``-O3 -DNDEBUG -fwrapv -fPIC``) by ``zig cc -target
ARCH-linux-gnu.GLIBC``, which links against that glibc's symbol versions (libdl's and
libpthread's symbols at their pre-2.34 versions). BASE.whl is a wheel setuptools built from the
sdist on this machine: its Python files and metadata are taken as they are, its compiled modules
dropped, and WHEEL's tag and RECORD written for the new interpreter and architecture. The result
is a ``linux_ARCH`` wheel; tools/wheels.sh has auditwheel check and retag it.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import os
import runpy
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
# CPython's own CFLAGS/CCSHARED for a release build (sysconfig's, less the -g and the distro's
# hardening flags), then the extension's extra_compile_args as setuptools would pass them.
BASE_CFLAGS = ["-O3", "-DNDEBUG", "-fwrapv", "-fPIC", "-Wsign-compare", "-Wall"]


def extensions() -> list[Any]:
    """The Extension objects setup.py passes to setup(), setup.py run as for CPython 3.11+ Linux."""
    import setuptools

    captured: dict[str, Any] = {}
    real_setup = setuptools.setup
    setuptools.setup = lambda **kw: captured.update(kw)  # type: ignore[assignment]
    cwd = os.getcwd()
    try:
        os.chdir(ROOT)
        runpy.run_path(str(ROOT / "setup.py"), run_name="__main__")
    finally:
        os.chdir(cwd)
        setuptools.setup = real_setup
    exts = list(captured["ext_modules"])
    names = {e.name for e in exts}
    if sys.version_info < (3, 11) or names != {"memreclaim._core", "memreclaim._pools"}:
        raise SystemExit(f"wheels_build: expected _core and _pools from setup.py, got {exts}")
    return exts


def compile_extension(
    ext: Any, zig: list[str], target: str, includes: list[str], out: Path
) -> None:
    cmd = [*zig, "cc", "-target", target, "-shared", *BASE_CFLAGS, *ext.extra_compile_args]
    cmd += [f"-I{d}" for d in includes]
    for name, value in ext.define_macros:
        cmd.append(f"-D{name}" if value is None else f"-D{name}={value}")
    cmd += [str(ROOT / s) for s in ext.sources]
    cmd += ["-o", str(out), *(f"-l{lib}" for lib in ext.libraries)]
    print("wheels_build:", " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True, timeout=600)


def record_line(name: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", required=True, type=Path)
    parser.add_argument("--python", required=True, help="X.Y")
    parser.add_argument("--arch", required=True, choices=["x86_64", "aarch64"])
    parser.add_argument("--glibc", default="2.28")
    parser.add_argument("--include", action="append", required=True)
    parser.add_argument("--out", required=True, type=Path)
    args = parser.parse_args()

    major, minor = args.python.split(".")
    tag = f"cp{major}{minor}"
    suffix = f".cpython-{major}{minor}-{args.arch}-linux-gnu.so"  # EXT_SUFFIX on Linux
    target = f"{args.arch}-linux-gnu.{args.glibc}"
    zig = [sys.executable, "-m", "ziglang"]

    with zipfile.ZipFile(args.base) as base:
        names = base.namelist()
        contents = {n: base.read(n) for n in names}
    dist_info = next(n.split("/")[0] for n in names if n.split("/")[0].endswith(".dist-info"))
    dist, version = dist_info[: -len(".dist-info")].split("-")

    files: dict[str, bytes] = {}
    for name, data in contents.items():
        if name.endswith(".so") or name in (f"{dist_info}/WHEEL", f"{dist_info}/RECORD"):
            continue
        files[name] = data
    with tempfile.TemporaryDirectory() as tmp:
        for ext in extensions():
            so = Path(tmp) / (ext.name.rsplit(".", 1)[1] + suffix)
            compile_extension(ext, zig, target, args.include, so)
            files[ext.name.replace(".", "/") + suffix] = so.read_bytes()

    wheel_meta = contents[f"{dist_info}/WHEEL"].decode()
    kept = [
        line
        for line in wheel_meta.splitlines()
        if line.strip() and not line.startswith(("Tag:", "Root-Is-Purelib:"))
    ]
    kept += ["Root-Is-Purelib: false", f"Tag: {tag}-{tag}-linux_{args.arch}"]
    files[f"{dist_info}/WHEEL"] = ("\n".join(kept) + "\n").encode()
    record = [record_line(n, d) for n, d in files.items()]
    record.append(f"{dist_info}/RECORD,,")
    files[f"{dist_info}/RECORD"] = ("\n".join(record) + "\n").encode()

    args.out.mkdir(parents=True, exist_ok=True)
    wheel = args.out / f"{dist}-{version}-{tag}-{tag}-linux_{args.arch}.whl"
    with zipfile.ZipFile(wheel, "w", zipfile.ZIP_DEFLATED) as out:
        for name in sorted(files, key=lambda n: (n.startswith(dist_info), n)):
            info = zipfile.ZipInfo(name, date_time=(2026, 1, 1, 0, 0, 0))
            info.compress_type = zipfile.ZIP_DEFLATED
            info.external_attr = (0o755 if name.endswith(".so") else 0o644) << 16
            out.writestr(info, files[name])
    print(wheel)


if __name__ == "__main__":
    main()
