"""The project's exceptions. One FastAPI handler maps them to HTTP codes (api/app.py).

Each error carries what a client needs to fix its request: a message and, where several
things are wrong at once, the list of problems.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def problem(loc: Sequence[object], msg: str) -> dict[str, Any]:
    """One of the problems an error lists: where (``loc``, a path into the request) and what."""
    return {"loc": loc, "msg": msg}


class EnginefarmError(Exception):
    """Base of every error the farm raises on purpose. The API answers it with ``status_code`` and ``to_dict()``
    (``Retry-After: retry_after`` when set); the client raises the same class from that answer."""

    status_code = 500
    retry_after: int | None = None
    # The build log's last lines, where a worker's build failed with this error (set by the worker, stored with
    # the failed task).
    log_tail: str | None = None

    def __init__(self, message: str, *, problems: list[dict[str, Any]] | None = None, **context: Any):
        super().__init__(message)
        self.message = message
        self.problems = problems or []
        self.context = context

    def to_dict(self) -> dict[str, Any]:
        body: dict[str, Any] = {"error": type(self).__name__, "detail": self.message}
        if self.problems:
            body["problems"] = self.problems
        body.update({k: v for k, v in self.context.items() if v is not None})
        return body


class NotFound(EnginefarmError):
    status_code = 404


class ModelRejected(EnginefarmError):
    """The uploaded bytes are not a model we accept (not ONNX, truncated, fails the checker, unsafe)."""

    status_code = 422


class PayloadTooLarge(ModelRejected):
    status_code = 413


class SpecInvalid(EnginefarmError):
    """A build spec or target list that does not fit the model; ``problems`` lists every issue."""

    status_code = 422


class Conflict(EnginefarmError):
    status_code = 409


class WrongArtifact(Conflict):
    """An artifact of another kind than the file it was to be written as says (an ONNX model under ``.plan``)."""


class NoCompatibleEngine(NotFound):
    """Resolution found no engine that runs on the asking machine; ``problems`` says why for each."""


class TargetUnavailable(EnginefarmError):
    """No worker can build or serve the target (the backend is missing on this machine)."""

    status_code = 409


class BackendMissing(TargetUnavailable):
    """A build backend's Python module is not importable on this worker."""


class BuildFailed(EnginefarmError):
    """A model error during a build: final, stored with its message, never retried."""

    status_code = 422


class InfrastructureError(EnginefarmError):
    """S3, database or broker trouble: transient, retried with backoff."""

    status_code = 503
    retry_after = 5


class CatalogUnavailable(InfrastructureError):
    """The catalog database is restarting, unreachable or out of connections."""


class StorageFull(InfrastructureError):
    """The farm's disk (spool, scratch, local blob store) is full; nothing was stored."""


class UploadTimedOut(EnginefarmError):
    """The client sent nothing for the upload's idle timeout."""

    status_code = 408


class TooBusy(EnginefarmError):
    """A limit on work in flight: try again after ``retry_after`` seconds."""

    status_code = 429


class TooManyUploads(TooBusy):
    """The token already has the most uploads in flight one token may have."""

    retry_after = 5


class QueueFull(TooBusy):
    """A submission would take a token's, or the farm's, queued build tasks past the limit."""

    retry_after = 60


class RateLimited(TooBusy):
    """Requests of one kind faster than the farm allows one token (or address) in a window."""

    retry_after = 60

    def __init__(self, message: str, *, retry_after: int | None = None, **context: Any):
        super().__init__(message, **context)
        if retry_after is not None:  # when the window frees a place, where that is known
            self.retry_after = retry_after


class SignInsTooFast(RateLimited):
    """A token, or a client address, signing in to the dashboard faster than the farm allows."""


class MeasurementsTooFast(RateLimited):
    """A token posting device measurements faster than the farm allows."""


class IntegrityError(EnginefarmError):
    """Bytes whose sha256 does not match what the catalog recorded."""

    status_code = 502


class Unauthorized(EnginefarmError):
    """No API token, or one the farm does not know (unknown, revoked or expired)."""

    status_code = 401
    headers: dict[str, str]  # the API's challenge (WWW-Authenticate), set where it raises one


class Forbidden(EnginefarmError):
    """A valid token whose scope does not cover the request."""

    status_code = 403
