"""Engine run options: the CUDA provider options an onnxruntime/cuda artifact's GPU worker measured fastest

Revision ID: 0015
Revises: 0014
"""

import sqlalchemy as sa
from alembic import op

revision = '0015'
down_revision = '0014'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('engines') as batch:
        batch.add_column(sa.Column('run_options', sa.JSON(), server_default='{}', nullable=False))


def downgrade() -> None:
    with op.batch_alter_table('engines') as batch:
        batch.drop_column('run_options')
