"""The sdist carries what the docs and tests reference; the wheel carries the package only.

Builds both with ``python -m build --no-isolation`` (the installed setuptools, no network) into a
temporary directory: the sdist from the source tree, then the wheel from that sdist, so the sdist
is also proved buildable.
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
import sysconfig
import tarfile
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# Directories shipped whole in the sdist (MANIFEST.in grafts them).
GRAFTED = ("tests", "benchmarks", "docs", "tools")
BUILD_ARTEFACTS = re.compile(r"(__pycache__|\.egg-info|\.py[cod]$|\.so$|\.o$)")
# Scripts the docs tell people to run: they must stay executable in the sdist.
SCRIPTS = (
    ".ci/run",
    "tests/stress/run.sh",
    "tools/freethreaded_build.sh",
    "tools/sanitize.sh",
    "tools/wheels.sh",
)
# A path the docs mention: tools/x, tests/x, benchmarks/x, docs/x or .ci/run.
DOC_PATH = re.compile(r"(?<![\w/.-])((?:tools|tests|benchmarks|docs|\.ci)/[\w./-]*\w)")


def _build_tools_or_skip() -> None:
    if importlib.util.find_spec("build") is None:
        pytest.skip("the 'build' package is not installed (it is in the [test] extra)")
    import setuptools

    if int(setuptools.__version__.split(".")[0]) < 77:
        pytest.skip(f"setuptools {setuptools.__version__} < 77 (pyproject's build requirement)")
    if not (ROOT / "pyproject.toml").exists():
        pytest.skip(f"no source tree at {ROOT}")


@pytest.fixture(scope="module")
def dists(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    _build_tools_or_skip()
    out = tmp_path_factory.mktemp("dist")
    env = dict(os.environ, CFLAGS="-O0")  # compile fast: only the file list matters here
    proc = subprocess.run(
        [sys.executable, "-m", "build", "--no-isolation", "--outdir", str(out), str(ROOT)],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert proc.returncode == 0, f"python -m build failed:\n{proc.stdout[-3000:]}\n{proc.stderr}"
    sdists = list(out.glob("*.tar.gz"))
    wheels = list(out.glob("*.whl"))
    assert len(sdists) == 1 and len(wheels) == 1, sorted(p.name for p in out.iterdir())
    return sdists[0], wheels[0]


def _sdist_members(sdist: Path) -> dict[str, tarfile.TarInfo]:
    with tarfile.open(sdist) as tar:
        # Strip the "memreclaim-X.Y/" prefix.
        return {m.name.split("/", 1)[1]: m for m in tar.getmembers() if "/" in m.name}


def test_sdist_contains_the_tree_and_every_path_the_docs_name(dists: tuple[Path, Path]) -> None:
    members = _sdist_members(dists[0])
    missing = []
    for top in GRAFTED:
        for path in sorted((ROOT / top).rglob("*")):
            rel = path.relative_to(ROOT).as_posix()
            if path.is_file() and not BUILD_ARTEFACTS.search(rel) and rel not in members:
                missing.append(rel)
    for name in ("setup.py", "pyproject.toml", "README.md", "LICENSE", "CHANGELOG.md"):
        if name not in members:
            missing.append(name)
    for source in sorted((ROOT / "src" / "memreclaim").glob("*.[ch]")):
        if f"src/memreclaim/{source.name}" not in members:
            missing.append(f"src/memreclaim/{source.name}")
    assert not missing, f"missing from the sdist: {missing}"

    # Paths the docs mention exist in the sdist (relative to the root, or to docs/).
    texts = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    referenced = {m for text in texts for m in DOC_PATH.findall(text.read_text())}
    assert ".ci/run" in referenced  # the pattern does find references

    def shipped(ref: str) -> bool:
        ref = ref.rstrip("/")
        return any(
            name in members or any(m.startswith(name + "/") for m in members)
            for name in (ref, "docs/" + ref)
        )

    unshipped = sorted(ref for ref in referenced if not shipped(ref))
    assert not unshipped, f"the docs name paths the sdist lacks: {unshipped}"

    for script in SCRIPTS:
        assert script in members, script
        assert members[script].mode & 0o111, f"{script} is not executable in the sdist"


def test_wheel_has_the_package_but_no_c_sources(dists: tuple[Path, Path]) -> None:
    with zipfile.ZipFile(dists[1]) as wheel:
        names = wheel.namelist()
    package = [n for n in names if n.startswith("memreclaim/")]
    assert not [n for n in names if n.endswith((".c", ".h"))], names
    assert "memreclaim/py.typed" in names
    assert "memreclaim/_core.pyi" in names
    assert any(re.fullmatch(r"memreclaim/_core\..*\.so", n) for n in names), names
    assert "memreclaim/__init__.py" in package
    assert not [n for n in names if n.startswith(("tests/", "benchmarks/", "tools/", "docs/"))]
    # One wheel per interpreter (no abi3): the tag names this interpreter's ABI.
    tag = f"cp{sys.version_info.major}{sys.version_info.minor}"
    abi = tag + ("t" if sysconfig.get_config_var("Py_GIL_DISABLED") else "")
    assert f"-{tag}-{abi}-" in dists[1].name and "abi3" not in dists[1].name, dists[1].name


def _wheels_sh_list(name: str) -> list[str]:
    """A bash array of tools/wheels.sh, e.g. VERSIONS=(3.11 3.12 ...)."""
    text = (ROOT / "tools" / "wheels.sh").read_text()
    match = re.search(rf"^{name}=\(([^)]*)\)", text, re.MULTILINE)
    assert match, f"no {name}=(...) in tools/wheels.sh"
    return match.group(1).split()


def test_cibuildwheel_builds_and_tests_what_tools_wheels_sh_does() -> None:
    """The release pipeline ([tool.cibuildwheel]) and tools/wheels.sh: same wheels, same tests."""
    import tomllib

    if not (ROOT / "tools" / "wheels.sh").exists():
        pytest.skip(f"no source tree at {ROOT}")
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    cibw = project["tool"]["cibuildwheel"]
    versions = _wheels_sh_list("VERSIONS")
    assert cibw["build"] == [f"cp{v.replace('.', '')}-*" for v in versions]
    assert cibw["linux"]["archs"] == _wheels_sh_list("ARCHES")
    plat = re.search(r"^PLAT=(\S+)$", (ROOT / "tools" / "wheels.sh").read_text(), re.MULTILINE)
    assert plat and cibw["manylinux-x86_64-image"] == cibw["manylinux-aarch64-image"] == plat[1]
    assert project["project"]["requires-python"] == f">={versions[0]}"
    # The test files: the CI matrix's (MATRIX_DEFAULT_TESTS in .ci/run), which tools/wheels.sh runs.
    ci = (ROOT / ".ci" / "run").read_text()
    matrix = " ".join(re.findall(r'^MATRIX_DEFAULT_TESTS\+?="(.*)"$', ci, re.MULTILINE)).split()
    pytest_command = [c for c in cibw["test-command"] if "pytest" in c]
    assert len(pytest_command) == 1
    files = [w for w in pytest_command[0].replace("\\\n", " ").split() if w.startswith("tests/")]
    assert files == matrix and matrix, (files, matrix)
    assert "python wheels_check.py" in cibw["test-command"]
    assert "tools/wheels_check.py" in cibw["test-sources"]


def test_setup_py_on_another_platform_stops_with_one_message(tmp_path: Path) -> None:
    code = (
        # setuptools first: under a faked platform its import would load macOS-only modules
        "import runpy, sys, setuptools; sys.platform = 'darwin';"
        "sys.argv = ['setup.py', 'bdist_wheel'];"
        f"runpy.run_path({str(ROOT / 'setup.py')!r}, run_name='__main__')"
    )
    if not (ROOT / "setup.py").exists():
        pytest.skip(f"no source tree at {ROOT}")
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=ROOT
    )
    assert proc.returncode == 1, proc
    assert proc.stdout == "" and proc.stderr.count("\n") <= 1, proc.stderr
    assert "Linux only" in proc.stderr and "'darwin'" in proc.stderr, proc.stderr
