"""Docs that run: every example of README.md and docs/**/*.md, run as written.

Each fenced ```` ```python ```` block runs in a fresh interpreter (``sys.executable``, in a tmp
directory, under an overall timeout); a block that is a test module (top-level ``test_*``
functions) runs under ``python -m pytest`` there instead, with the suite's own pytest-asyncio
mode (strict), the way docs/pytest-plugin.md says to run it. Each ```` ```sh ````/
```` ```bash ````/```` ```console ```` command that invokes ``python -m memreclaim``,
``memreclaim`` or ``python -m pytest`` runs against the installed package (``python`` and
``python3`` are ``sys.executable``); a command naming a PID (``PID``, ``--pid N``,
``inspect N``) gets the PID of a target process the test starts. Any other command in an
unmarked block fails the test: mark its block ``skip`` with the reason. The mark-up (the line
directly before a fence) is described in tests/docs_blocks.py. Blocks listed in ``SLOW`` run
only under ``-m slow``; ``server`` blocks only under ``-m server``.
"""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import ready_child
from docs_blocks import (
    PYTHON,
    ROOT,
    SHELL,
    Block,
    Command,
    MarkupError,
    all_blocks,
    blocks,
    documents,
    is_pytest_file,
    python_source,
    shell_commands,
)

# Blocks too expensive for the default run (target: all the rest in < 90 s of CPU): the file
# and a string only that block contains. test_slow_entries_name_blocks keeps this list true.
SLOW = {
    ("docs/guide.md", "python -m memreclaim demo\n"),  # the demo's spike, traced: ~10 s of CPU
    ("docs/guide.md", "--workload buffers"),
    ("docs/cli.md", "$ python -m memreclaim demo"),
    ("docs/pytest-plugin.md", "def test_handler_does_not_leak"),  # 160,000 strings, traced
    ("docs/pytest-plugin.md", "def test_survivors_pin_arenas"),  # 1M dicts, traced
    ("docs/pytest-plugin.md", "def test_parse(memory)"),
}

# Test modules whose doc says they fail (docs/pytest-plugin.md, "What a failure looks like"):
# these tests must fail with the plugin's leak message, every other test of the block pass.
EXPECTED_FAILURES = {
    "test_handler_does_not_leak": "per run (Python)",
    "test_codec_does_not_leak": "per run (native",
}

TIMEOUT = 120.0  # per block, default run
SLOW_TIMEOUT = 900.0

# A process for the commands that need one: it spiked (so a trim has something to give back),
# installed the signal handler (`trim --pid` / `stats --pid` on any Python) and waits.
TARGET = """
import os, signal, sys, time
import memreclaim
from memreclaim import workloads
memreclaim.install_signal_handler(signal.SIGUSR2)
data = workloads.strings(40_000)
keep = workloads.keep_every(data, 50)
del data
print("ready", flush=True)
end = time.monotonic() + 600
while time.monotonic() < end:
    time.sleep(0.05)
"""


def _slow(block: Block) -> bool:
    where = block.doc
    text = "".join([block.text, *(b.text for b in block.follows)])
    return any(where == path and needle in text for path, needle in SLOW)


def _params() -> list[object]:
    params = []
    for block in all_blocks():
        if block.lang != PYTHON and block.lang not in SHELL:
            continue
        marks = []
        if block.mark == "server":
            marks.append(pytest.mark.server)
        elif _slow(block):
            marks.append(pytest.mark.slow)
        params.append(pytest.param(block, id=block.where, marks=marks))
    return params


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env.pop("LD_PRELOAD", None)
    env.pop("PYTHONUNBUFFERED", None)
    # the child's pytest and asyncio must not inherit this session's xdist/pytest plumbing
    for name in ("PYTEST_ADDOPTS", "PYTEST_XDIST_WORKER", "PYTEST_XDIST_WORKER_COUNT"):
        env.pop(name, None)
    return env


def _run(
    argv: list[str], *, where: str, cwd: Path, timeout: float, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    full_env = _env()
    full_env.update(env or {})
    try:
        return subprocess.run(
            argv, cwd=cwd, env=full_env, capture_output=True, text=True, timeout=timeout
        )
    except subprocess.TimeoutExpired as exc:
        out = exc.stdout.decode(errors="replace") if isinstance(exc.stdout, bytes) else exc.stdout
        err = exc.stderr.decode(errors="replace") if isinstance(exc.stderr, bytes) else exc.stderr
        pytest.fail(
            f"{where}: still running after {timeout:g} s: {' '.join(argv)}\n"
            f"--- stdout\n{out or ''}\n--- stderr\n{err or ''}",
            pytrace=False,
        )


def _script(block: Block) -> tuple[str, list[tuple[int, Block]]]:
    """The block and its `continues` blocks as one script, and where each starts in it."""
    parts, starts, line = [], [], 1
    for part in [block, *block.follows]:
        code = python_source(part.text)
        starts.append((line, part))
        parts.append(code)
        line += code.count("\n")
    return "".join(parts), starts


def _doc_line(script_line: int, starts: list[tuple[int, Block]]) -> str:
    for start, part in reversed(starts):
        if script_line >= start:
            return f"{part.doc}:{part.first_line + script_line - start}"
    return "?"


def _failure(block: Block, what: str, proc: subprocess.CompletedProcess[str], starts=None) -> str:
    located = ""
    if starts is not None:
        lines = [int(n) for n in re.findall(r'File ".*?example\.py", line (\d+)', proc.stderr)]
        if lines:
            located = f" (the error is at {_doc_line(lines[-1], starts)})"
    return (
        f"{block.where}: {what} exited {proc.returncode}{located}\n"
        f"--- stdout\n{proc.stdout}\n--- stderr\n{proc.stderr}"
    )


def _run_python(block: Block, tmp_path: Path, timeout: float) -> None:
    code, starts = _script(block)
    if block.mark == "partial":
        try:
            compile(code, block.where, "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
        except SyntaxError as exc:
            pytest.fail(f"{block.where}: a partial block that does not compile: {exc}", False)
        return
    if is_pytest_file(code):
        _run_pytest_module(block, code, starts, tmp_path, timeout)
        return
    script = tmp_path / "example.py"
    script.write_text(code)
    proc = _run([sys.executable, str(script)], where=block.where, cwd=tmp_path, timeout=timeout)
    if proc.returncode != 0:
        pytest.fail(_failure(block, "the example", proc, starts), pytrace=False)


def _run_pytest_module(
    block: Block, code: str, starts: list[tuple[int, Block]], tmp_path: Path, timeout: float
) -> None:
    module = tmp_path / "test_example.py"
    module.write_text(code)
    # the suite's own pytest-asyncio settings (pyproject.toml: asyncio_mode = "strict")
    (tmp_path / "pytest.ini").write_text(
        "[pytest]\nasyncio_mode = strict\nasyncio_default_fixture_loop_scope = function\n"
    )
    argv = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-rA", "-v", module.name]
    proc = _run(argv, where=block.where, cwd=tmp_path, timeout=timeout)
    out = proc.stdout
    tests = re.findall(r"^(?:async )?def (test_\w+)\(", code, re.MULTILINE)
    problems = []
    for name in tests:
        outcome = re.search(rf"test_example\.py::{name} (PASSED|FAILED|SKIPPED|ERROR|XFAIL)", out)
        got = outcome[1] if outcome else "not run"
        expected = "FAILED" if name in EXPECTED_FAILURES else "PASSED"
        if got != expected:
            problems.append(f"{name}: {got}, the doc says it {expected.lower()}")
        elif name in EXPECTED_FAILURES and EXPECTED_FAILURES[name] not in out:
            problems.append(f"{name} failed, but not with '... {EXPECTED_FAILURES[name]}'")
    if problems:
        pytest.fail(
            f"{block.where}: python -m pytest {module.name}: "
            + "; ".join(problems)
            + f"\n--- stdout\n{out}\n--- stderr\n{proc.stderr}",
            pytrace=False,
        )


def _needs_target(command: Command) -> bool:
    argv = command.argv
    return "PID" in argv or any(
        (word in ("--pid", "inspect")) and i + 1 < len(argv) and argv[i + 1].isdigit()
        for i, word in enumerate(argv)
    )


def _with_pid(argv: list[str], pid: int) -> list[str]:
    out = list(argv)
    for i, word in enumerate(out):
        if word == "PID" or (i and out[i - 1] in ("--pid", "inspect") and word.isdigit()):
            out[i] = str(pid)
    return out


def _argv(command: Command) -> tuple[list[str], Path | None]:
    """What to run for a documented command, and in which directory (None: a tmp one)."""
    argv = command.argv
    head = argv[0]
    if head in ("python", "python3", ".venv/bin/python") and argv[1:2] == ["-m"]:
        if argv[2:3] == ["memreclaim"]:
            return [sys.executable, "-m", "memreclaim", *argv[3:]], None
        if argv[2:3] == ["pytest"]:
            return [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *argv[3:]], ROOT
    if head == "memreclaim":
        script = Path(sys.executable).with_name("memreclaim")
        if script.exists():
            return [str(script), *argv[1:]], None
        return [sys.executable, "-m", "memreclaim", *argv[1:]], None
    where = f"{command.text!r}"
    raise pytest.fail.Exception(
        f"cannot run {where} as written: only python -m memreclaim, memreclaim and python -m"
        " pytest are run; mark the block '<!-- docs-test: skip: REASON -->'"
    )


@pytest.fixture
def target() -> Iterator[int]:
    with ready_child(TARGET) as proc:
        yield proc.pid


def _run_shell(
    block: Block, tmp_path: Path, timeout: float, request: pytest.FixtureRequest
) -> None:
    commands = [c for part in [block, *block.follows] for c in shell_commands(part)]
    assert commands, f"{block.where}: a {block.lang} block with no command in it"
    planned = []
    for command in commands:
        try:
            planned.append((command, *_argv(command)))
        except pytest.fail.Exception as exc:
            pytest.fail(f"{block.doc}:{command.line}: {exc}", pytrace=False)
    for command, argv, cwd in planned:
        if _needs_target(command):
            argv = _with_pid(argv, request.getfixturevalue("target"))
        where = f"{block.doc}:{command.line}"
        proc = _run(argv, where=where, cwd=cwd or tmp_path, timeout=timeout, env=command.env)
        if proc.returncode != 0:
            pytest.fail(
                f"{where}: `{command.text}` exited {proc.returncode}\n"
                f"--- stdout\n{proc.stdout}\n--- stderr\n{proc.stderr}",
                pytrace=False,
            )


@pytest.mark.parametrize("block", _params())
def test_documented_example_runs(
    block: Block, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    if block.mark == "skip":
        pytest.skip(f"{block.where}: {block.reason}")
    if block.mark == "server":
        pytest.skip(f"{block.where}: a server example; tests/test_servers.py runs the servers")
    timeout = SLOW_TIMEOUT if _slow(block) else TIMEOUT
    if block.lang == PYTHON:
        _run_python(block, tmp_path, timeout)
    else:
        if block.mark == "partial":
            return  # a fragment of a session: nothing to compile
        _run_shell(block, tmp_path, timeout, request)


# ---- the harness itself ---------------------------------------------------------------------


def test_every_document_is_read() -> None:
    names = {str(p.relative_to(ROOT)) for p in documents()}
    assert {"README.md", "docs/guide.md", "docs/api.md", "docs/benchmarks/servers.md"} <= names
    assert sum(len(blocks(p)) for p in documents()) >= 30


def test_slow_entries_name_blocks() -> None:
    """Each SLOW entry matches a block: a stale one would put an expensive block back into the
    default run unseen."""
    every = all_blocks()
    for path, needle in SLOW:
        texts = ["".join([b.text, *(f.text for f in b.follows)]) for b in every if b.doc == path]
        assert any(needle in text for text in texts), f"SLOW: no block of {path} has {needle!r}"


def _doc(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "page.md"
    path.write_text(textwrap.dedent(text))
    return path


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("<!-- docs-test: skip -->\n```python\npass\n```\n", "needs a reason"),
        ("<!-- docs-test: partial -->\n```python\npass\n```\n", "needs a reason"),
        ("<!-- docs-test: sometimes -->\n```python\npass\n```\n", "unknown docs-test mark"),
        ("<!-- docs-test: continues -->\n```python\npass\n```\n", "needs a previous python"),
        ("<!-- docs-test: server: why -->\n```sh\nls\n```\n", "takes no reason"),
        ("<!-- docs-test: skip: why -->\n```\noutput\n```\n", "without a language"),
        ("```python\npass\n", "never closed"),
    ],
)
def test_bad_markup_is_refused(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(MarkupError, match=message):
        blocks(_doc(tmp_path, text))


def test_markup_and_continues_are_read(tmp_path: Path) -> None:
    found = blocks(
        _doc(
            tmp_path,
            """\
            ```python
            x = 1
            ```
            text
            <!-- docs-test: continues -->
            ```python
            print(x)
            ```
            <!-- docs-test: skip: pip install -->
            ```sh
            pip install memreclaim
            ```
            - a list item:

               ```console
               $ FOO=1 python -m memreclaim stats --pid 12 && memreclaim inspect PID  # both
               output
               ```
            """,
        )
    )
    assert [(b.lang, b.mark, b.reason, len(b.follows)) for b in found] == [
        ("python", None, None, 1),
        ("sh", "skip", "pip install", 0),
        ("console", None, None, 0),
    ]
    script, starts = _script(found[0])
    assert script == "x = 1\nprint(x)\n"
    assert _doc_line(2, starts).endswith("page.md:7")
    commands = shell_commands(found[2])
    assert [(c.env, c.argv) for c in commands] == [
        ({"FOO": "1"}, ["python", "-m", "memreclaim", "stats", "--pid", "12"]),
        ({}, ["memreclaim", "inspect", "PID"]),
    ]
    assert all(_needs_target(c) for c in commands)
    assert _with_pid(commands[1].argv, 7) == ["memreclaim", "inspect", "7"]


def test_a_broken_python_example_fails_naming_its_line(tmp_path: Path) -> None:
    page = _doc(tmp_path, "intro\n\n```python\nimport memreclaim\nmemreclaim.no_such_call()\n```\n")
    (block,) = blocks(page)
    with pytest.raises(pytest.fail.Exception) as failed:
        _run_python(block, tmp_path, TIMEOUT)
    assert "the error is at " + f"{page}:5" in str(failed.value), failed.value
    assert "AttributeError" in str(failed.value)


def test_a_partial_block_is_compiled_only(tmp_path: Path) -> None:
    page = _doc(
        tmp_path,
        "<!-- docs-test: partial: a fragment -->\n"
        "```python\nasync with w:\n    await serve()\n```\n"
        "<!-- docs-test: partial: broken -->\n```python\ndef f(:\n```\n",
    )
    good, bad = blocks(page)
    _run_python(good, tmp_path, TIMEOUT)  # top-level await compiles; serve() is never called
    with pytest.raises(pytest.fail.Exception, match="does not compile"):
        _run_python(bad, tmp_path, TIMEOUT)


def test_an_unrunnable_command_must_be_marked(tmp_path: Path) -> None:
    (block,) = blocks(_doc(tmp_path, "```sh\nbash tools/sanitize.sh\n```\n"))
    with pytest.raises(pytest.fail.Exception, match="mark the block"):
        _run_shell(block, tmp_path, TIMEOUT, request=None)  # type: ignore[arg-type]


def test_a_failing_command_fails_naming_its_line(tmp_path: Path) -> None:
    (block,) = blocks(_doc(tmp_path, "```sh\npython -m memreclaim stats --no-such-option\n```\n"))
    with pytest.raises(
        pytest.fail.Exception,
        match=r"page\.md:2: `python -m memreclaim stats --no-such-option` exited 2",
    ):
        _run_shell(block, tmp_path, TIMEOUT, request=None)  # type: ignore[arg-type]


def test_an_unmarked_async_test_fails_under_strict_mode(tmp_path: Path) -> None:
    """The plugin doc's async examples must carry pytest-asyncio's marker: without it the
    suite's strict mode does not run them, and the harness says so."""
    code = "async def test_x():\n    pass\n"
    block = Block(tmp_path / "page.md", 1, "python", code)
    with pytest.raises(pytest.fail.Exception, match=r"test_x: (FAILED|SKIPPED), the doc says"):
        _run_pytest_module(block, code, [(1, block)], tmp_path, TIMEOUT)


def test_the_readme_links_every_page() -> None:
    readme = (ROOT / "README.md").read_text()
    linked = set(re.findall(r"\]\((docs/[^)#]+\.md)", readme))
    pages = {str(p.relative_to(ROOT)) for p in documents()} - {"README.md"}
    assert not pages - linked, f"README.md's documentation list leaves out {sorted(pages - linked)}"


def test_platforms_gives_the_ci_step_bounds_of_ci_run() -> None:
    """docs/platforms.md's table of CI steps states each step's bound as .ci/run sets it."""
    script = (ROOT / ".ci" / "run").read_text()
    declared = re.search(r"declare -A BOUND=\((.*?)\)\n", script, re.DOTALL)
    assert declared, ".ci/run: no `declare -A BOUND=(...)` found"
    bounds = {name: int(sec) for name, sec in re.findall(r"\[(\w+)\]=(\d+)", declared[1])}
    steps = re.search(r"^STEPS=\((.*?)\)", script, re.MULTILINE)
    assert steps
    page = (ROOT / "docs" / "platforms.md").read_text()
    table = page.split("## CI steps", 1)[1].split("\n## ", 1)[0]
    documented = {
        row[0]: row[-1]
        for row in (
            [cell.strip() for cell in line.strip().strip("|").split("|")]
            for line in table.splitlines()
            if line.startswith("| ")
        )
        if row[0] in bounds
    }
    assert set(documented) == {"setup", *steps[1].split()}, f"steps documented: {documented}"
    for step, cell in documented.items():
        assert cell == f"{bounds[step] // 60} min" and bounds[step] % 60 == 0, (
            f"docs/platforms.md gives the {step} step {cell!r}; .ci/run's bound is {bounds[step]} s"
        )
