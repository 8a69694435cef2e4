"""The live plan page, ``GET /ui``: one self-contained HTML file that polls the plan, the cluster and the metrics.

``argusdiff/service/ui.html`` (open: the page holds no data) reads ``/v1/plan`` and ``/v1/cluster``
(with the API key typed into it when the service requires one) and ``/metrics`` from the browser;
nothing is loaded from elsewhere and nothing is built, so it works on an air-gapped cluster.
"""

from __future__ import annotations

from functools import cache, partial
from pathlib import Path

from starlette.requests import Request
from starlette.responses import HTMLResponse, Response
from starlette.routing import Route

from argusdiff.service.handlers.base import Api

__all__ = ["routes"]

PAGE = Path(__file__).resolve().parent.parent / "ui.html"


@cache
def _page() -> bytes:
    return PAGE.read_bytes()


async def ui(api: Api, request: Request) -> Response:
    # the page holds no data: what it shows comes from the authenticated endpoints it calls
    return HTMLResponse(_page(), headers={"Cache-Control": "no-cache", "Content-Security-Policy": _CSP})


#: the page may talk to its own origin only (nothing from a CDN, no frames)
_CSP = "default-src 'self'; script-src 'self' 'unsafe-inline'; style-src 'self' 'unsafe-inline'; frame-ancestors 'none'"


def routes(api: Api) -> list[Route]:
    return [Route("/ui", api.endpoint("ui", partial(ui, api)), methods=["GET"])]
