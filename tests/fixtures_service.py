"""Test fixtures for the service area (a pytest plugin module loaded by conftest.py).

``redis_server`` starts a real ``redis-server`` on a free loopback port (skips when the binary is
missing); it can be stopped and started again on the same port to simulate an outage.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def stop_process(proc: subprocess.Popen, timeout: float = 30.0) -> None:
    """SIGTERM a child process, SIGKILL it if it has not exited within ``timeout``; close its stderr."""
    proc.terminate()
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    if proc.stderr is not None:
        proc.stderr.close()


class RedisServer:
    """A ``redis-server`` child process on a fixed port, restartable (data kept with AOF)."""

    def __init__(self, workdir: Path, port: int | None = None) -> None:
        self.port = port or free_port()
        self.workdir = workdir
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            pytest.skip("redis-server is not installed (apt-get install redis-server)")
        self.proc = subprocess.Popen(
            [binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "yes",
             "--appendfsync", "always", "--dir", str(self.workdir), "--protected-mode", "no"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        for _ in range(500):
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.1) as s:
                    s.sendall(b"PING\r\n")
                    if s.recv(16).startswith(b"+PONG"):
                        return
            except OSError:
                pass
            if self.proc.poll() is not None:
                raise RuntimeError(f"redis-server exited with {self.proc.returncode}")
            time.sleep(0.01)
        raise RuntimeError("redis-server did not start")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            if self.frozen:
                self.thaw()
            self.proc.terminate()
            self.proc.wait(timeout=10)
        self.proc = None

    frozen = False

    def freeze(self) -> None:
        """SIGSTOP: the server keeps its sockets open but answers nothing (a stall, not a death)."""
        assert self.proc is not None
        os.kill(self.proc.pid, signal.SIGSTOP)
        self.frozen = True

    def thaw(self) -> None:
        assert self.proc is not None
        os.kill(self.proc.pid, signal.SIGCONT)
        self.frozen = False


@pytest.fixture
def redis_server(tmp_path):
    server = RedisServer(tmp_path)
    server.start()
    try:
        yield server
    finally:
        server.stop()


class RedisCluster:
    """A real Redis Cluster: three ``redis-server --cluster-enabled yes`` primaries on free ports,
    joined by ``redis-cli --cluster create`` (no replicas). ``url`` is one node's plain URL, as a
    deployment would give it: the transport detects the cluster behind it."""

    def __init__(self, workdir: Path, nodes: int = 3) -> None:
        self.workdir = workdir
        self.ports = cluster_ports(nodes)
        self.procs: list[subprocess.Popen] = []

    @property
    def port(self) -> int:
        return self.ports[0]

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        binary, cli = shutil.which("redis-server"), shutil.which("redis-cli")
        if binary is None or cli is None:
            pytest.skip("redis-server / redis-cli are not installed (apt-get install redis-server)")
        for port in self.ports:
            d = self.workdir / f"node-{port}"
            d.mkdir(parents=True, exist_ok=True)
            self.procs.append(subprocess.Popen(
                [binary, "--port", str(port), "--bind", "127.0.0.1", "--cluster-enabled", "yes",
                 "--cluster-config-file", "nodes.conf", "--save", "", "--appendonly", "yes", "--appendfsync",
                 "everysec", "--dir", str(d), "--protected-mode", "no"],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            ))  # fmt: skip
        for port in self.ports:
            _wait_pong(port)
        out = subprocess.run(
            [cli, "--cluster", "create", *(f"127.0.0.1:{p}" for p in self.ports), "--cluster-replicas", "0",
             "--cluster-yes"],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        if out.returncode != 0:
            raise RuntimeError(f"redis-cli --cluster create failed: {out.stdout[-500:]} {out.stderr[-500:]}")
        import redis

        for port in self.ports:  # every node agrees that every slot is served
            node = redis.Redis(port=port)
            for _ in range(500):
                if b"cluster_state:ok" in node.execute_command("CLUSTER", "INFO"):
                    break
                time.sleep(0.01)
            else:
                raise RuntimeError("the Redis Cluster did not reach cluster_state:ok")
            node.close()

    def nodes(self) -> list:
        import redis

        return [redis.Redis(port=p) for p in self.ports]

    def flush(self) -> None:
        for node in self.nodes():
            node.flushall()
            node.execute_command("SCRIPT", "FLUSH")
            node.close()

    def stop(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.terminate()
                proc.wait(timeout=10)
        self.procs = []


def cluster_ports(n: int) -> list[int]:
    """``n`` free ports P at most 55535 whose cluster bus port P + 10000 is free too."""
    import random

    ports: list[int] = []
    while len(ports) < n:
        port = random.randint(20000, 55535)
        if port in ports:
            continue
        try:
            for p in (port, port + 10000):
                with socket.socket() as s:
                    s.bind(("127.0.0.1", p))
        except OSError:
            continue
        ports.append(port)
    return ports


def _wait_pong(port: int) -> None:
    for _ in range(500):
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.1) as s:
                s.sendall(b"PING\r\n")
                if s.recv(16).startswith(b"+PONG"):
                    return
        except OSError:
            pass
        time.sleep(0.01)
    raise RuntimeError(f"redis-server on {port} did not start")


@pytest.fixture(scope="session")
def redis_cluster_session(tmp_path_factory):
    cluster = RedisCluster(tmp_path_factory.mktemp("redis-cluster"))
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(params=["single", "cluster"])
def redis_any(request, tmp_path):
    """A standalone ``redis-server`` or a three-primary Redis Cluster (one session-wide cluster,
    emptied before each test): the distributed tests run on both."""
    if request.param == "single":
        yield request.getfixturevalue("redis_server")
        return
    cluster = request.getfixturevalue("redis_cluster_session")
    cluster.flush()
    yield cluster


def redis_client(server):
    """A client of ``server`` (a :class:`RedisServer` or a :class:`RedisCluster`) that sees every key."""
    from argusdiff.service.transport.redis_client import sync_client

    return sync_client(server.url)


@pytest.fixture
def service_env(monkeypatch):
    """No model hub access and one torch thread for service tests."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("OMP_NUM_THREADS", "1")


def service_settings(profile: str = "sm-a100", **service: object):
    """Settings for a test service: stand-in workers (TEST MODE) unless overridden, short periods."""
    from argusdiff.config import Settings

    base = {
        "workers": 2,
        "stand_in_scale": 0.001,
        "control_period_s": 0.5,
        "heartbeat_s": 0.1,
        "worker_timeout_s": 1.0,
        "port": 0,
        "policy": "argus",
    }
    base.setdefault("image_path", _images_dir())
    base.update(service)
    return Settings.model_validate({"profile": profile, "service": base, "solver": {"backend": "highs"}})


def _images_dir() -> str:
    """One temporary image store folder per test process (never the user's ~/.cache)."""
    global _IMAGES
    if _IMAGES is None:
        import tempfile

        _IMAGES = tempfile.mkdtemp(prefix="argusdiff-test-images-")
    return _IMAGES


_IMAGES: str | None = None


def demo_model_settings(
    models_dir: str,
    cache_path,
    *,
    policy: str = "nirvana",
    workers: int = 1,
    profile: str = "demo-cpu",
    **cache: object,
):
    """Settings for a service on the real tiny pipelines of a demo profile (demo-cpu unless
    ``profile`` names another) with a latent cache at ``cache_path``."""
    from argusdiff.config import Settings

    base = service_settings(
        profile, policy=policy, stand_in_scale=None, workers=workers, request_timeout_s=120
    ).model_dump()
    base["workers"].update(models_dir=models_dir, device="cpu", torch_threads=1, poll_s=0.05)
    base["cache"].update(path=str(cache_path), **cache)
    return Settings.model_validate(base)


def assert_repeat_prompt_resumes(server, prompt: str = "a lighthouse on a cliff in a storm, oil painting") -> str:
    """NIRVANA on demo-cpu: a prompt's first request misses (K = 0, latents stored); the same prompt
    again is routed by its similarity to K = 4 and resumes from the cache. Returns the endpoint URL."""
    import httpx

    url = f"{server.url}/v1/argusdiff/generations"
    first = httpx.post(url, json={"prompt": prompt, "seed": 1}, timeout=120).json()["data"][0]
    assert first["level"] == "xl-k0" and not first["cache_hit"]
    again = httpx.post(url, json={"prompt": prompt, "seed": 2}, timeout=120).json()["data"][0]
    assert again["level"] == "xl-k4" and again["cache_hit"]
    return url


class LiveServer:
    """A :class:`~argusdiff.service.app.Service` behind uvicorn on a free port, in a thread."""

    def __init__(self, service, port: int | None = None) -> None:
        import threading

        from argusdiff.service.api import make_server

        self.service = service
        self.port = port or free_port()
        self.server = make_server(service, host="127.0.0.1", port=self.port, log_level="warning", lifespan="on")
        self.app = self.server.config.app
        self.thread = threading.Thread(target=self.server.run, name="uvicorn-test", daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, *, ready: bool = True, timeout: float = 30.0) -> LiveServer:
        import httpx

        self.thread.start()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.server.started:
                if not ready:
                    return self
                try:
                    if httpx.get(f"{self.url}/readyz", timeout=1.0).status_code == 200:
                        return self
                except httpx.HTTPError:
                    pass
            if not self.thread.is_alive():
                raise RuntimeError("the test server exited")
            time.sleep(0.02)
        raise RuntimeError("the test server did not become ready")

    def stop(self) -> None:
        """As SIGTERM does: stop accepting, drain (bounded by drain_timeout_s), stop."""
        import signal

        self.server.handle_exit(signal.SIGTERM, None)
        self.thread.join(30)


@pytest.fixture
def live_service(service_env):
    """Factory: ``live_service(settings) -> LiveServer`` (stopped at teardown)."""
    from argusdiff.service.app import Service

    servers: list[LiveServer] = []

    def make(settings=None, *, ready: bool = True, **kwargs) -> LiveServer:
        server = LiveServer(Service(settings or service_settings(), **kwargs))
        servers.append(server)
        return server.start(ready=ready)

    yield make
    for s in servers:
        s.stop()


@pytest.fixture
def worker_procs(service_env):
    """Factory: ``worker_procs(redis_url, worker_id, scale)`` starts ``argusdiff worker`` processes
    in stand-in TEST MODE; all are killed at teardown."""
    import sys

    procs: list[subprocess.Popen] = []

    def start(url: str, worker_id: str, scale: float = 0.001, namespace: str = "argusdiff") -> subprocess.Popen:
        env = dict(os.environ)
        env.update(
            ARGUSDIFF_SERVICE__HEARTBEAT_S="0.1",
            ARGUSDIFF_SERVICE__WORKER_TIMEOUT_S="1.0",
            ARGUSDIFF_WORKERS__POLL_S="0.05",
            PYTHONUNBUFFERED="1",
        )
        cmd = [sys.executable, "-m", "argusdiff", "worker", "--redis", url, "--id", worker_id,
               "--stand-in", str(scale), "--namespace", namespace, "--log-level", "warning"]  # fmt: skip
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        procs.append(proc)
        return proc

    yield start
    for p in procs:
        if p.poll() is None:
            p.kill()
        p.wait(timeout=10)
        if p.stderr is not None:
            p.stderr.close()
