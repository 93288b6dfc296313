"""Templates, the pages' security headers, and error pages for the dashboard."""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path
from typing import Any
from urllib.parse import quote

from fastapi import Request
from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
from fastapi.templating import Jinja2Templates

from enginefarm import __version__
from enginefarm.core.domain import SCOPES
from enginefarm.core.errors import EnginefarmError
from enginefarm.core.spec import PRECISIONS

HERE = Path(__file__).resolve().parent
templates = Jinja2Templates(directory=HERE / "templates")

# Every script and style comes from the package (no CDN, no inline script): a page injected with markup still runs
# nothing of its own. Images: the chart's PNG export is a data: URL.
HEADERS = {
    "Content-Security-Policy": "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
    "Cache-Control": "no-store",
}


def ms(value: float | None) -> str:
    if value is None:
        return "–"
    return f"{value:.3f} ms" if value < 10 else f"{value:.1f} ms"


def size(value: float | None) -> str:
    if value is None:
        return "–"
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return str(value)


def elapsed(when: datetime) -> int:
    """Whole seconds since ``when`` (a naive time is UTC)."""
    if when.tzinfo is None:
        when = when.replace(tzinfo=timezone.utc)
    return round(max(0.0, (datetime.now(timezone.utc) - when).total_seconds()))


def age(when: datetime | None) -> str:
    """ "12 s ago", "3 min ago": how long since ``when`` (``app.js`` counts on in the same words)."""
    if when is None:
        return "–"
    seconds = elapsed(when)
    if seconds < 90:
        return f"{seconds:.0f} s ago"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min ago"
    return f"{seconds / 3600:.1f} h ago"


def dims(values: list | None) -> str:
    return "×".join(str(d) for d in values) if values else "scalar"


templates.env.filters.update(ms=ms, size=size, age=age, elapsed=elapsed, dims=dims)
templates.env.globals.update(version=__version__, precisions=PRECISIONS, scopes=SCOPES)


def page(request: Request, name: str, status_code: int = 200, **context: Any) -> HTMLResponse:
    """A page or fragment, with the signed-in principal and the CSRF token in its context."""
    context.setdefault("principal", getattr(request.state, "principal", None))
    context.setdefault("csrf", getattr(request.state, "csrf", ""))
    response = templates.TemplateResponse(request, name, context, status_code=status_code)
    response.headers.update(HEADERS)
    return response


def is_fragment(request: Request) -> bool:
    return request.headers.get("hx-request") == "true"


def error_response(request: Request, exc: EnginefarmError) -> Response:
    """An error on a dashboard path: sign-in needed → the sign-in form (a 401 with HX-Redirect for htmx and
    scripts); anything else → the error page (or, for htmx, a message it shows in place) with the error's code."""
    from api.ui.session import SignInNeeded

    if isinstance(exc, SignInNeeded):
        target = "/ui/signin?next=" + quote(request.url.path + (f"?{request.url.query}" if request.url.query else ""))
        if request.method == "GET" and not is_fragment(request):
            return RedirectResponse(target, status_code=303, headers=HEADERS)
        return Response(
            exc.message, status_code=401, headers={**HEADERS, "HX-Redirect": target}, media_type="text/plain"
        )
    if "application/json" in request.headers.get("accept", ""):  # the upload script reads the API's error body
        return JSONResponse(exc.to_dict(), status_code=exc.status_code, headers=HEADERS)
    name = "fragments/error.html" if is_fragment(request) else "error.html"
    response = page(request, name, status_code=exc.status_code, error=exc)
    if is_fragment(request):  # shown where the form says, not in place of what was asked for
        response.headers.update({"HX-Retarget": "#messages", "HX-Reswap": "innerHTML"})
    return response
