"""A second local user attacks ``trim --pid`` / ``stats --pid`` and the signal handler.

The test creates a throwaway unprivileged user (``useradd``; skipped, saying why, when not root
or without useradd; always removed with ``userdel -r``), runs the attacker's actions as that
user, and runs the operator's command as root: one test per finding of the out-of-process path
(issue 30). Nothing here waits on time: every wait polls a condition with an overall deadline.
"""

from __future__ import annotations

import json
import os
import pwd
import random
import secrets
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from memreclaim import remote

TMP = tempfile.gettempdir()
SRC = str(Path(remote.__file__).resolve().parents[1])


@dataclass(frozen=True)
class User:
    name: str
    uid: int
    gid: int
    python: str  # an interpreter this user may run (sys.executable may sit under /root)


@pytest.fixture(scope="module")
def attacker() -> Iterator[User]:
    if os.geteuid() != 0:
        pytest.skip("creating a second local user to attack with needs root")
    if shutil.which("useradd") is None or shutil.which("userdel") is None:
        pytest.skip("useradd/userdel not found: cannot create the attacking user")
    name = f"mrat{secrets.token_hex(4)}"
    made = subprocess.run(
        ["useradd", "--create-home", "--shell", "/bin/sh", name], capture_output=True, text=True
    )
    if made.returncode != 0:
        pytest.skip(f"useradd failed: {made.stderr.strip()}")
    try:
        pw = pwd.getpwnam(name)
        yield User(name, pw.pw_uid, pw.pw_gid, _python_for(pw.pw_uid, pw.pw_gid))
    finally:
        if shutil.which("pkill"):  # each test ends its processes; this is the safety net
            subprocess.run(["pkill", "-KILL", "-u", name], capture_output=True)
        subprocess.run(["userdel", "-r", name], capture_output=True)


def _python_for(uid: int, gid: int) -> str:
    """The first interpreter of this Python version that ``uid`` can run memreclaim with."""
    version = f"python{sys.version_info[0]}.{sys.version_info[1]}"
    for python in (sys.executable, shutil.which(version), f"/usr/bin/{version}"):
        if python is None:
            continue
        try:
            done = subprocess.run(
                [python, "-c", "import memreclaim"],
                user=uid,
                group=gid,
                extra_groups=[],
                env=_env(),
                cwd="/tmp",
                capture_output=True,
                timeout=60,
            )
        except OSError:
            continue
        if done.returncode == 0:
            return python
    pytest.skip(f"no {version} that the attacking user may run memreclaim with")


def wait_for(what: str, condition: Callable[[], bool], deadline: float = 60.0) -> None:
    end = time.monotonic() + deadline
    while not condition():
        if time.monotonic() > end:
            raise AssertionError(f"timed out after {deadline:g} s waiting for {what}")
        time.sleep(0.02)


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEMRECLAIM")}
    env["PYTHONPATH"] = SRC
    env["HOME"] = "/tmp"
    return env


def as_user(
    user: User | None, code: str, *argv: str, **kw: Any
) -> subprocess.CompletedProcess[str]:
    """Run ``code`` (with ``argv``) in a fresh interpreter as ``user`` (None: as root), to
    completion."""
    ids: dict[str, Any] = {} if user is None else {"user": user.uid, "group": user.gid}
    return subprocess.run(
        [sys.executable if user is None else user.python, "-c", code, *argv],
        capture_output=True,
        text=True,
        timeout=120,
        cwd="/tmp",
        env=_env(),
        extra_groups=[] if user else None,
        **ids,
        **kw,
    )


# A service driven line by line on stdin: "install", "ignore", "exec PATH" (what sys.remote_exec
# does in a 3.14 target), "closefds PATH" (a daemon closing what it inherited), "quit".
SERVICE = r"""
import logging, os, signal, sys
import memreclaim
logging.basicConfig(level=logging.INFO, stream=sys.stderr)
print("READY", os.getpid(), flush=True)
for line in sys.stdin:
    cmd, _, arg = line.strip().partition(" ")
    try:
        if cmd == "install":
            print("OK", memreclaim.install_signal_handler(signal.SIGUSR2), flush=True)
        elif cmd == "ignore":
            signal.signal(signal.SIGUSR2, signal.SIG_IGN)
            print("OK", flush=True)
        elif cmd == "exec":
            exec(compile(open(arg).read(), arg, "exec"), {})
            print("OK", flush=True)
        elif cmd == "closefds":
            os.closerange(3, 256)
            fds = [os.open(arg + str(i), os.O_RDWR | os.O_CREAT, 0o600) for i in range(8)]
            print("OK", flush=True)
        elif cmd == "quit":
            break
    except Exception as exc:
        print("ERR", type(exc).__name__, exc, flush=True)
"""


class Service:
    def __init__(self, user: User | None) -> None:
        ids: dict[str, Any] = {} if user is None else {"user": user.uid, "group": user.gid}
        self.stderr = tempfile.TemporaryFile("w+")  # noqa: SIM115 (closed in close())
        self.proc = subprocess.Popen(
            [sys.executable if user is None else user.python, "-c", SERVICE],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.stderr,
            text=True,
            cwd="/tmp",
            env=_env(),
            extra_groups=[] if user else None,
            **ids,
        )
        self.pid = int(self.line().split()[1])

    def line(self) -> str:
        assert self.proc.stdout is not None
        ready, _, _ = select.select([self.proc.stdout], [], [], 60)
        assert ready, f"the service printed nothing within 60 s: {self.log()}"
        line: str = self.proc.stdout.readline()
        return line

    def log(self) -> str:
        self.stderr.seek(0)
        return self.stderr.read()

    def do(self, command: str) -> str:
        assert self.proc.stdin is not None
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()
        answer = self.line()
        assert answer.startswith("OK"), f"{command}: {answer!r} {self.log()}"
        return answer[2:].strip()

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(60)
        self.stderr.close()


@pytest.fixture
def service() -> Iterator[Callable[[User | None], Service]]:
    started: list[Service] = []

    def start(user: User | None) -> Service:
        started.append(Service(user))
        return started[-1]

    yield start
    for s in started:
        s.close()


@pytest.fixture
def cleanup() -> Iterator[list[str]]:
    paths: list[str] = []
    yield paths
    for path in paths:
        shutil.rmtree(path, ignore_errors=True)


def _plant(user: User, pid: int, marker: Any, raw: str | None = None, mode: int = 0o755) -> str:
    """As ``user``: create /tmp/memreclaim-PID holding ``marker`` as handler.json."""
    directory = os.path.join(TMP, f"memreclaim-{pid}")
    text = raw if raw is not None else json.dumps(marker)
    done = as_user(
        user,
        f"import os\nos.makedirs({directory!r}, exist_ok=True)\nos.chmod({directory!r}, {mode})\n"
        f"open({directory!r} + '/handler.json', 'w').write({text!r})\n",
    )
    assert done.returncode == 0, done.stderr
    return directory


def test_planted_marker_cannot_choose_the_signal(
    attacker: User, service: Callable[..., Service], cleanup: list[str]
) -> None:
    """Finding: another user planted {"signal": 9} for root's process; root's trim killed it."""
    victim = service(None)
    cleanup.append(
        _plant(
            attacker,
            victim.pid,
            {"pid": victim.pid, "signal": 9, "start_time": remote._start_time(victim.pid)},
        )
    )
    proc = subprocess.run(
        [sys.executable, "-m", "memreclaim", "trim", "--pid", str(victim.pid), "--timeout", "5"],
        capture_output=True,
        text=True,
        timeout=120,
        env=_env(),
    )
    assert victim.proc.poll() is None, "the attacker's signal was sent to the victim"
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    # 3.14+ tries sys.remote_exec first (the victim runs no Python code to take it: no answer)
    said = "sys.remote_exec" if hasattr(sys, "remote_exec") else "no memreclaim signal handler"
    assert said in proc.stderr, proc.stderr


def test_forged_reply_is_not_believed(
    attacker: User, service: Callable[..., Service], cleanup: list[str]
) -> None:
    """Finding: another user answered root's request: "released 115.0 GiB", exit 0."""
    victim = service(None)
    start = remote._start_time(victim.pid)
    directory = _plant(
        attacker, victim.pid, {"pid": victim.pid, "signal": 28, "start_time": start}, mode=0o777
    )
    cleanup.append(directory)
    forger = r"""
import glob, json, os, time
end = time.monotonic() + 30
while time.monotonic() < end and not os.path.exists(DIR + "/stop"):
    for req in glob.glob(DIR + "/request-*.json"):
        try:
            r = json.load(open(req))
        except (OSError, ValueError):
            continue
        name = r.get("reply") or "reply-" + r.get("nonce", "") + ".json"
        result = {"released": 115 << 30, "allocator": "glibc", "method": "malloc_trim(0)",
                  "seconds": 0.1}
        open(DIR + "/" + name, "w").write(json.dumps({"pid": PID, "command": "trim",
            "via": "signal", "nonce": r.get("nonce"), "result": result}))
    time.sleep(0.01)
"""
    code = f"DIR = {directory!r}\nPID = {victim.pid}\n" + forger
    racer = subprocess.Popen(
        [attacker.python, "-c", code],
        user=attacker.uid,
        group=attacker.gid,
        extra_groups=[],
        cwd="/tmp",
    )
    try:
        with pytest.raises(remote.RemoteError, match="no memreclaim signal handler"):
            remote.request(victim.pid, "trim", method="signal", timeout=5)
    finally:
        Path(directory, "stop").touch()
        racer.wait(60)
    assert victim.proc.poll() is None


def test_fifo_reply_does_not_hang(attacker: User, service: Callable[..., Service]) -> None:
    """Finding: a FIFO in place of the reply blocked the command past its timeout."""
    target = service(attacker)
    directory = target.do("install")
    target.do("ignore")  # the handler never answers: only the attacker's FIFO will be there
    fifo_maker = r"""
import glob, os, time
end = time.monotonic() + 60
while time.monotonic() < end:
    for req in glob.glob(DIR + "/request-*.json"):
        try:
            os.mkfifo(req.replace("request-", "reply-"))
            raise SystemExit(0)
        except FileExistsError:
            raise SystemExit(0)
    time.sleep(0.005)
"""
    racer = subprocess.Popen(
        [attacker.python, "-c", f"DIR = {directory!r}\n" + fifo_maker],
        user=attacker.uid,
        group=attacker.gid,
        extra_groups=[],
        cwd="/tmp",
    )
    try:
        # run in a child: on the old code the command blocked in open() for good
        done = as_user(
            None,
            f"from memreclaim import remote\ntry:\n"
            f"    remote.request({target.pid}, method='signal', timeout=3)\n"
            f"except remote.RemoteError as exc:\n    print('REFUSED', exc)\n",
        )
    finally:
        racer.wait(120)
    assert racer.returncode == 0, "the attacker never saw a request"
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("REFUSED"), done.stdout
    assert "not a regular file" in done.stdout or "no answer in time" in done.stdout


MALFORMED = ['"abc"', "null", "1e300", "[1, 2]", "[" * 100_000 + "]" * 100_000]


def _fuzz_markers(pid: int, start: int | None, count: int) -> list[str]:
    """Malformed handler.json texts: the issue's six, then ``count`` seeded ones that each
    break one field of a good marker (a fixed number of cases)."""
    good: dict[str, Any] = {"pid": pid, "signal": int(signal.SIGUSR2), "start_time": start}
    cases = [*MALFORMED, json.dumps({k: v for k, v in good.items() if k != "signal"})]
    rng = random.Random(30)
    bad_values: list[Any] = [
        "abc",
        None,
        1e300,
        -1,
        0,
        9,
        15,
        11,
        2**64,
        [],
        {},
        True,
        1.5,
        float("nan"),
        "12",
    ]
    for _ in range(count):
        marker = dict(good)
        marker["signal"] = rng.choice(bad_values)
        if rng.random() < 0.3:
            marker[rng.choice(["pid", "start_time"])] = rng.choice(["x", [1], {"a": 1}])
        cases.append(json.dumps(marker))
    cases.append("\xff\xfe not utf-8")
    cases.append(" " * (1 << 17) + "{}")  # over the 64 KiB cap
    return cases


def test_malformed_markers_are_one_line(
    attacker: User, service: Callable[..., Service], cleanup: list[str]
) -> None:
    """Finding: six malformed markers each ended in a traceback. A marker the target's own user
    wrote (so the command does read it) that is malformed is one RemoteError line, and no signal
    is ever sent for it."""
    target = service(attacker)
    cases = _fuzz_markers(target.pid, remote._start_time(target.pid), 40)
    directory = _plant(attacker, target.pid, None, raw="{}", mode=0o700)
    cleanup.append(directory)
    for i, text in enumerate(cases):
        done = as_user(  # the target's own user writes its marker (root never does)
            attacker,
            "import sys; open(sys.argv[1], 'w').write(sys.stdin.read())",
            f"{directory}/handler.json",
            input=text,
        )
        assert done.returncode == 0, done.stderr
        if i < len(MALFORMED) + 1:  # the six through the command line
            proc = subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "memreclaim",
                    "trim",
                    "--pid",
                    str(target.pid),
                    "--method",
                    "signal",
                    "--timeout",
                    "5",
                ],
                capture_output=True,
                text=True,
                timeout=120,
                env=_env(),
            )
            assert proc.returncode == 1, (text[:40], proc.stderr)
            assert "Traceback" not in proc.stderr and proc.stderr.count("\n") == 1, proc.stderr
        else:
            try:
                answer = remote.request(target.pid, method="signal", timeout=5)
            except remote.RemoteError:
                pass
            else:
                raise AssertionError(f"a malformed marker was believed: {text!r} -> {answer}")
        assert target.proc.poll() is None, f"signal sent for marker {text[:60]!r}"


def test_remote_exec_script_is_out_of_the_target_users_reach(
    attacker: User,
    service: Callable[..., Service],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    """Finding: root chowned the work directory to the target's user, then wrote script.py and
    chmod-ed it 0644 through a name that user could turn into a link to a root-only file.
    ``sys.remote_exec`` is stubbed (before 3.14 it does not exist): the stub tries, as the
    target's user, to plant links and files next to the script, then has the target run it as
    sys.remote_exec would."""
    secret = tmp_path / "secret"
    secret.write_text("root only")
    secret.chmod(0o600)
    target = service(attacker)
    tries: list[str] = []

    def fake_remote_exec(pid: int, path: str) -> None:
        assert pid == target.pid
        st = os.lstat(path)
        assert stat_ok(st), f"script {oct(st.st_mode)} uid {st.st_uid}"
        attack = as_user(attacker, ATTACK_WORKDIR, path, str(secret))
        tries.extend(attack.stdout.split())
        target.do(f"exec {path}")

    monkeypatch.setattr(sys, "remote_exec", fake_remote_exec, raising=False)
    answer = remote.request(target.pid, "stats", method="remote_exec", timeout=30)
    assert tries == [], f"the target's user could {tries} in root's work directory"
    assert answer["via"] == "remote_exec" and answer["pid"] == target.pid, answer
    assert secret.read_text() == "root only" and secret.stat().st_mode & 0o777 == 0o600


def stat_ok(st: os.stat_result) -> bool:
    """The script as root leaves it: a regular file of root's, not writable by others."""
    import stat as st_

    return st_.S_ISREG(st.st_mode) and st.st_uid == os.geteuid() and not st.st_mode & 0o022


ATTACK_WORKDIR = r"""
import os, sys
path, secret = sys.argv[1:3]
d = os.path.dirname(path)
for name, act in [("link", lambda: os.symlink(secret, d + "/x.py")),
                  ("rename", lambda: os.rename(path, d + "/old.py")),
                  ("unlink", lambda: os.unlink(path)),
                  ("write", lambda: open(path, "a").write("#")),
                  ("chmod", lambda: os.chmod(d, 0o777))]:
    try:
        act()
        print(name)
    except OSError:
        pass
"""


def test_directory_held_by_another_user_does_not_deny(
    attacker: User, service: Callable[..., Service], cleanup: list[str]
) -> None:
    """Finding: another user pre-creating /tmp/memreclaim-PID made install_signal_handler raise
    PermissionError. The handler takes a name of its own, and the command finds it."""
    target = service(None)
    cleanup.append(_plant(attacker, target.pid, {"pid": target.pid, "signal": 9}, mode=0o777))
    directory = target.do("install")
    cleanup.append(directory)
    assert os.path.basename(directory).startswith(f"memreclaim-{target.pid}-")
    answer = remote.request(target.pid, "stats", method="signal", timeout=30)
    assert answer["pid"] == target.pid and answer["via"] == "signal", answer
    assert remote.state_dir(target.pid) == Path(directory)
    # a stale directory of another user's, or a link, in the way: the same
    target2 = service(None)
    link = os.path.join(TMP, f"memreclaim-{target2.pid}")
    done = as_user(attacker, f"import os\nos.symlink('/etc', {link!r})")
    assert done.returncode == 0, done.stderr
    cleanup.append(target2.do("install"))
    assert remote.request(target2.pid, "stats", method="signal", timeout=30)["pid"] == target2.pid
    os.unlink(link)


def test_forked_child_exit_leaves_the_parent_reachable(service: Callable[..., Service]) -> None:
    """Finding: a forked child exiting normally removed the parent's handler directory (atexit),
    so one gunicorn worker's exit made ``trim --pid <master>`` fail."""
    target = service(None)
    directory = target.do("install")
    child = "import os, sys\npid = os.fork()\nif pid == 0:\n    sys.exit(0)\nos.waitpid(pid, 0)\n"
    path = os.path.join(tempfile.mkdtemp(), "fork.py")
    Path(path).write_text(child)
    target.do(f"exec {path}")  # the child ran the interpreter's exit (atexit) and is gone
    assert os.path.isdir(directory)
    answer = remote.request(target.pid, "stats", method="signal", timeout=30)
    assert answer["pid"] == target.pid
    shutil.rmtree(os.path.dirname(path))


def test_daemon_reusing_descriptors_gets_no_byte(
    service: Callable[..., Service], tmp_path: Path
) -> None:
    """Finding: the handler's pipe write (and the wake-up thread's eventfd poke) wrote into
    whichever file a daemon opened after closing what it inherited."""
    target = service(None)
    target.do("install")
    files = str(tmp_path / "own")
    target.do(f"closefds {files}")  # like DaemonContext: close inherited fds, open our own
    os.kill(target.pid, signal.SIGUSR2)
    os.kill(target.pid, signal.SIGUSR2)
    owned = [Path(files + str(i)) for i in range(8)]
    wait_for(
        "the handler's one warning (or a byte in the daemon's files)",
        lambda: (
            "closed or reused by the program" in target.log()
            or any(p.stat().st_size for p in owned)
        ),
    )
    for i, p in enumerate(owned):
        assert p.read_bytes() == b"", f"a byte was written into the daemon's file {i}"
    target.do("ignore")  # the service still runs
    assert target.log().count("closed or reused by the program") == 1, target.log()


def test_malformed_requests_never_jam_and_late_ones_are_not_served(
    service: Callable[..., Service],
) -> None:
    """Findings: one malformed request file jammed the handler for good; a request that timed
    out was still carried out later. Fixed count of malformed requests, then a good one."""
    target = service(None)
    directory = target.do("install")
    target.do("ignore")  # hold the handler while the files are laid down
    rng = random.Random(300)
    bodies = ['"abc"', "null", "[]", "[" * 5000 + "]" * 5000, "{}", "\xff"]
    for _ in range(20):
        req = {
            "command": "trim",
            "pools": False,
            "nonce": secrets.token_hex(16),
            "expires": time.time() + 600,
        }
        key = rng.choice(list(req))
        req[key] = rng.choice([None, 1e300, "x", [], {}, True, -1])
        bodies.append(json.dumps(req))
    for i, body in enumerate(bodies):
        Path(directory, f"request-{i:04d}.json").write_text(body, errors="surrogateescape")
    late = secrets.token_hex(16)
    Path(directory, f"request-{late}.json").write_text(
        json.dumps({"command": "trim", "pools": False, "nonce": late, "expires": time.time() - 1})
    )
    path = os.path.join(tempfile.mkdtemp(), "again.py")
    Path(path).write_text(
        "import signal\nfrom memreclaim import remote\n"
        "signal.signal(signal.SIGUSR2, remote._handler.on_signal)\n"
    )
    target.do(f"exec {path}")
    answer = remote.request(target.pid, "stats", method="signal", timeout=30)
    assert answer["pid"] == target.pid and "result" in answer, answer
    assert not list(Path(directory).glob("request-*")), "bad requests were left behind"
    assert not Path(directory, f"reply-{late}.json").exists(), "a late request was served"
    assert "arrived after the command's timeout" in target.log()
    shutil.rmtree(os.path.dirname(path))


def test_malformed_replies_are_one_remote_error() -> None:
    """A fixed set of malformed replies: each is one RemoteError, never another exception."""
    nonce = "0" * 32
    good = {
        "pid": 7,
        "command": "trim",
        "via": "signal",
        "nonce": nonce,
        "result": {"allocator": "glibc", "method": "x", "released": 1, "seconds": 0.1},
    }
    cases: list[bytes] = [b'"abc"', b"null", b"1e300", b"[]", b"[" * 100_000, b"\xff"]
    bad: dict[str, list[Any]] = {
        "pid": ["x", None, True, 8],
        "via": [None, 1, []],
        "nonce": [None, "x", 1],
        "result": [None, "x", [], 1],
        "allocator": [None, 1, []],
        "method": [None, 1],
        "released": ["x", 1.5, True, []],
        "seconds": ["x", None, float("inf"), True],
    }
    rng = random.Random(3000)
    for _ in range(40):
        reply = json.loads(json.dumps(good))
        where = reply if rng.random() < 0.5 else reply["result"]
        key = rng.choice([k for k in where if k in bad])
        where[key] = rng.choice(bad[key])
        cases.append(json.dumps(reply).encode())
    for case in cases:
        with pytest.raises(remote.RemoteError):
            remote._check_reply(case, 7, "trim", nonce)
    assert remote._check_reply(json.dumps(good).encode(), 7, "trim", nonce)["pid"] == 7
