"""Errors the service turns into HTTP responses in OpenAI's error shape."""

from __future__ import annotations

from argusdiff.errors import ArgusdiffError

__all__ = ["ApiError", "FencedOut", "QueueUnavailable", "ShuttingDown", "WorkLost", "error_body"]


class QueueUnavailable(ArgusdiffError):
    """The work queue (Redis) cannot be reached; the request was NOT accepted."""


class FencedOut(QueueUnavailable):
    """A leader's side effect (re-queueing a dead worker's items) was refused: the lease it was
    made under is no longer held by this router. Nothing was changed."""


class WorkLost(ArgusdiffError):
    """Accepted work that nothing will finish: the queue lost it (Redis restarted without AOF)."""


class ShuttingDown(ArgusdiffError):
    """The router stopped waiting because it is shutting down."""


class ApiError(ArgusdiffError):
    """A rejection the client can act on: HTTP status, OpenAI error type, the field (param), a code."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.param = param
        self.code = code
        self.headers = headers or {}

    def body(self) -> dict:
        return error_body(self.message, type=self.type, param=self.param, code=self.code)


def error_body(message: str, *, type: str, param: str | None = None, code: str | None = None) -> dict:
    return {"error": {"message": message, "type": type, "param": param, "code": code}}
