"""Each engine's kind key: its kind facts as one number, by which a model's engines are grouped into kinds

Revision ID: 0011
Revises: 0010
"""

import sqlalchemy as sa
from alembic import op

from enginefarm.core.compat import KIND_FACTS, kind_key

revision = '0011'
down_revision = '0010'
branch_labels = None
depends_on = None

_PAGE = 5000  # engines read and keyed at a time


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
