"""PostgreSQL: any statement that writes what a build's progress shows sends NOTIFY enginefarm_builds

Revision ID: 0012
Revises: 0011

A client waiting for a build (GET /v1/builds/{id}?wait=) is answered as soon as this arrives
(storage/changes.py). A trigger rather than a call at each write: bulk updates and raw SQL notify too. One
statement-level trigger per table: one notification per statement, however many rows, and PostgreSQL delivers a
transaction's identical notifications once, at its commit. SQLite needs none (its data_version moves with any
commit).
"""

from alembic import op

revision = '0012'
down_revision = '0011'
branch_labels = None
depends_on = None

CHANNEL = 'enginefarm_builds'  # storage.changes.BUILDS_CHANNEL at this revision
TABLES = ('builds', 'build_tasks', 'benchmark_tasks', 'engines', 'benchmarks', 'engine_verdicts')
FUNCTION = 'enginefarm_builds_notify'


def upgrade() -> None:
    if op.get_bind().dialect.name != 'postgresql':
        return
    op.execute(
        f"CREATE OR REPLACE FUNCTION {FUNCTION}() RETURNS trigger LANGUAGE plpgsql AS "
        f"$$ BEGIN PERFORM pg_notify('{CHANNEL}', ''); RETURN NULL; END $$"
    )
    for table in TABLES:
        op.execute(
            f"CREATE TRIGGER {FUNCTION} AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON {table} "
            f"FOR EACH STATEMENT EXECUTE FUNCTION {FUNCTION}()"
        )


def downgrade() -> None:
    if op.get_bind().dialect.name != 'postgresql':
        return
    for table in TABLES:
        op.execute(f"DROP TRIGGER IF EXISTS {FUNCTION} ON {table}")
    op.execute(f"DROP FUNCTION IF EXISTS {FUNCTION}()")
