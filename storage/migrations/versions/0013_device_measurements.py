"""Device measurements: figures deploy machines measured of an engine and posted back, per project

Revision ID: 0013
Revises: 0012
"""

import sqlalchemy as sa
from alembic import op

revision = '0013'
down_revision = '0012'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        'device_measurements',
        sa.Column('id', sa.Integer(), nullable=False),
        sa.Column('engine_id', sa.Integer(), nullable=False),
        sa.Column('project', sa.String(length=64), nullable=False, server_default=''),
        sa.Column('source', sa.String(length=16), nullable=False),
        sa.Column('machine_id', sa.String(length=64), nullable=False),
        sa.Column('gpu_name', sa.String(length=200), nullable=True),
        sa.Column('compute_capability', sa.String(length=8), nullable=True),
        sa.Column('cpu_name', sa.String(length=200), nullable=True),
        sa.Column('machine', sa.JSON(), nullable=False),
        sa.Column('runtime', sa.String(length=64), nullable=False),
        sa.Column('runtime_version', sa.String(length=64), nullable=False),
        sa.Column('shapes', sa.JSON(), nullable=False),
        sa.Column('median_ms', sa.Float(), nullable=False),
        sa.Column('p99_ms', sa.Float(), nullable=True),
        sa.Column('throughput_qps', sa.Float(), nullable=True),
        sa.Column('stats', sa.JSON(), nullable=False),
        sa.Column('accuracy', sa.JSON(), nullable=True),
        sa.Column('accuracy_pass', sa.Boolean(), nullable=True),
        sa.Column('token_id', sa.Integer(), nullable=True),
        sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(['engine_id'], ['engines.id']),
        sa.ForeignKeyConstraint(['token_id'], ['api_tokens.id']),
        sa.PrimaryKeyConstraint('id'),
    )
    op.create_index('ix_device_measurements_engine_id', 'device_measurements', ['engine_id'], unique=False)
    op.create_index('ix_device_measurements_token_id', 'device_measurements', ['token_id'], unique=False)
    op.create_index('ix_device_measurements_created_at', 'device_measurements', ['created_at'], unique=False)


def downgrade() -> None:
    op.drop_table('device_measurements')
