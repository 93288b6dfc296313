"""Sign-in and sign-out: an API token typed into a form becomes a session cookie (see ``session``)."""

from __future__ import annotations

from fastapi import APIRouter, Form, Request
from fastapi.responses import RedirectResponse, Response

from api.ui import session
from api.ui.render import HEADERS, page
from enginefarm.core.errors import SignInsTooFast

router = APIRouter(prefix="/ui")
SIGNIN_MAX_AGE = 3600


def _local(next_path: str | None) -> str:
    """Where to go after signing in: a dashboard path only (never another site)."""
    if next_path and next_path.startswith("/ui/") and not next_path.startswith("//") and "\\" not in next_path:
        return next_path
    return "/ui/models"


@router.get("")
@router.get("/")
async def home() -> Response:
    return RedirectResponse("/ui/models", status_code=303, headers=HEADERS)


@router.get("/signin")
async def signin_form(request: Request, next: str | None = None) -> Response:  # noqa: A002 - the query's name
    return _form(request, next, 200, None)


@router.post("/signin")
async def signin(
    request: Request,
    token: str = Form(""),
    next: str = Form("/ui/models"),  # noqa: A002 - the form's
    csrf: str = Form(""),
) -> Response:
    session.check_signin_csrf(request, csrf)
    try:
        opened = await session.sign_in(request, token)
    except SignInsTooFast as exc:
        response = _form(request, next, 429, exc.message)
        response.headers["Retry-After"] = str(exc.retry_after)
        return response
    if opened is None:
        return _form(request, next, 401, "That token is not valid: it is unknown, revoked or expired.")
    _principal, credential = opened
    response = RedirectResponse(_local(next), status_code=303, headers=HEADERS)
    session.set_cookie(response, request, session.COOKIE, credential, session.SESSION_HOURS * 3600)
    session.clear_cookie(response, request, session.SIGNIN_COOKIE, path="/ui/signin")
    return response


def _form(request: Request, next_path: str | None, status_code: int, problem: str | None) -> Response:
    """The sign-in form, with what went wrong (if anything) and a fresh CSRF value."""
    value = session.new_signin_value()
    response = page(
        request, "signin.html", status_code=status_code, next=_local(next_path), signin_csrf=value, problem=problem
    )
    session.set_cookie(response, request, session.SIGNIN_COOKIE, value, SIGNIN_MAX_AGE, path="/ui/signin")
    return response


@router.post("/signout")
async def signout(request: Request) -> Response:
    await session.viewer(request)
    await session.check_csrf(request)
    await session.sign_out(request)
    response = RedirectResponse("/ui/signin", status_code=303, headers=HEADERS)
    session.clear_cookie(response, request, session.COOKIE)
    return response
