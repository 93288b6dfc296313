"""Engines record the optimization profiles they were built with

Revision ID: 0007
Revises: 0006

Existing engines get theirs from the spec of a build with the same spec hash (its profiles already hold the
static shapes) and the fixed dims of their model's inputs, as enginefarm.core.domain.engine_profiles does for new ones.
"""

import json

import sqlalchemy as sa
from alembic import op

revision = '0007'
down_revision = '0006'
branch_labels = None
depends_on = None


def _json(value):
    return json.loads(value) if isinstance(value, str) else value


def _profiles(spec: dict | None, info: dict | None) -> list:
    """A copy of enginefarm.core.domain.engine_profiles as of this revision: a migration must not change with the
    code."""
    fixed = set((spec or {}).get("fixed_inputs") or {})
    static: dict[str, dict[str, list] | None] = {}
    for t in (info or {}).get("inputs", []):
        dims = t.get("dims") or []
        if t["name"] in fixed or not dims:
            continue
        if all(isinstance(d, int) and not isinstance(d, bool) and d > 0 for d in dims):
            static[t["name"]] = {"min": list(dims), "opt": list(dims), "max": list(dims)}
        else:
            static[t["name"]] = None
    profiles = [dict(p) for p in (spec or {}).get("profiles") or []]
    if not profiles:
        return [dict(static)] if static and None not in static.values() else []
    for p in profiles:
        for name, rng in static.items():
            if name not in p and rng is not None:
                p[name] = rng
    return profiles


def upgrade() -> None:
    with op.batch_alter_table('engines') as batch:
        batch.add_column(sa.Column('profiles', sa.JSON(), server_default='[]', nullable=False))
    conn = op.get_bind()
    specs = {h: _json(s) for h, s in conn.execute(sa.text("SELECT spec_hash, spec FROM builds ORDER BY id"))}
    rows = conn.execute(
        sa.text(
            "SELECT e.id, e.spec_hash, m.info FROM engines e JOIN models m ON m.id = e.model_id "
            "WHERE e.backend <> 'onnxruntime'"
        )
    ).all()
    for engine_id, spec_hash, info in rows:
        profiles = _profiles(specs.get(spec_hash), _json(info))
        if profiles:
            conn.execute(
                sa.text("UPDATE engines SET profiles = :p WHERE id = :id").bindparams(sa.bindparam("p", type_=sa.JSON)),
                {"p": profiles, "id": engine_id},
            )


def downgrade() -> None:
    with op.batch_alter_table('engines') as batch:
        batch.drop_column('profiles')
