"""ASGI entry point: ``uvicorn api.main:app``."""

from enginefarm.api.app import create_app

app = create_app()
