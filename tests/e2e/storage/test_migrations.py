"""The Alembic migrations build exactly the schema the tables declare, on SQLite and on PostgreSQL,
and the newest one upgrades a catalog that already holds data."""

from __future__ import annotations

import importlib

import pytest
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import create_engine, text

from enginefarm.core.config import Settings
from server import localservers
from storage.db import alembic_config, migrate
from storage.tables import Base


def _diff(url: str) -> list:
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            return compare_metadata(MigrationContext.configure(conn, opts={"compare_type": True}), Base.metadata)
    finally:
        engine.dispose()


@pytest.fixture(params=["sqlite", "postgresql"])
def database_url(request, tmp_path, base_services):
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'catalog.db'}"
    else:
        with localservers.scratch_postgres("enginefarm_migrations") as url:
            yield url


def test_migrations_match_the_tables(database_url, tmp_path):
    migrate(Settings(data_dir=tmp_path, database_url=database_url))
    assert _diff(database_url) == []


def test_evidence_migration_upgrades_a_catalog_with_engines(database_url, tmp_path):
    cfg = alembic_config(database_url)
    command.upgrade(cfg, "0001")
    engine = create_engine(database_url)
    try:
        with engine.begin() as conn:
            conn.execute(
                text(
                    "INSERT INTO models (id, name, version, seq, sha256, format, blob_key, size, info, created_at) "
                    "VALUES (1, 'm', '1', 1, :sha, 'onnx', 'k', 1, '{}', CURRENT_TIMESTAMP)"
                ),
                {"sha": "a" * 64},
            )
            conn.execute(
                text(
                    "INSERT INTO engines (id, model_id, model_sha256, spec_hash, target, backend, backend_version, "
                    "precision, compute_capabilities, platform, hardware_compat, version_compatible, sha256, size, "
                    "blob_key, build_seconds, created_at) "
                    "VALUES (1, 1, :sha, :sha, 'tensorrt-rtx/sm86', 'tensorrt-rtx', '1.7', 'fp32', '[]', 'x86_64', "
                    "'none', false, :sha, 1, 'e', 0.1, CURRENT_TIMESTAMP)"
                ),
                {"sha": "a" * 64},
            )
        command.upgrade(cfg, "head")
        with engine.connect() as conn:
            row = conn.execute(text("SELECT device_memory_bytes FROM engines WHERE id = 1")).one()
            assert tuple(row) == (None,)
            assert conn.execute(text("SELECT count(*) FROM engine_verdicts")).scalar() == 0
            assert conn.execute(text("SELECT count(*) FROM benchmarks")).scalar() == 0
        command.downgrade(cfg, "0001")
        with engine.connect() as conn:
            assert conn.execute(text("SELECT count(*) FROM engines")).scalar() == 1
    finally:
        engine.dispose()


def test_build_token_migration_keeps_builds_and_forgets_deleted_tokens(database_url, tmp_path):
    """Builds made before builds recorded their token have none; a deleted token leaves its builds, unowned."""
    from storage.db import make_engine

    cfg = alembic_config(database_url)
    command.upgrade(cfg, "0005")
    engine = make_engine(database_url)  # SQLite enforces foreign keys (and ON DELETE) only where told to
    try:
        with engine.begin() as conn:
            conn.execute(
                text(
                    "INSERT INTO models (id, name, version, seq, sha256, format, blob_key, size, info, created_at) "
                    "VALUES (1, 'm', '1', 1, :sha, 'onnx', 'k', 1, '{}', CURRENT_TIMESTAMP)"
                ),
                {"sha": "a" * 64},
            )
            conn.execute(
                text(
                    "INSERT INTO builds (id, model_id, spec, spec_hash, targets, created_at) "
                    "VALUES (1, 1, '{}', :sha, '[]', CURRENT_TIMESTAMP)"
                ),
                {"sha": "a" * 64},
            )
            conn.execute(
                text(
                    "INSERT INTO api_tokens (id, name, token_hash, prefix, scopes, created_at) "
                    "VALUES (7, 't', :sha, 'ef_', '[\"build\"]', CURRENT_TIMESTAMP)"
                ),
                {"sha": "b" * 64},
            )
        command.upgrade(cfg, "head")
        with engine.begin() as conn:
            assert conn.execute(text("SELECT token_id FROM builds WHERE id = 1")).scalar() is None
            conn.execute(text("UPDATE builds SET token_id = 7 WHERE id = 1"))
        with engine.begin() as conn:
            conn.execute(text("DELETE FROM api_tokens WHERE id = 7"))
        with engine.connect() as conn:
            assert conn.execute(text("SELECT id, token_id FROM builds")).all() == [(1, None)]
        command.downgrade(cfg, "0005")
        with engine.connect() as conn:
            assert conn.execute(text("SELECT count(*) FROM builds")).scalar() == 1
    finally:
        engine.dispose()


def test_profile_migration_fills_engines_from_their_build_spec(database_url, tmp_path):
    """Engines built before engines recorded their profiles get them from their build's spec, with the model's
    fixed-size inputs folded in; an engine whose build is gone keeps none."""
    import json

    cfg = alembic_config(database_url)
    command.upgrade(cfg, "0006")
    engine = create_engine(database_url)
    info = {
        "inputs": [
            {"name": "images", "dtype": "FLOAT", "dims": ["n", 3, "h", "w"]},
            {"name": "scale", "dtype": "FLOAT", "dims": [1, 2]},
        ]
    }
    rng = {"min": [1, 3, 64, 64], "opt": [1, 3, 640, 640], "max": [4, 3, 1024, 1024]}
    engine_sql = (
        "INSERT INTO engines (id, model_id, model_sha256, spec_hash, target, backend, backend_version, "
        "precision, compute_capabilities, platform, hardware_compat, version_compatible, sha256, size, "
        "blob_key, build_seconds, created_at) VALUES (:id, 1, :sha, :spec, 'tensorrt-rtx/sm86', "
        "'tensorrt-rtx', '1.7', 'fp32', '[]', 'x86_64', 'none', false, :sha, 1, 'e', 0.1, CURRENT_TIMESTAMP)"
    )
    try:
        with engine.begin() as conn:
            conn.execute(
                text(
                    "INSERT INTO models (id, name, version, seq, sha256, format, blob_key, size, info, created_at) "
                    "VALUES (1, 'm', '1', 1, :sha, 'onnx', 'k', 1, :info, CURRENT_TIMESTAMP)"
                ),
                {"sha": "a" * 64, "info": json.dumps(info)},
            )
            conn.execute(
                text(
                    "INSERT INTO builds (id, model_id, spec, spec_hash, targets, created_at) "
                    "VALUES (1, 1, :spec, :h, '[]', CURRENT_TIMESTAMP)"
                ),
                {"spec": json.dumps({"precision": "fp32", "profiles": [{"images": rng}]}), "h": "b" * 64},
            )
            conn.execute(text(engine_sql), {"id": 1, "sha": "a" * 64, "spec": "b" * 64})
            conn.execute(
                text(engine_sql.replace("'tensorrt-rtx/sm86'", "'tensorrt-rtx/sm89'")),
                {"id": 2, "sha": "a" * 64, "spec": "c" * 64},
            )
        command.upgrade(cfg, "head")
        with engine.connect() as conn:
            rows = dict(conn.execute(text("SELECT id, profiles FROM engines ORDER BY id")).all())
        got = {k: json.loads(v) if isinstance(v, str) else v for k, v in rows.items()}
        assert got == {1: [{"images": rng, "scale": {"min": [1, 2], "opt": [1, 2], "max": [1, 2]}}], 2: []}
        command.downgrade(cfg, "0006")
        with engine.connect() as conn:
            assert conn.execute(text("SELECT count(*) FROM engines")).scalar() == 2
    finally:
        engine.dispose()


def test_verdict_migration_gives_each_check_to_the_project_of_the_model_it_was_built_for(database_url, tmp_path):
    """Before 0010 an engine held one verdict and its benchmarks were everyone's; after it, they are the project's
    whose model the engine was built for, and another project that shares the bytes starts with none."""
    cfg = alembic_config(database_url)
    command.upgrade(cfg, "0009")
    engine = create_engine(database_url)
    sha = "a" * 64
    try:
        with engine.begin() as conn:
            for mid, project in ((1, "team-a"), (2, "team-b")):
                conn.execute(
                    text(
                        "INSERT INTO models (id, project, name, version, seq, sha256, format, blob_key, size, "
                        "info, created_at) VALUES (:id, :p, 'm', '1', 1, :sha, 'onnx', 'k', 1, '{}', "
                        "CURRENT_TIMESTAMP)"
                    ),
                    {"id": mid, "p": project, "sha": sha},
                )
            conn.execute(
                text(
                    "INSERT INTO engines (id, model_id, model_sha256, spec_hash, target, backend, backend_version, "
                    "precision, compute_capabilities, platform, hardware_compat, version_compatible, sha256, size, "
                    "blob_key, build_seconds, created_at, accuracy, accuracy_pass, profiles) VALUES (1, 1, :sha, :sha, "
                    "'onnxruntime/cpu-x86_64', 'onnxruntime', '1.23', 'fp32', '[]', 'x86_64', 'none', false, :sha, 1, "
                    "'e', 0.1, CURRENT_TIMESTAMP, :acc, false, '[]')"
                ),
                {"sha": sha, "acc": '{"pass": false, "worst": {}}'},
            )
            conn.execute(
                text(
                    "INSERT INTO benchmarks (engine_id, shape_key, shapes, machine, median_ms, stats, "
                    "created_at) VALUES (1, 'opt', '{}', '{}', 2.5, '{}', CURRENT_TIMESTAMP)"
                )
            )
            conn.execute(
                text(
                    "INSERT INTO benchmark_tasks (engine_id, target, checks_hash, spec, state, attempts, "
                    "queued_at) VALUES (1, 'onnxruntime/cpu-x86_64', :sha, '{}', 'succeeded', 1, "
                    "CURRENT_TIMESTAMP)"
                ),
                {"sha": sha},
            )
        command.upgrade(cfg, "0010")
        with engine.connect() as conn:
            verdicts = conn.execute(text("SELECT engine_id, project, accuracy_pass FROM engine_verdicts")).all()
            assert [tuple(v) for v in verdicts] == [(1, "team-a", False)]
            assert conn.execute(text("SELECT project FROM benchmarks")).scalar() == "team-a"
            assert conn.execute(text("SELECT project FROM benchmark_tasks")).scalar() == "team-a"
        command.downgrade(cfg, "0009")
        with engine.connect() as conn:
            row = conn.execute(text("SELECT accuracy_pass FROM engines WHERE id = 1")).one()
            assert row[0] in (False, 0)
    finally:
        engine.dispose()


def test_kind_key_migration_keys_every_engine_as_a_new_one_would_be(database_url, tmp_path):
    """0011 writes each engine's kind key from its kind facts: the key an engine of the same facts gets when it is
    written today, one key for two engines of one kind (other bytes, other size), another for another kind; the
    column is then required."""
    from enginefarm.core.compat import KIND_FACTS, kind_key

    cfg = alembic_config(database_url)
    command.upgrade(cfg, "0010")
    engine = create_engine(database_url)
    sha = "a" * 64
    insert = text(
        "INSERT INTO engines (id, model_id, model_sha256, spec_hash, target, backend, backend_version, precision, "
        "compute_capability, compute_capabilities, platform, hardware_compat, version_compatible, sha256, size, "
        "blob_key, build_seconds, created_at, profiles) VALUES (:id, 1, :sha, :spec, :target, 'tensorrt-rtx', "
        "'1.7', 'fp16', '8.6', '[\"8.6\"]', 'x86_64', 'none', :vc, :bytes, :size, 'e', 0.1, CURRENT_TIMESTAMP, '[]')"
    )
    try:
        with engine.begin() as conn:
            conn.execute(
                text(
                    "INSERT INTO models (id, name, version, seq, sha256, format, blob_key, size, info, created_at) "
                    "VALUES (1, 'm', '1', 1, :sha, 'onnx', 'k', 1, '{}', CURRENT_TIMESTAMP)"
                ),
                {"sha": sha},
            )
            for eid, spec, target, vc, size in (
                (1, "a", "tensorrt-rtx/sm86", False, 10),
                (2, "b", "tensorrt-rtx/sm86", False, 20),  # the same kind, other bytes
                (3, "a", "tensorrt-rtx/sm89", False, 10),  # another target
                (4, "c", "tensorrt-rtx/sm86", True, 10),  # version-compatible: another kind
            ):
                conn.execute(
                    insert,
                    {
                        "id": eid,
                        "sha": sha,
                        "spec": spec * 64,
                        "target": target,
                        "vc": vc,
                        "bytes": str(eid) * 64,
                        "size": size,
                    },
                )
        command.upgrade(cfg, "0011")
        with engine.connect() as conn:
            keys = dict(conn.execute(text("SELECT id, kind_key FROM engines")).all())
        facts = {
            "target": "tensorrt-rtx/sm86",
            "backend": "tensorrt-rtx",
            "backend_version": "1.7",
            "precision": "fp16",
            "platform": "x86_64",
            "compute_capability": "8.6",
            "compute_capabilities": ["8.6"],
        }
        assert keys[1] == keys[2] == kind_key(facts)
        assert keys[3] == kind_key(facts | {"target": "tensorrt-rtx/sm89"})
        assert keys[4] == kind_key(facts | {"version_compatible": True})
        assert len({keys[1], keys[3], keys[4]}) == 3
        migration = importlib.import_module("storage.migrations.versions.0011_engine_kind_key")
        assert migration.KIND_FACTS == KIND_FACTS  # its frozen copy, equal to the farm's while they stay so
        with pytest.raises(Exception, match="(?i)null|constraint"), engine.begin() as conn:
            conn.execute(
                insert,
                {"id": 5, "sha": sha, "spec": "d" * 64, "target": "x", "vc": False, "bytes": "5" * 64, "size": 1},
            )
    finally:
        engine.dispose()


def test_build_progress_migration_notifies_any_write_on_postgresql(base_services):
    """0012's triggers: a raw UPDATE of a build task (no ORM, as a bulk update writes) sends NOTIFY enginefarm_builds
    at its commit, and nothing before; a read sends none; downgrading removes them."""
    import psycopg

    from storage.changes import BUILDS_CHANNEL

    with localservers.scratch_postgres("enginefarm_migrations") as url:
        cfg = alembic_config(url)
        command.upgrade(cfg, "0012")
        dsn = url.replace("postgresql+psycopg://", "postgresql://")
        with psycopg.connect(dsn, autocommit=True) as listener, psycopg.connect(dsn) as writer:
            listener.execute(f"LISTEN {BUILDS_CHANNEL}")

            def heard() -> list[str]:
                return [n.channel for n in listener.notifies(timeout=0.5, stop_after=1)]

            writer.execute("UPDATE build_tasks SET state = 'failed' WHERE id = 0")  # no row: still a write statement
            assert heard() == []  # not before the commit
            writer.commit()
            assert heard() == [BUILDS_CHANNEL]
            writer.execute("SELECT count(*) FROM build_tasks")
            writer.commit()
            assert heard() == []  # a read notifies nothing
            command.downgrade(cfg, "0011")
            writer.execute("UPDATE build_tasks SET state = 'failed' WHERE id = 0")
            writer.commit()
            assert heard() == []
