"""Find, start and stop the peers' servers: Debian's `redis-server` and `rabbitmq-server`, each on
loopback, on free ports, with its own data directory under the run's temp dir. Nothing is
installed: a server that is not found (or does not come up) is `Unavailable`, with why and the
command that installs it, and its rows are skipped.

Where to look: $RAYBROKER_PEER_PATH if set (a PATH-style list; tests point it elsewhere to hide
a server), else $PATH plus the sbin directories (rabbitmq-server lives in /usr/sbin).
"""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import psutil

PATH_ENV = "RAYBROKER_PEER_PATH"
START_S = {"redis": 15.0, "rabbitmq": 90.0}  # how long a server may take to come up
STOP_S = 30.0


@dataclass(frozen=True)
class Unavailable:
    reason: str
    install: str

    @property
    def note(self) -> str:
        return f"skipped: {self.reason}" + (f"; install: {self.install}" if self.install else "")


@dataclass
class Server:
    name: str
    port: int
    pid: int  # the server process whose CPU time counts
    stop: Callable[[], None]


def search_path() -> str:
    if os.environ.get(PATH_ENV) is not None:
        return os.environ[PATH_ENV]
    extra = ["/usr/local/sbin", "/usr/sbin", "/sbin"]
    return os.pathsep.join([os.environ.get("PATH", ""), *extra])


def find(program: str) -> str | None:
    return shutil.which(program, path=search_path())


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _listening(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


def _tail(path: Path, lines: int = 3) -> str:
    try:
        return " | ".join(path.read_text(errors="replace").strip().splitlines()[-lines:])
    except OSError:
        return ""


def _await_up(proc: subprocess.Popen, ready: Callable[[], bool], timeout: float) -> str | None:
    """Poll until `ready()`; None when up, else why not (the process ended, or the deadline)."""
    deadline = time.monotonic() + timeout
    delay = 0.05
    while not ready():
        if proc.poll() is not None:
            return f"exited with status {proc.returncode}"
        if time.monotonic() > deadline:
            return f"not up after {timeout:.0f} s"
        time.sleep(delay)
        delay = min(delay * 2, 0.5)
    return None


def _end(proc: subprocess.Popen) -> None:
    """End a server we started: SIGTERM to its process group (it leads one), then SIGKILL."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        if proc.poll() is not None:
            return
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(STOP_S)
        except subprocess.TimeoutExpired:
            continue


def start_redis(workdir: Path) -> Server | Unavailable:
    """AOF on, fsync once a second (raybroker's default is SQLite WAL with synchronous=NORMAL:
    no fsync per commit either), no RDB snapshots."""
    install = "apt-get install redis-server"
    exe = find("redis-server")
    if exe is None:
        return Unavailable("redis-server not found", install)
    data = workdir / "redis"
    data.mkdir(parents=True)
    port = free_port()
    log = data / "redis.log"
    args = [exe, "--bind", "127.0.0.1", "--port", str(port), "--dir", str(data)]
    args += ["--appendonly", "yes", "--appendfsync", "everysec", "--save", ""]
    args += ["--daemonize", "no", "--logfile", str(log)]
    proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, start_new_session=True)
    why = _await_up(proc, lambda: _listening(port), START_S["redis"])
    if why:
        _end(proc)
        return Unavailable(f"redis-server {why}: {_tail(log)}", install)
    return Server("redis-server", port, proc.pid, lambda: _end(proc))


def start_rabbitmq(workdir: Path) -> Server | Unavailable:
    """A node of its own: a unique node name, its own epmd port and dist port, no plugins, its
    own (empty) config, everything bound to 127.0.0.1. Debian's start script drops to the
    `rabbitmq` user, so the node's directories are handed to that user."""
    install = "apt-get install rabbitmq-server"
    exe, ctl = find("rabbitmq-server"), find("rabbitmqctl")
    if exe is None or ctl is None:
        return Unavailable("rabbitmq-server not found", install)
    base = workdir / "rabbitmq"
    for sub in ("mnesia", "log"):
        (base / sub).mkdir(parents=True)
    for name in ("enabled_plugins", "rabbitmq.conf", "rabbitmq-env.conf"):
        (base / name).write_text("[].\n" if name == "enabled_plugins" else "")
    port, dist, epmd = free_port(), free_port(), free_port()
    node = f"raybroker-peers-{port}@localhost"
    env = os.environ | {
        "RABBITMQ_NODENAME": node,
        "RABBITMQ_NODE_IP_ADDRESS": "127.0.0.1",
        "RABBITMQ_NODE_PORT": str(port),
        "RABBITMQ_DIST_PORT": str(dist),
        "RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS": "-kernel inet_dist_use_interface {127,0,0,1}",
        "ERL_EPMD_ADDRESS": "127.0.0.1",
        "ERL_EPMD_PORT": str(epmd),
        "RABBITMQ_MNESIA_BASE": str(base / "mnesia"),
        "RABBITMQ_LOG_BASE": str(base / "log"),
        "RABBITMQ_PID_FILE": str(base / "rabbitmq.pid"),
        "RABBITMQ_ENABLED_PLUGINS_FILE": str(base / "enabled_plugins"),
        "RABBITMQ_CONFIG_FILE": str(base / "rabbitmq.conf"),
        "RABBITMQ_CONF_ENV_FILE": str(base / "rabbitmq-env.conf"),
    }
    _hand_to_rabbitmq_user(workdir, base)
    out = open(base / "server.out", "wb")  # noqa: SIM115 - closed when the server is stopped
    proc = subprocess.Popen(
        [exe],
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=out,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    why = _await_up(proc, lambda: _listening(port), START_S["rabbitmq"])
    beam = _beam_pid(proc) if why is None else None

    def stop() -> None:
        try:
            subprocess.run([ctl, "-n", node, "stop"], env=env, capture_output=True, timeout=STOP_S)
            proc.wait(STOP_S)
        except subprocess.TimeoutExpired:
            pass
        _end(proc)
        epmd_exe = find("epmd")
        if epmd_exe:  # the node's own epmd (its own port), started on the node's behalf
            subprocess.run([epmd_exe, "-kill"], env=env, capture_output=True, timeout=STOP_S)
        out.close()

    if why or beam is None:
        stop()
        log = _tail(base / "log" / f"{node}.log") or _tail(base / "server.out")
        return Unavailable(f"rabbitmq-server {why or 'has no beam.smp process'}: {log}", install)
    return Server("rabbitmq-server", port, beam, stop)


def _hand_to_rabbitmq_user(workdir: Path, base: Path) -> None:
    """As root, Debian's script runs the node as `rabbitmq`: let that user reach and own `base`."""
    if os.geteuid() != 0:
        return
    try:
        pwd.getpwnam("rabbitmq")
    except KeyError:
        return
    # traverse only, up to the run's own temp dir: the rest of the run's files stay private
    for d in (workdir, workdir.parent):
        if d.name.startswith("raybroker-peers-") or d == workdir:
            os.chmod(d, 0o711)
    for path in [base, *base.rglob("*")]:
        shutil.chown(path, "rabbitmq", "rabbitmq")


def _beam_pid(proc: subprocess.Popen) -> int | None:
    """The Erlang VM under the start script (the script and `su` use no CPU of note)."""
    try:
        for child in psutil.Process(proc.pid).children(recursive=True):
            if child.name().startswith("beam"):
                return child.pid
    except psutil.NoSuchProcess:
        return None
    return None
