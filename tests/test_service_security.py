"""What one client can do to another, or to the router: results are scoped to the API key that
created them, generation ids carry 96 random bits, forwarded headers are trusted only from the
configured proxies, a connection must complete its request headers in time, and a bad ``--redis``
exits 2. A live router (uvicorn on a free port) with stand-in workers; Redis where it matters."""

from __future__ import annotations

import socket
import subprocess
import sys

import httpx
import pytest
from fixtures_service import service_settings

pytestmark = pytest.mark.integration

GEN = "/v1/argusdiff/generations"


def _auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def _check_scoping(server) -> None:
    r = httpx.post(f"{server.url}{GEN}", json={"prompt": "a private garden", "wait": False}, headers=_auth("k1"))
    assert r.status_code == 202
    gid = r.json()["id"]
    assert httpx.get(f"{server.url}{GEN}/{gid}", headers=_auth("k1"), timeout=30).status_code in (200, 202)
    other = httpx.get(f"{server.url}{GEN}/{gid}", headers=_auth("k2"), timeout=30)
    assert other.status_code == 404 and other.json()["error"]["code"] == "not_found"
    gone = httpx.delete(f"{server.url}{GEN}/{gid}", headers=_auth("k2"), timeout=30)
    assert gone.status_code == 404
    assert httpx.get(f"{server.url}{GEN}/{gid}", headers=_auth("k1"), timeout=30).json().get("status") != "cancelled"


def test_results_are_scoped_to_the_key_that_created_them(live_service):
    _check_scoping(live_service(service_settings(api_keys=("k1", "k2"))))


def test_results_are_scoped_through_redis(redis_server, live_service, worker_procs):
    from argusdiff.service.worker import wait_until

    server = live_service(service_settings(api_keys=("k1", "k2"), redis_url=redis_server.url, workers=0), ready=False)
    worker_procs(redis_server.url, "w1")
    assert wait_until(lambda: httpx.get(f"{server.url}/readyz").status_code == 200, 30, 0.1)
    _check_scoping(server)


def test_generation_ids_carry_96_random_bits(live_service):
    server = live_service()
    ids = [httpx.post(f"{server.url}{GEN}", json={"prompt": f"p{i}", "wait": False}).json()["id"] for i in range(48)]
    digits = [gid.removeprefix("gen-") for gid in ids]
    assert all(len(d) == 24 and int(d, 16) >= 0 for d in digits)
    # a uuid4's hex has a fixed version digit (13th) and 2 fixed variant bits (17th digit): none here
    for pos in range(24):
        assert len({d[pos] for d in digits}) > 1, f"digit {pos} is the same in every id"
    assert len({int(d[16], 16) >> 2 for d in digits}) > 1


def _image_url(server, headers: dict[str, str]) -> str:
    r = httpx.post(
        f"{server.url}{GEN}", json={"prompt": "a lighthouse", "response_format": "url"}, headers=headers, timeout=60
    )
    assert r.status_code == 200, r.text
    return r.json()["data"][0]["url"]


def test_forwarded_headers_trusted_only_from_configured_proxies(live_service):
    forged = {"X-Forwarded-Proto": "https", "X-Forwarded-For": "203.0.113.7"}
    plain = live_service()
    assert _image_url(plain, forged).startswith("http://127.0.0.1:")
    behind = live_service(service_settings(trusted_proxies=("127.0.0.1",)))
    assert _image_url(behind, forged).startswith("https://")


def _closed_by_server(sock: socket.socket) -> bool:
    sock.settimeout(60)
    try:
        return sock.recv(65536) == b""
    except ConnectionResetError:
        return True


def test_connections_that_do_not_finish_their_headers_are_closed(live_service):
    server = live_service(service_settings(header_timeout_s=0.5))
    silent = [socket.create_connection(("127.0.0.1", server.port)) for _ in range(5)]
    partial = [socket.create_connection(("127.0.0.1", server.port)) for _ in range(5)]
    for s in partial:
        s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Slow: ")
    # a keep-alive connection whose second request stalls in its headers
    again = socket.create_connection(("127.0.0.1", server.port))
    again.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
    again.settimeout(30)
    first = b""
    while not first.endswith(b"}"):  # the whole response (a JSON body)
        chunk = again.recv(65536)
        assert chunk
        first += chunk
    assert first.startswith(b"HTTP/1.1 200")
    again.sendall(b"GET /healthz HTTP/1.1\r\nHo")
    try:
        assert all(_closed_by_server(s) for s in (*silent, *partial, again))
        # a complete request still gets its answer
        assert httpx.get(f"{server.url}/healthz", timeout=10).status_code == 200
    finally:
        for s in (*silent, *partial, again):
            s.close()


@pytest.mark.parametrize("url", ["notaurl", "redis://127.0.0.1:1/0"])
def test_serve_with_a_bad_redis_exits_2_naming_it(url):
    out = subprocess.run(
        [sys.executable, "-m", "argusdiff", "serve", "--redis", url, "--port", "0"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 2, out.stderr
    assert "--redis" in out.stderr and "Traceback" not in out.stderr
