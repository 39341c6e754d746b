"""The app's connection to Ray.

Two modes, chosen by ``ATTNBOARD_RAY_ADDRESS``:

- **embedded** (empty): the app starts a local Ray head as a separate process
  (``ray start --head --block --node-ip-address=127.0.0.1 ...``) and records it in
  ``<DATA_DIR>/ray_head.json``. A restarted app (even after ``kill -9``) finds the record, sees the
  head alive and reattaches, so runs keep going. At a graceful shutdown the app stops the head it
  recorded unless runs are still active; then it leaves the head for the next start.
- **cluster** (``HOST:PORT``, ``ray://HOST:PORT`` or ``auto``): the app connects to an existing
  cluster and never stops it.

Ray's token authentication (``RAY_AUTH_MODE=token`` with ``RAY_AUTH_TOKEN`` or
``RAY_AUTH_TOKEN_PATH``) is read by Ray itself from the environment; the app passes the environment
through unchanged and never turns authentication off.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from worker.core.contract import NAMESPACE

log = logging.getLogger("attnboard.ray")

HEAD_RECORD = "ray_head.json"
HEAD_LOG = "ray_head.log"
HEAD_START_TIMEOUT_S = 180.0
HEAD_STOP_TIMEOUT_S = 30.0
HEAD_RETRY_S = 30.0
HEAD_READY_LINE = b"This command will now block forever"
CONNECT_PROBE_TIMEOUT_S = 2.0


class RayUnavailable(Exception):
    """Ray cannot be reached; the message names the address and what failed."""


# --------------------------------------------------------------------------------------------
# Pure helpers


def split_address(address: str) -> tuple[str, int] | None:
    """``(host, port)`` of a Ray address, or None for ``auto`` (nothing to probe).

    >>> split_address("ray://10.0.0.5:10001"), split_address("127.0.0.1:6379"), split_address("auto")
    (('10.0.0.5', 10001), ('127.0.0.1', 6379), None)
    """
    if address == "auto":
        return None
    rest = address.removeprefix("ray://")
    host, sep, port = rest.rpartition(":")
    if not sep or not port.isdigit() or not host:
        raise ValueError(f"{address!r} is not a Ray address; valid: auto, HOST:PORT or ray://HOST:PORT")
    return host.strip("[]"), int(port)


def ray_token_available(env: dict[str, str] | os._Environ[str]) -> bool:
    """Whether Ray would find an authentication token: ``RAY_AUTH_TOKEN``, the file at
    ``RAY_AUTH_TOKEN_PATH``, or ``~/.ray/auth_token``."""
    if env.get("RAY_AUTH_TOKEN"):
        return True
    path = env.get("RAY_AUTH_TOKEN_PATH")
    return Path(path).expanduser().is_file() if path else (Path.home() / ".ray" / "auth_token").is_file()


def is_loopback(address: str) -> bool:
    """Whether a Ray address points at this machine's loopback interface.

    >>> is_loopback("127.0.0.1:6379"), is_loopback("localhost:1"), is_loopback("ray-head:6379")
    (True, True, False)
    """
    target = split_address(address) if address else None
    return target is not None and (target[0] in ("localhost", "::1") or target[0].startswith("127."))


def head_command(ray_bin: str, *, port: int, agent_port: int, temp_dir: str, num_cpus: int) -> list[str]:
    """The ``ray start`` command line of the embedded head: loopback only, no dashboard, in the foreground
    (``--block``) so one SIGTERM to it stops every process it started."""
    return [ray_bin, "start", "--head", "--block", "--node-ip-address=127.0.0.1", f"--port={port}",
            f"--dashboard-agent-listen-port={agent_port}",
            "--include-dashboard=false", "--disable-usage-stats", f"--temp-dir={temp_dir}", f"--num-cpus={num_cpus}"]


def short_temp_dir(data_dir: Path) -> str:
    """A short folder for Ray's session files (its socket paths must stay under ~107 characters), one per
    data folder so two apps on one machine do not share sessions."""
    digest = hashlib.sha256(str(data_dir.resolve()).encode()).hexdigest()[:10]
    return f"/tmp/attnboard-ray-{digest}"


# --------------------------------------------------------------------------------------------
# Processes and sockets


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def reachable(address: str, timeout: float = CONNECT_PROBE_TIMEOUT_S) -> bool:
    """Whether something accepts TCP connections at ``address`` (always True for ``auto``)."""
    target = split_address(address)
    if target is None:
        return True
    try:
        with socket.create_connection(target, timeout=timeout):
            return True
    except OSError:
        return False


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@dataclass(frozen=True)
class HeadRecord:
    """What ``<DATA_DIR>/ray_head.json`` keeps about the embedded head."""

    address: str
    pid: int
    temp_dir: str
    started_at: float

    @classmethod
    def load(cls, path: Path) -> HeadRecord | None:
        try:
            return cls(**json.loads(path.read_text(encoding="utf-8")))
        except (OSError, ValueError, TypeError):
            return None

    def save(self, path: Path) -> None:
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(asdict(self)), encoding="utf-8")
        tmp.replace(path)


def start_head(data_dir: Path, *, num_cpus: int, timeout: float = HEAD_START_TIMEOUT_S,
               env: dict[str, str] | None = None) -> HeadRecord:
    """Start a Ray head on 127.0.0.1 as its own process group (environment ``env``, default this process's)
    and wait until it is up."""
    port = free_port()
    temp_dir = short_temp_dir(data_dir)
    cmd = head_command(str(Path(sys.executable).with_name("ray")), port=port, agent_port=free_port(), temp_dir=temp_dir,
                       num_cpus=num_cpus)
    env = {**(os.environ if env is None else env), "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
           "RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S": "0"}
    log_path = data_dir / HEAD_LOG
    offset = log_path.stat().st_size if log_path.exists() else 0
    with open(log_path, "ab") as head_log:
        proc = subprocess.Popen(cmd, stdout=head_log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                                start_new_session=True)
    address = f"127.0.0.1:{port}"
    deadline = time.monotonic() + timeout
    while not (reachable(address, timeout=0.5) and _head_ready(log_path, offset)):
        if proc.poll() is not None:
            tail = log_path.read_text(encoding="utf-8", errors="replace")[-2000:] if log_path.exists() else ""
            raise RayUnavailable(f"the local Ray head exited with code {proc.returncode} while starting "
                                 f"({' '.join(cmd)}); its log {log_path} ends with:\n{tail}")
        if time.monotonic() > deadline:
            stop_head(proc.pid)
            raise RayUnavailable(f"the local Ray head at {address} did not answer within {timeout:.0f} s; see {log_path}")
        time.sleep(0.25)
    return HeadRecord(address=address, pid=proc.pid, temp_dir=temp_dir, started_at=time.time())


def _head_ready(log_path: Path, offset: int) -> bool:
    """``ray start --block`` prints its banner once every process is up (GCS answering is not enough:
    a driver also needs the raylet)."""
    with open(log_path, "rb") as fh:
        fh.seek(offset)
        return HEAD_READY_LINE in fh.read()


def stop_head(pid: int, timeout: float = HEAD_STOP_TIMEOUT_S) -> None:
    """SIGTERM the ``ray start --block`` process (it stops its GCS, raylet and workers), then SIGKILL its
    process group if anything is left after ``timeout``."""
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + timeout
    while pid_alive(pid) and time.monotonic() < deadline:
        _reap(pid)
        time.sleep(0.2)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)
    _reap(pid)


def _reap(pid: int) -> None:
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)


# --------------------------------------------------------------------------------------------
# The runtime


class RayRuntime:
    """Ray for one app process: starts or finds the cluster, connects (``ray.init``), reconnects after Ray
    comes back, and stops the embedded head at shutdown when no run needs it."""

    def __init__(self, *, address: str, data_dir: Path, num_cpus: int):
        self.configured_address = address
        self.data_dir = data_dir
        self.num_cpus = num_cpus or os.cpu_count() or 1
        self.address: str | None = address or None
        if self.embedded or is_loopback(address):
            # Ray would otherwise swap 127.0.0.1 for the machine's outward address when joining (and miss
            # a head that listens on loopback only); this must be set before ray is imported.
            os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
        if "RAY_AUTH_MODE" not in os.environ and ray_token_available(os.environ):
            # Ray's own rule for local clusters: with a token present, token authentication is on. A head
            # started that way refuses a client that did not turn it on too.
            os.environ["RAY_AUTH_MODE"] = "token"
        self._connected = False
        self._lock = threading.RLock()
        self._head_failed: tuple[float, str] | None = None

    @property
    def embedded(self) -> bool:
        return not self.configured_address

    @property
    def record_path(self) -> Path:
        return self.data_dir / HEAD_RECORD

    def describe(self) -> str:
        where = self.address or "(not started)"
        return f"the local Ray head at {where}" if self.embedded else f"the Ray cluster at {where}"

    def ensure(self) -> None:
        """Connected to a live cluster on return, else RayUnavailable naming the address."""
        import ray

        with self._lock:
            if self.embedded:
                self._ensure_head()
            assert self.address is not None
            if not reachable(self.address):
                self._disconnect()
                raise RayUnavailable(f"Ray is unreachable at {self.address} (nothing accepts connections there)")
            if self._connected and ray.is_initialized():
                return
            self._disconnect()
            # On the main thread ray.init replaces the SIGTERM handler with one that exits at once; the server's
            # own handler (a graceful shutdown that decides about the embedded head) is put back.
            on_main = threading.current_thread() is threading.main_thread()
            previous = signal.getsignal(signal.SIGTERM) if on_main else None
            try:
                ray.init(address=self.address, namespace=NAMESPACE, logging_level=logging.WARNING,
                         log_to_driver=False)
            except Exception as exc:
                self._disconnect()
                raise RayUnavailable(f"cannot connect to Ray at {self.address}: {type(exc).__name__}: {exc}") from None
            finally:
                if on_main and previous is not None:
                    signal.signal(signal.SIGTERM, previous)
            self._connected = True
            log.info("connected to %s", self.describe())

    def _ensure_head(self) -> None:
        record = HeadRecord.load(self.record_path)
        if record is not None and pid_alive(record.pid) and reachable(record.address):
            if self.address != record.address:
                log.info("reattaching to the local Ray head at %s (pid %d) recorded in %s", record.address,
                         record.pid, self.record_path)
            self.address = record.address
            return
        if record is not None:
            log.warning("the recorded Ray head at %s (pid %d) is gone; starting a new one", record.address, record.pid)
            self._disconnect()
        if self._head_failed is not None and time.monotonic() - self._head_failed[0] < HEAD_RETRY_S:
            raise RayUnavailable(self._head_failed[1])  # no new head on every call while it keeps failing
        try:
            record = start_head(self.data_dir, num_cpus=self.num_cpus)
        except RayUnavailable as exc:
            self._head_failed = (time.monotonic(), str(exc))
            raise
        self._head_failed = None
        record.save(self.record_path)
        self.address = record.address
        log.info("started a local Ray head at %s (pid %d, %d CPUs)", record.address, record.pid, self.num_cpus)

    def _disconnect(self) -> None:
        import ray

        if ray.is_initialized():
            ray.shutdown()
        self._connected = False

    def shutdown(self, *, active_runs: int) -> None:
        """Disconnect; stop the embedded head unless ``active_runs`` still need it."""
        with self._lock:
            self._disconnect()
            if not self.embedded:
                return
            record = HeadRecord.load(self.record_path)
            if record is None:
                return
            if active_runs:
                log.warning("leaving the local Ray head at %s (pid %d) running: %d run(s) still active; the next "
                            "start reattaches to it", record.address, record.pid, active_runs)
                return
            stop_head(record.pid)
            self.record_path.unlink(missing_ok=True)
            log.info("stopped the local Ray head at %s", record.address)
