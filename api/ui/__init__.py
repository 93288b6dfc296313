"""The dashboard: the farm in a browser, served by the API process under /ui.

Server-rendered Jinja2 pages that call the same catalog and service functions as the API's routes, htmx for the
parts that update in place (the build matrix, a build's tasks, the model search), and Chart.js for the report's
latency chart. Every script and style is served from ``static/`` (vendored, with its licence): an offline farm
has no CDN. Signing in turns an API token into a session cookie (``session.py``).
"""

from __future__ import annotations

from fastapi import FastAPI
from fastapi.staticfiles import StaticFiles

from api.ui.render import HERE, error_response

__all__ = ["error_response", "mount"]


def mount(app: FastAPI) -> None:
    """Add the dashboard's pages and its static files to ``app``."""
    from api.ui import builds, farm, models, resolve, signin

    for module in (signin, models, builds, resolve, farm):
        app.include_router(module.router, include_in_schema=False)
    app.mount("/ui/static", StaticFiles(directory=HERE / "static"), name="ui-static")
