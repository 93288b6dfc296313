"""The Python client, the client commands, the local engine cache, CI gating and Triton export."""

from enginefarm.client.errors import ApiError
from enginefarm.client.jobs import BuildJob
from enginefarm.client.offline import resolve_offline
from enginefarm.client.sdk import Client, Fetched

__all__ = ["ApiError", "BuildJob", "Client", "Fetched", "resolve_offline"]
