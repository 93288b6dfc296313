"""The farm's answers as the exceptions the server raised.

The API answers an ``EnginefarmError`` with its class name in ``error`` (``{"error": "SpecInvalid", "detail": ...,
"problems": [...]}``). The client raises an exception of that same class, which is also an ``ApiError`` carrying
the status code, the body and the Retry-After the server sent: ``except SpecInvalid`` and ``except ApiError`` both
catch it. An answer without a known name (a proxy's 502, FastAPI's own 422) is typed by its status code.
"""

from __future__ import annotations

from functools import cache
from typing import Any

from enginefarm.core import errors
from enginefarm.core.errors import EnginefarmError


class ApiError(EnginefarmError):
    """A non-2xx answer from the farm, with the body it sent."""

    def __init__(self, status_code: int, body: Any, retry_after: int | None = None):
        detail, problems = _detail(body)
        super().__init__(f"HTTP {status_code}: {detail}", problems=problems)
        self.status_code = status_code
        self.body = body
        self.retry_after = retry_after


def _detail(body: Any) -> tuple[str, list[dict[str, Any]] | None]:
    if not isinstance(body, dict):
        return str(body), None
    detail = body.get("detail")
    if isinstance(detail, list):  # FastAPI's request validation: a list of {loc, msg, type}
        problems = [{"loc": list(d.get("loc", [])), "msg": d.get("msg", "")} for d in detail if isinstance(d, dict)]
        return "the request is invalid", problems
    return str(detail), body.get("problems")


# Every error class the server may name, by name.
ERRORS: dict[str, type[EnginefarmError]] = {
    name: cls for name, cls in vars(errors).items() if isinstance(cls, type) and issubclass(cls, EnginefarmError)
}
BY_STATUS: dict[int, type[EnginefarmError]] = {
    401: errors.Unauthorized,
    403: errors.Forbidden,
    404: errors.NotFound,
    408: errors.UploadTimedOut,
    409: errors.Conflict,
    413: errors.PayloadTooLarge,
    422: errors.SpecInvalid,
    429: errors.TooBusy,
    503: errors.InfrastructureError,
}


@cache
def _typed(cls: type[EnginefarmError]) -> type[ApiError]:
    """``cls`` as an ApiError: ``ApiError.__init__``, and ``isinstance`` of both."""
    if cls is EnginefarmError:
        return ApiError
    return type(cls.__name__, (ApiError, cls), {"__doc__": cls.__doc__, "__module__": cls.__module__})


def api_error(status_code: int, body: Any, retry_after: str | None = None) -> ApiError:
    """The exception for a non-2xx answer."""
    name = body.get("error") if isinstance(body, dict) else None
    cls = ERRORS.get(name) if isinstance(name, str) else None
    cls = cls or BY_STATUS.get(status_code, EnginefarmError)
    seconds = int(retry_after) if retry_after and retry_after.isdigit() else None
    return _typed(cls)(status_code, body, seconds)  # type: ignore[arg-type]  # a class is hashable
