"""Each engine's kind key: its kind facts as one number, by which a model's engines are grouped into kinds

Revision ID: 0011
Revises: 0010
"""

import hashlib
import json

import sqlalchemy as sa
from alembic import op

revision = '0011'
down_revision = '0010'
branch_labels = None
depends_on = None

_PAGE = 5000  # engines read and keyed at a time
# The kind facts and their key as they are at this revision (enginefarm.core.compat.KIND_FACTS and kind_key, copied,
# so a later change there does not change what this revision writes; tests/e2e/storage/test_migrations.py holds the two
# equal as long as they are).
KIND_FACTS = (
    'target',
    'backend',
    'backend_version',
    'precision',
    'platform',
    'compute_capability',
    'compute_capabilities',
    'gpu_name',
    'trt_version',
    'cuda_version',
    'driver_version',
    'hardware_compat',
    'version_compatible',
)
_DEFAULTS = {'compute_capabilities': [], 'hardware_compat': 'none', 'version_compatible': False}


def kind_key(facts: dict) -> int:
    values = []
    for name in KIND_FACTS:
        value = facts.get(name)
        if value is None:
            value = _DEFAULTS.get(name)
        values.append(bool(value) if name == 'version_compatible' else value)
    text = json.dumps(values, separators=(',', ':')).encode()
    return int.from_bytes(hashlib.blake2b(text, digest_size=8).digest(), 'big', signed=True)


def upgrade() -> None:
    with op.batch_alter_table('engines') as batch:
        batch.add_column(sa.Column('kind_key', sa.BigInteger(), nullable=True))
    types: dict[str, sa.types.TypeEngine] = {'compute_capabilities': sa.JSON(), 'version_compatible': sa.Boolean()}
    engines = sa.table(
        'engines',
        sa.column('id', sa.Integer()),
        sa.column('kind_key', sa.BigInteger()),
        *(sa.column(name, types.get(name, sa.String())) for name in KIND_FACTS),
    )
    read = sa.select(engines.c.id, *(engines.c[name] for name in KIND_FACTS)).order_by(engines.c.id).limit(_PAGE)
    write = engines.update().where(engines.c.id == sa.bindparam('engine')).values(kind_key=sa.bindparam('key'))
    conn, last = op.get_bind(), None
    while rows := conn.execute(read if last is None else read.where(engines.c.id > last)).all():
        conn.execute(write, [{'engine': r.id, 'key': kind_key(r._asdict())} for r in rows])
        last = rows[-1].id
    with op.batch_alter_table('engines') as batch:
        batch.alter_column('kind_key', existing_type=sa.BigInteger(), nullable=False)


def downgrade() -> None:
    with op.batch_alter_table('engines') as batch:
        batch.drop_column('kind_key')
