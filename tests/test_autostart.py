"""Zero-code activation (memreclaim.runners.autostart): the MEMRECLAIM variables, the start-up
hook, and the trimmer that follows forks and spawns. Each case runs in a fresh interpreter
(``sys.executable -c``), as a user's process would start; the real servers are
tests/test_servers_run.py's."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from memreclaim.runners import autostart

ROOT = Path(__file__).resolve().parent.parent
HOOK = "memreclaim-autostart.pth"
NAMES = (
    "MEMRECLAIM",
    "MEMRECLAIM_INTERVAL",
    "MEMRECLAIM_SLACK",
    "MEMRECLAIM_MIN_INTERVAL",
    "MEMRECLAIM_LIMIT",
)


def python(code: str, env: dict[str, str] | None = None, timeout: float = 120) -> tuple[dict, str]:
    """Run ``code`` in a fresh interpreter; it prints one JSON line last. (result, stderr)."""
    base = {k: v for k, v in os.environ.items() if k not in (*NAMES, "MEMRECLAIM_LOG")}
    base.pop("LD_PRELOAD", None)
    proc = subprocess.run(
        [sys.executable, "-c", code],
        env={**base, **(env or {})},
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.strip().splitlines()
    assert lines, f"no output; stderr:\n{proc.stderr}"
    return json.loads(lines[-1]), proc.stderr


STATE = """
import json, os, sys, threading
from memreclaim.runners import autostart
def state():
    runner = autostart.current()
    return {"pid": os.getpid(), "running": bool(runner and runner.running),
            "interval": runner.interval if runner else None,
            "slack": runner.policy.slack if runner else None,
            "limit": runner.policy.limit if runner else None,
            "threads": [t.name for t in threading.enumerate()]}
"""


def test_the_hook_is_installed_beside_the_package() -> None:
    """The build puts the start-up hook at the top of site-packages (wheel and editable)."""
    found = [
        Path(entry) / HOOK for entry in {*sys.path, sysconfig.get_path("purelib")} if entry
    ]
    installed = [path for path in found if path.is_file()]
    assert installed, f"{HOOK} not found in {sorted({str(p.parent) for p in found})}"
    source = ROOT / "src" / HOOK
    if source.exists():
        assert installed[0].read_text() == source.read_text()
    assert installed[0].read_text().startswith("import os;")


def test_unset_the_hook_imports_nothing() -> None:
    out, _ = python(
        "import json, sys\n"
        "print(json.dumps({'m': sorted(m for m in sys.modules if m.startswith('memreclaim'))}))"
    )
    assert out["m"] == []


@pytest.mark.parametrize("value", ["", "0", "off", "no", "FALSE"])
def test_off_values_start_nothing(value: str) -> None:
    assert autostart.settings_from_environment({"MEMRECLAIM": value}) is None
    out, err = python(STATE + "print(json.dumps(state()))", {"MEMRECLAIM": value})
    assert out["running"] is False and "Warning" not in err


def test_memreclaim_1_starts_a_trimmer_with_the_options() -> None:
    env = {"MEMRECLAIM": "1", "MEMRECLAIM_INTERVAL": "0.5", "MEMRECLAIM_SLACK": "32MiB"}
    out, err = python(STATE + "print(json.dumps(state()))", env)
    assert out["running"] is True, err
    assert out["interval"] == 0.5 and out["slack"] == 32 << 20
    assert autostart.RUNNER_NAME in out["threads"]


def test_a_forked_child_gets_its_own_trimmer() -> None:
    code = STATE + """
r, w = os.pipe()
parent_runner = autostart.current()
pid = os.fork()
if pid == 0:
    child = autostart.current()
    os.write(w, json.dumps({**state(), "same": child is parent_runner,
                            "ticks": child.counters.ticks if child else None}).encode())
    os._exit(0)
os.close(w)
child = json.loads(os.read(r, 100000))
os.waitpid(pid, 0)
print(json.dumps({"parent": state(), "child": child}))
"""
    out, err = python(code, {"MEMRECLAIM": "1"})
    assert out["parent"]["running"] and out["child"]["running"], err
    assert out["child"]["pid"] != out["parent"]["pid"]
    assert out["child"]["same"] is False  # a new trimmer, counters from zero
    assert out["child"]["ticks"] == 0


def run_child_of(method: str, tmp_path: Path, env: dict[str, str]) -> tuple[dict, str]:
    """A script whose multiprocessing child (``method``) reports whether its trimmer runs."""
    script = tmp_path / f"{method}.py"  # spawn pickles the target by name: a file, not -c
    script.write_text(STATE + f"""
import multiprocessing as mp
def probe(queue):
    from memreclaim.runners import autostart
    runner = autostart.current()
    queue.put({{"pid": os.getpid(), "running": bool(runner and runner.running)}})
if __name__ == "__main__":
    ctx = mp.get_context({method!r})
    queue = ctx.Queue()
    proc = ctx.Process(target=probe, args=(queue,))
    proc.start()
    child = queue.get(timeout=60)
    proc.join(60)
    print(json.dumps({{"child": child, "parent": state()}}))
""")
    return python(f"import runpy; runpy.run_path({str(script)!r}, run_name='__main__')", env)


def test_a_spawned_child_starts_one_through_the_hook(tmp_path: Path) -> None:
    """multiprocessing's spawn method (uvicorn --workers): a fresh interpreter, whose start-up
    hook reads the inherited MEMRECLAIM."""
    out, err = run_child_of("spawn", tmp_path, {"MEMRECLAIM": "1"})
    assert out["child"]["running"] is True, err
    assert out["child"]["pid"] != out["parent"]["pid"]


@pytest.mark.parametrize(
    ("env", "named"),
    [
        ({"MEMRECLAIM": "maybe"}, "MEMRECLAIM='maybe'"),
        ({"MEMRECLAIM": "1", "MEMRECLAIM_INTERVAL": "soon"}, "MEMRECLAIM_INTERVAL='soon'"),
        ({"MEMRECLAIM": "1", "MEMRECLAIM_INTERVAL": "-1"}, "MEMRECLAIM_INTERVAL='-1'"),
        ({"MEMRECLAIM": "1", "MEMRECLAIM_SLACK": "lots"}, "MEMRECLAIM_SLACK='lots'"),
        ({"MEMRECLAIM": "1", "MEMRECLAIM_MIN_INTERVAL": "0"}, "MEMRECLAIM_MIN_INTERVAL='0'"),
        ({"MEMRECLAIM": "1", "MEMRECLAIM_LOG": "loud"}, "MEMRECLAIM_LOG='loud'"),
        ({"MEMRECLAIM": "1", "MEMRECLAIM_LIMIT": "lots"}, "MEMRECLAIM_LIMIT='lots'"),
        ({"MEMRECLAIM": "1", "MEMRECLAIM_LIMIT": "0"}, "MEMRECLAIM_LIMIT='0'"),
    ],
)
def test_a_bad_value_warns_once_and_starts_nothing(env: dict[str, str], named: str) -> None:
    with pytest.raises(ValueError, match=named.split("=")[0]):
        autostart.settings_from_environment(env)
    out, err = python(STATE + "print(json.dumps(state()))", env)
    assert out["running"] is False
    assert err.count("RuntimeWarning") == 1 and named in err, err


def test_memreclaim_log_shows_the_start_line() -> None:
    out, err = python(
        STATE + "print(json.dumps(state()))", {"MEMRECLAIM": "1", "MEMRECLAIM_LOG": "info"}
    )
    assert out["running"] is True
    assert "trimmer started by MEMRECLAIM=1" in err, err


def test_run_exports_its_settings_and_follows_a_fork(tmp_path: Path) -> None:
    script = tmp_path / "prog.py"
    script.write_text(
        STATE
        + """
r, w = os.pipe()
pid = os.fork()
if pid == 0:
    os.write(w, json.dumps(state()).encode())
    os._exit(0)
os.close(w)
child = json.loads(os.read(r, 100000))
os.waitpid(pid, 0)
print(json.dumps({"parent": state(), "child": child,
                  "env": {k: os.environ.get(k) for k in ("MEMRECLAIM", "MEMRECLAIM_INTERVAL",
                                                         "MEMRECLAIM_SLACK")}}))
"""
    )
    base = {k: v for k, v in os.environ.items() if k not in (*NAMES, "MEMRECLAIM_LOG")}
    proc = subprocess.run(
        [sys.executable, "-m", "memreclaim", "run", "--interval", "0.5", "--", str(script)],
        env=base,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["parent"]["running"] and out["child"]["running"], proc.stderr
    assert out["child"]["interval"] == 0.5
    assert out["env"] == {
        "MEMRECLAIM": "1",
        "MEMRECLAIM_INTERVAL": "0.5",
        "MEMRECLAIM_SLACK": "",  # the policy's
    }
    assert proc.stderr.count("memreclaim run") == 1  # the child left with os._exit


def test_activate_rejects_bad_arguments_and_changes_nothing() -> None:
    before = autostart.current()
    with pytest.raises(TypeError, match="settings"):
        autostart.activate({"interval": 1})  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="export"):
        autostart.activate(export=1)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="timeout"):
        autostart.deactivate(-1)
    assert autostart.current() is before


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"interval": 0}, ValueError),
        ({"interval": "1"}, TypeError),
        ({"slack": "lots"}, ValueError),
        ({"min_interval": -1.0}, ValueError),
        ({"log": "loud"}, ValueError),
        ({"log": 20}, TypeError),
        ({"limit": "lots"}, ValueError),
        ({"limit": True}, TypeError),
        ({"limit": 0}, ValueError),
    ],
)
def test_settings_reject_bad_values(kwargs: dict[str, object], error: type[Exception]) -> None:
    with pytest.raises(error):
        autostart.Settings(**kwargs)  # type: ignore[arg-type]


def test_settings_from_environment_rejects_a_non_mapping() -> None:
    with pytest.raises(TypeError, match="mapping"):
        autostart.settings_from_environment(["MEMRECLAIM=1"])  # type: ignore[arg-type]


def test_settings_round_trip_through_the_environment() -> None:
    settings = autostart.Settings(interval=2.5, slack=10 << 20, min_interval=3.0, log="info")
    assert autostart.settings_from_environment(settings.environment()) == settings
    for limit in (None, "auto", 700 << 20):
        settings = autostart.Settings(limit=limit)
        assert autostart.settings_from_environment(settings.environment()) == settings
    assert autostart.settings_from_environment(autostart.Settings().environment()) == (
        autostart.Settings()
    )


def test_activate_in_process_then_deactivate() -> None:
    """In this process (pytest's): start, replace, stop; forks stop being followed."""
    first = autostart.activate(autostart.Settings(interval=0.5))
    try:
        assert autostart.current() is first and first.running
        second = autostart.activate(autostart.Settings(interval=0.7))
        assert not first.running and second.running and second.interval == 0.7
    finally:
        assert autostart.deactivate() is True
    assert autostart.current() is None
    assert autostart.deactivate() is True  # twice: nothing to do


@pytest.mark.parametrize(("text", "limit"), [("700MiB", 700 << 20), ("none", None)])
def test_memreclaim_limit_sets_the_trimmers_limit(text: str, limit: int | None) -> None:
    out, err = python(
        STATE + "print(json.dumps(state()))", {"MEMRECLAIM": "1", "MEMRECLAIM_LIMIT": text}
    )
    assert out["running"] is True, err
    assert out["limit"] == limit


def test_parse_limit_spellings_and_failures() -> None:
    assert autostart.parse_limit("L", " 1 GiB ") == 1 << 30
    assert autostart.parse_limit("L", "") == "auto"
    assert autostart.parse_limit("L", "AUTO") == "auto"
    assert autostart.parse_limit("L", "None") is None
    with pytest.raises(ValueError, match="L='-5'"):
        autostart.parse_limit("L", "-5")
    with pytest.raises(TypeError, match="L"):
        autostart.parse_limit("L", 5)  # type: ignore[arg-type]


def test_run_limit_option(tmp_path: Path) -> None:
    script = tmp_path / "prog.py"
    script.write_text(STATE + "print(json.dumps(state()))\n")
    base = {k: v for k, v in os.environ.items() if k not in (*NAMES, "MEMRECLAIM_LOG")}

    def run(limit: str) -> subprocess.CompletedProcess[str]:
        argv = [sys.executable, "-m", "memreclaim", "run", "--limit", limit, "--", str(script)]
        return subprocess.run(
            argv, env=base, capture_output=True, text=True, timeout=120, check=False
        )

    proc = run("512MiB")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout.strip().splitlines()[-1])["limit"] == 512 << 20
    bad = run("lots")
    assert bad.returncode == 2 and "--limit='lots'" in bad.stderr, bad.stderr
    assert bad.stdout == ""  # the program never ran


@pytest.mark.parametrize(
    ("argv", "helper"),
    [
        (
            ["py", "-B", "-c", "from multiprocessing.resource_tracker import main;main(3)"],
            ("multiprocessing's resource tracker", False),
        ),
        (
            ["py", "-c", "from multiprocessing.forkserver import main; main(3, 5)"],
            ("multiprocessing's forkserver", True),
        ),
        (["py", "-c", "from multiprocessing.spawn import spawn_main; spawn_main()"], None),
        (["py", "app.py", "-c", "from multiprocessing.forkserver import main"], None),
        (["py", "-X", "dev", "-Wignore", "-c", "from multiprocessing.forkserver import main"],
         ("multiprocessing's forkserver", True)),
        (["py", "-c"], None),
        ([], None),
    ],
)
def test_helper_process_is_told_by_its_command(
    argv: list[str], helper: tuple[str, bool] | None
) -> None:
    assert autostart.helper_process(argv) == helper


def test_helper_process_rejects_bad_argv() -> None:
    with pytest.raises(TypeError, match="sequence"):
        autostart.helper_process("python -c x")
    with pytest.raises(TypeError, match="argv item"):
        autostart.helper_process(["python", 3])  # type: ignore[list-item]


def test_multiprocessing_helpers_start_no_trimmer_but_the_forkserver_children_do(
    tmp_path: Path,
) -> None:
    """MEMRECLAIM=1 with the forkserver method: the resource tracker and the forkserver say
    they start none; the process the forkserver forks for the pool runs its own."""
    env = {"MEMRECLAIM": "1", "MEMRECLAIM_LOG": "info"}
    out, err = run_child_of("forkserver", tmp_path, env)
    assert out["parent"]["running"] and out["child"]["running"], err
    assert err.count("multiprocessing's resource tracker: it holds no user data") == 1, err
    assert err.count("multiprocessing's forkserver: it holds no user data") == 1, err
    assert err.count("trimmer started in forked process") == 1, err
    assert err.count("trimmer started by MEMRECLAIM=1") == 1, err  # the parent only
