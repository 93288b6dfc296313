"""GET /healthz (liveness), /readyz (readiness: the catalog, the broker and the blob store) and /metrics.

Liveness answers from the process alone, so an orchestrator restarts an API that hangs, not one whose database
is restarting; readiness takes it out of the load balancer while a dependency is away. Both are open, as
/metrics is: they name no model and no secret.
"""

from __future__ import annotations

import time

import anyio
from fastapi import APIRouter
from fastapi.responses import JSONResponse, Response

from api.http.deps import FarmSettings
from api.metrics import exposition
from enginefarm import __version__
from enginefarm.core.config import Settings
from storage.blobs import get_blob_store
from storage.db import ping

router = APIRouter(tags=["health"])
READY_TIMEOUT_S = 3.0
READY_KEY = "enginefarm-readyz-probe"  # a key no blob has: asking for it costs one round trip


@router.get("/healthz")
async def healthz(settings: FarmSettings) -> dict:
    """Liveness: the process answers."""
    return {"status": "ok", "version": __version__, "blob_store": settings.blob_store}


def _broker(settings: Settings) -> None:
    from kombu import Connection

    with Connection(settings.resolved_broker_url, connect_timeout=READY_TIMEOUT_S) as conn:
        conn.ensure_connection(max_retries=1, timeout=READY_TIMEOUT_S)


def _blobs(settings: Settings) -> None:
    get_blob_store(settings).exists(READY_KEY)


CHECKS = {"catalog": ping, "broker": _broker, "blob_store": _blobs}


async def _check(fn, settings: Settings) -> tuple[bool, str, float]:
    started = time.perf_counter()
    try:
        with anyio.fail_after(READY_TIMEOUT_S):
            await anyio.to_thread.run_sync(fn, settings, abandon_on_cancel=True)
    except TimeoutError:
        return False, f"no answer within {READY_TIMEOUT_S:g} s", time.perf_counter() - started
    except Exception as exc:  # noqa: BLE001 - what is wrong, without a traceback or a secret (URLs are not echoed)
        return False, type(exc).__name__, time.perf_counter() - started
    return True, "ok", time.perf_counter() - started


@router.get("/readyz", responses={503: {"description": "a dependency is unavailable; `checks` says which"}})
async def readyz(settings: FarmSettings) -> Response:
    """Readiness: the catalog database, the broker and the blob store each answer within 3 s."""
    results = {}
    async with anyio.create_task_group() as tg:

        async def run(name, fn):
            results[name] = await _check(fn, settings)

        for name, fn in CHECKS.items():
            tg.start_soon(run, name, fn)
    checks = {
        name: {"ok": ok, "detail": detail, "seconds": round(seconds, 4)}
        for name, (ok, detail, seconds) in sorted(results.items())
    }
    ready = all(c["ok"] for c in checks.values())
    return JSONResponse(
        {"status": "ready" if ready else "unavailable", "checks": checks},
        status_code=200 if ready else 503,
        headers=None if ready else {"Retry-After": "5"},
    )


@router.get("/metrics", response_class=Response)
def metrics(settings: FarmSettings) -> Response:
    """Prometheus text exposition: the API's request latency, resolve outcomes, upload bytes and blob store
    errors (summed over the host's processes), and the queues and workers as the catalog has them."""
    body, content_type = exposition(settings)
    return Response(body, media_type=content_type)
