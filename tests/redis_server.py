"""A real ``redis-server`` for the tests: Debian's binary on a unix socket in a temporary folder.

Each server listens on no TCP port (``--port 0``), keeps nothing on disk (``--save ""``,
``--appendonly no``) and is ready in a few tens of milliseconds. Tests take the fixtures:

- ``redis_server``: one server per test module (a :class:`RedisServer`);
- ``redis_url``: that server emptied (``FLUSHALL``) before the test, as a ``unix://`` URL;
- ``own_redis``: a server of the test's own, for the fault tests that restart it;
- ``redis_cluster_url``: a three-node Redis Cluster (one module's), emptied before the test.

When the binary is missing the tests skip with the reason, or fail under
``CTXRULES_REQUIRE_REDIS=1`` (set by ``.ci/run`` on CI, where a skip would hide lost coverage).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

__all__ = [
    "REDIS_SERVER",
    "RedisCluster",
    "RedisServer",
    "own_redis",
    "redis_cluster",
    "redis_cluster_url",
    "redis_server",
    "redis_url",
    "require_redis",
]

REDIS_SERVER = shutil.which("redis-server")
REDIS_CLI = shutil.which("redis-cli")


def require_redis() -> None:
    """Skip (or fail, when CI requires it) unless ``redis-server`` and the client are there."""
    missing = None
    if REDIS_SERVER is None:
        missing = "redis-server is not installed (Debian: apt-get install redis-server)"
    else:
        try:
            import redis  # noqa: F401
        except ImportError:
            missing = "the redis client is not installed (pip install 'ctxrules[redis]')"
    if missing is None:
        return
    if os.environ.get("CTXRULES_REQUIRE_REDIS"):
        pytest.fail(f"CTXRULES_REQUIRE_REDIS is set but {missing}", pytrace=False)
    pytest.skip(missing)


class RedisServer:
    """One ``redis-server`` process on ``<folder>/redis.sock``; :meth:`restart` loses every key,
    as a real restart without persistence does."""

    def __init__(self) -> None:
        # A short folder: a unix socket path must fit in 108 bytes, and pytest's tmp_path may not.
        self.folder = Path(tempfile.mkdtemp(prefix="ctxr-redis-"))
        self.socket = self.folder / "redis.sock"
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"unix://{self.socket}"

    def start(self) -> None:
        assert REDIS_SERVER is not None
        self.proc = subprocess.Popen(
            [
                REDIS_SERVER,
                "--port", "0",
                "--unixsocket", str(self.socket),
                "--unixsocketperm", "700",
                "--save", "",
                "--appendonly", "no",
                "--dir", str(self.folder),
                "--logfile", str(self.folder / "redis.log"),
                "--daemonize", "no",
            ],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )  # fmt: skip
        self._wait_ready()

    def _wait_ready(self, timeout_s: float = 10.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                err = self.proc.stderr.read().decode(errors="replace") if self.proc.stderr else ""
                log = (
                    (self.folder / "redis.log").read_text(errors="replace")
                    if (self.folder / "redis.log").exists()
                    else ""
                )
                raise RuntimeError(f"redis-server exited with {self.proc.returncode}: {err}{log[-2000:]}")
            if self.ping():
                return
            time.sleep(0.005)
        raise RuntimeError(f"redis-server did not answer PING on {self.socket} within {timeout_s}s")

    def ping(self) -> bool:
        """A raw ``PING`` over the socket (no client library: this also checks the fixture)."""
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
                sock.settimeout(1.0)
                sock.connect(str(self.socket))
                sock.sendall(b"PING\r\n")
                return sock.recv(16).startswith(b"+PONG")
        except OSError:
            return False

    def stop(self) -> None:
        if self.proc is None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        if self.proc.stderr is not None:
            self.proc.stderr.close()
        self.proc = None
        with contextlib.suppress(FileNotFoundError):
            self.socket.unlink()

    def restart(self) -> None:
        """Stop and start again on the same socket: every key is gone (nothing is saved)."""
        self.stop()
        self.start()

    def flush(self) -> None:
        import redis

        client = redis.Redis(unix_socket_path=str(self.socket))
        try:
            client.flushall()
        finally:
            client.close()

    def close(self) -> None:
        self.stop()
        shutil.rmtree(self.folder, ignore_errors=True)


@contextlib.contextmanager
def running_redis() -> Iterator[RedisServer]:
    server = RedisServer()
    try:
        server.start()
        yield server
    finally:
        server.close()


@pytest.fixture(scope="module")
def redis_server() -> Iterator[RedisServer]:
    require_redis()
    with running_redis() as server:
        yield server


@pytest.fixture
def redis_url(redis_server: RedisServer) -> str:
    if not redis_server.ping():  # a test before this one stopped it
        redis_server.restart()
    redis_server.flush()
    return redis_server.url


@pytest.fixture
def own_redis() -> Iterator[RedisServer]:
    require_redis()
    with running_redis() as server:
        yield server


class RedisCluster:
    """Three ``redis-server`` primaries in cluster mode on free TCP ports of 127.0.0.1 (a cluster
    node needs a TCP port, and its bus the port + 10000), slots spread by ``redis-cli``."""

    def __init__(self) -> None:
        self.folder = Path(tempfile.mkdtemp(prefix="ctxr-cluster-"))
        self.ports = _free_ports(3)
        self.procs: list[subprocess.Popen[bytes]] = []

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.ports[0]}/0?cluster=yes"

    def start(self) -> None:
        assert REDIS_SERVER is not None and REDIS_CLI is not None
        for port in self.ports:
            argv = [REDIS_SERVER, "--port", str(port), "--bind", "127.0.0.1", "--cluster-enabled", "yes"]
            argv += ["--cluster-config-file", str(self.folder / f"nodes-{port}.conf")]
            argv += ["--save", "", "--appendonly", "no", "--dir", str(self.folder)]
            argv += ["--logfile", str(self.folder / f"{port}.log")]
            self.procs.append(
                subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            )
        deadline = time.monotonic() + 10
        while not all(_answers(port) for port in self.ports):
            if time.monotonic() > deadline:
                raise RuntimeError(f"the cluster nodes on {self.ports} did not start")
            time.sleep(0.01)
        nodes = [f"127.0.0.1:{port}" for port in self.ports]
        subprocess.run(
            [REDIS_CLI, "--cluster", "create", *nodes, "--cluster-replicas", "0", "--cluster-yes"],
            check=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            timeout=30,
        )
        while not all(b"cluster_state:ok" in _command(port, b"CLUSTER INFO") for port in self.ports):
            if time.monotonic() > deadline + 20:
                raise RuntimeError("the cluster did not reach cluster_state:ok")
            time.sleep(0.05)

    def flush(self) -> None:
        for port in self.ports:
            _command(port, b"FLUSHALL")

    def close(self) -> None:
        for proc in self.procs:
            proc.terminate()
        for proc in self.procs:
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        shutil.rmtree(self.folder, ignore_errors=True)


def _free_ports(n: int) -> list[int]:
    """``n`` ports whose port + 10000 (the cluster bus) is free too."""
    import random

    found: list[int] = []
    while len(found) < n:
        port = random.randint(20000, 50000)
        if port in found:
            continue
        try:
            for p in (port, port + 10000):
                with socket.socket() as probe:
                    probe.bind(("127.0.0.1", p))
        except OSError:
            continue
        found.append(port)
    return found


def _command(port: int, command: bytes) -> bytes:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1.0) as sock:
            sock.sendall(command + b"\r\n")
            return sock.recv(65536)
    except OSError:
        return b""


def _answers(port: int) -> bool:
    return _command(port, b"PING").startswith(b"+PONG")


@pytest.fixture(scope="module")
def redis_cluster() -> Iterator[RedisCluster]:
    require_redis()
    if REDIS_CLI is None:
        pytest.skip("redis-cli is not installed (Debian: apt-get install redis-tools), needed to form a cluster")
    cluster = RedisCluster()
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.close()


@pytest.fixture
def redis_cluster_url(redis_cluster: RedisCluster) -> str:
    redis_cluster.flush()
    return redis_cluster.url
