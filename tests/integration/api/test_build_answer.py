"""The answer to POST /v1/builds is made before the commit: once a build is recorded nothing more can fail.

A database that went away between the commit and a read for the answer used to give the client a 503 for a build
that existed (seen once in the PostgreSQL-restart fault test: 74 build rows for 73 builds answered 202); a retry
then recorded it twice.
"""

from __future__ import annotations

from fastapi.testclient import TestClient
from sqlalchemy.exc import OperationalError

from api.app import create_app
from enginefarm.core.config import Settings
from enginefarm.graph.samples import conv_net, sample_spec
from server.embedded import issue_token
from storage import catalog
from storage.db import session_scope


def test_a_database_failing_after_the_commit_does_not_hide_the_build(tmp_path, monkeypatch):
    settings = Settings(data_dir=tmp_path, reconcile_seconds=0, gc_interval_seconds=0)
    with TestClient(create_app(settings)) as http:
        http.headers["Authorization"] = f"Bearer {issue_token(settings, 'answer', ['admin'])}"
        model = http.post(
            "/v1/models", data={"name": "answer"}, files={"file": ("m.onnx", conv_net(seed=5).SerializeToString())}
        ).json()["id"]

        def gone(*_args, **_kwargs):
            raise OperationalError("SELECT", {}, Exception("server closed the connection unexpectedly"))

        # Every read of a build after this point fails, as it would with the database gone.
        monkeypatch.setattr(catalog, "get_build", gone)
        r = http.post(
            "/v1/builds",
            json={
                "model_id": model,
                "targets": ["onnxruntime/cpu-x86_64"],
                "spec": sample_spec(),
                "queue_without_worker": True,
            },
        )
        monkeypatch.undo()
        with session_scope(settings) as s:
            recorded = [b.id for b in catalog.list_builds(s)]
        assert r.status_code == 202, r.text
        assert recorded == [r.json()["id"]]
        assert [t["state"] for t in r.json()["tasks"]] == ["queued"]
