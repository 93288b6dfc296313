"""FastAPI's own OpenTelemetry instrumentation: off unless ENGINEFARM_OPENTELEMETRY asks for it.

Left at FastAPI's default, every request looked for a configured OpenTelemetry provider (about a fifth of a 304's
CPU in the app, ``bench/appcpu.py``); the farm's metrics are Prometheus'. A deployment that runs the API with
providers set (``opentelemetry-instrument``) turns it on and gets a server span per request. Run in a fresh
interpreter: the global provider cannot be set twice in one process."""

from __future__ import annotations

import subprocess
import sys

SCRIPT = r"""
import json, sys
from fastapi.testclient import TestClient
from opentelemetry import trace

spans = []


class Tracer(trace.NoOpTracer):
    def start_span(self, name, *args, **kwargs):
        spans.append(name)
        return super().start_span(name, *args, **kwargs)


class Provider(trace.TracerProvider):
    def get_tracer(self, *args, **kwargs):
        return Tracer()


trace.set_tracer_provider(Provider())
from api.app import create_app
from enginefarm.core.config import Settings

seen = {}
for on in (False, True):
    settings = Settings(data_dir=sys.argv[1] + f"/{on}", opentelemetry=on)
    with TestClient(create_app(settings)) as http:
        del spans[:]
        assert http.get("/healthz").status_code == 200
        seen[str(on)] = list(spans)
print(json.dumps(seen))
"""


def test_request_spans_only_when_asked_for(tmp_path):
    done = subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    import json

    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["False"] == []
    assert seen["True"] and seen["True"][0].startswith("GET"), seen  # the request's server span
