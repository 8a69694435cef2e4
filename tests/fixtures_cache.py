"""Test fixtures for the cache area (a pytest plugin module loaded by conftest.py).

- ``s3_env`` (session): a real S3 server (OpenStack Swift + s3api from
  ``../shared/tools/s3-server.sh``). Uses the one named by ``S3_ENDPOINT_URL`` when it answers,
  else starts one for the session and stops it afterwards; skips with the reason only when no
  server can be started. Returns the environment (endpoint URL, credentials) and sets the
  credentials in ``os.environ`` for the session.
- ``s3_store``: an :class:`cache.store.S3Store` on that server under a fresh prefix.
- ``latent_cache``: a local :class:`cache.latent_cache.LatentCache` (HNSW + local folder) in tmp_path.
- ``s3_latent_cache``: the same with its blobs on the S3 server.
- ``make_latent_cache``: factory ``(index="hnsw"|"qdrant", store="local"|"s3", **kw)``.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import uuid
from pathlib import Path
from urllib.parse import urlparse

import pytest

_SCRIPT = Path(__file__).resolve().parent.parent.parent / "shared" / "tools" / "s3-server.sh"
S3_TEST_BUCKET = "argusdiff-test"
_ENV_KEYS = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_DEFAULT_REGION", "S3_ENDPOINT_URL")


def _answers(url: str) -> bool:
    parsed = urlparse(url)
    try:
        with socket.create_connection((parsed.hostname or "127.0.0.1", parsed.port or 80), timeout=1.0):
            return True
    except OSError:
        return False


def _parse_exports(text: str) -> dict[str, str]:
    env: dict[str, str] = {}
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("export ") and "=" in line:
            key, _, value = line[len("export ") :].partition("=")
            env[key.strip()] = value.strip().strip("'\"")
    return env


@pytest.fixture(scope="session")
def s3_env():
    """Environment of a running S3 server (see module docstring)."""
    existing = {k: os.environ[k] for k in _ENV_KEYS if k in os.environ}
    started_dir: str | None = None
    if "S3_ENDPOINT_URL" in existing and _answers(existing["S3_ENDPOINT_URL"]):
        env = existing
        env.setdefault("AWS_DEFAULT_REGION", "us-east-1")
    else:
        if not _SCRIPT.is_file():
            pytest.skip(f"no S3 server: S3_ENDPOINT_URL is unset and {_SCRIPT} is absent")
        if shutil.which("bash") is None:
            pytest.skip("no S3 server: bash is not available to run s3-server.sh")
        started_dir = tempfile.mkdtemp(prefix="argusdiff-s3-")
        try:
            proc = subprocess.run(
                ["bash", str(_SCRIPT), "start", started_dir], capture_output=True, text=True, timeout=600
            )
        except subprocess.TimeoutExpired:
            pytest.skip("no S3 server: s3-server.sh start did not finish within 600 s")
        env = _parse_exports(proc.stdout)
        if proc.returncode != 0 or "S3_ENDPOINT_URL" not in env:
            tail = (proc.stderr or proc.stdout).strip().splitlines()[-5:]
            pytest.skip(f"no S3 server: s3-server.sh start failed (exit {proc.returncode}): {' | '.join(tail)}")
    mp = pytest.MonkeyPatch()
    for key in _ENV_KEYS:
        if key in env:
            mp.setenv(key, env[key])
    try:
        yield dict(env)
    finally:
        mp.undo()
        if started_dir is not None:
            subprocess.run(["bash", str(_SCRIPT), "stop", started_dir], capture_output=True, timeout=120)
            shutil.rmtree(started_dir, ignore_errors=True)


@pytest.fixture
def s3_store(s3_env):
    from cache.store import S3Store

    store = S3Store(S3_TEST_BUCKET, prefix=f"t-{uuid.uuid4().hex[:12]}/", endpoint_url=s3_env["S3_ENDPOINT_URL"])
    yield store
    for key in list(store.keys()):
        store.delete(key)
    store.close()


@pytest.fixture
def make_latent_cache(tmp_path, request):
    """Factory: ``make_latent_cache(index="hnsw", store="local", dim=8, **LatentCache kwargs)``."""
    from cache.index import HnswIndex, QdrantIndex
    from cache.latent_cache import LatentCache
    from cache.store import LocalDirStore, S3Store

    made = []

    def make(index: str = "hnsw", store: str = "local", dim: int = 8, **kwargs):
        root = tmp_path / f"cache-{len(made)}"
        idx = HnswIndex(root / "index", dim) if index == "hnsw" else QdrantIndex(root / "qdrant", dim)
        if store == "local":
            blobs = LocalDirStore(root / "blobs")
        else:
            env = request.getfixturevalue("s3_env")
            blobs = S3Store(S3_TEST_BUCKET, prefix=f"t-{uuid.uuid4().hex[:12]}/", endpoint_url=env["S3_ENDPOINT_URL"])
        cache = LatentCache(idx, blobs, **kwargs)
        made.append(cache)
        return cache

    yield make
    for cache in made:
        if store_is_s3(cache):
            for key in list(cache.blobs.keys()):
                cache.blobs.delete(key)
        cache.close()


def store_is_s3(cache) -> bool:
    from cache.store import S3Store

    return isinstance(cache.blobs, S3Store)


@pytest.fixture
def latent_cache(make_latent_cache):
    """A local LatentCache (HNSW index + local folder) for 384-d MiniLM embeddings."""
    return make_latent_cache(dim=384)


@pytest.fixture
def s3_latent_cache(make_latent_cache):
    """A LatentCache (HNSW index) whose blobs live on the real S3 server; 384-d embeddings."""
    return make_latent_cache(store="s3", dim=384)
