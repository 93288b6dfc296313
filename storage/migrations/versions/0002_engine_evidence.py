"""engine evidence: accuracy, device memory and benchmarks

Revision ID: 0002
Revises: 0001
"""

import sqlalchemy as sa
from alembic import op

revision = '0002'
down_revision = '0001'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('engines') as batch:
        batch.add_column(sa.Column('device_memory_bytes', sa.BigInteger(), nullable=True))
        batch.add_column(sa.Column('accuracy', sa.JSON(), nullable=True))
        batch.add_column(sa.Column('accuracy_pass', sa.Boolean(), nullable=True))
    op.create_table(
        'benchmarks',
        sa.Column('id', sa.Integer(), nullable=False),
        sa.Column('engine_id', sa.Integer(), nullable=False),
        sa.Column('shape_key', sa.String(length=200), nullable=False),
        sa.Column('shapes', sa.JSON(), nullable=False),
        sa.Column('gpu_name', sa.String(length=200), nullable=True),
        sa.Column('compute_capability', sa.String(length=8), nullable=True),
        sa.Column('machine', sa.JSON(), nullable=False),
        sa.Column('median_ms', sa.Float(), nullable=False),
        sa.Column('p99_ms', sa.Float(), nullable=True),
        sa.Column('throughput_qps', sa.Float(), nullable=True),
        sa.Column('stats', sa.JSON(), nullable=False),
        sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ['engine_id'],
            ['engines.id'],
        ),
        sa.PrimaryKeyConstraint('id'),
    )
    op.create_index('ix_benchmarks_engine_id', 'benchmarks', ['engine_id'], unique=False)
    op.create_index('ix_benchmarks_gpu_name', 'benchmarks', ['gpu_name'], unique=False)


def downgrade() -> None:
    op.drop_index('ix_benchmarks_gpu_name', table_name='benchmarks')
    op.drop_index('ix_benchmarks_engine_id', table_name='benchmarks')
    op.drop_table('benchmarks')
    with op.batch_alter_table('engines') as batch:
        batch.drop_column('accuracy_pass')
        batch.drop_column('accuracy')
        batch.drop_column('device_memory_bytes')
