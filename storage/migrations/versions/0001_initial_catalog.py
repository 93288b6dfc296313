"""initial catalog

Revision ID: 0001
Revises:
Create Date: 2026-11-21 09:54:10.040224
"""

import sqlalchemy as sa
from alembic import op

revision = '0001'
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        'models',
        sa.Column('id', sa.Integer(), nullable=False),
        sa.Column('name', sa.String(length=200), nullable=False),
        sa.Column('version', sa.String(length=100), nullable=False),
        sa.Column('seq', sa.Integer(), nullable=False),
        sa.Column('sha256', sa.String(length=64), nullable=False),
        sa.Column('format', sa.String(length=8), nullable=False),
        sa.Column('blob_key', sa.String(length=200), nullable=False),
        sa.Column('size', sa.BigInteger(), nullable=False),
        sa.Column('info', sa.JSON(), nullable=False),
        sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint('id'),
        sa.UniqueConstraint('name', 'version', name='uq_models_name_version'),
    )
    with op.batch_alter_table('models', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_models_name'), ['name'], unique=False)
        batch_op.create_index(batch_op.f('ix_models_sha256'), ['sha256'], unique=False)

    op.create_table(
        'workers',
        sa.Column('id', sa.String(length=200), nullable=False),
        sa.Column('hostname', sa.String(length=200), nullable=False),
        sa.Column('targets', sa.JSON(), nullable=False),
        sa.Column('probe', sa.JSON(), nullable=False),
        sa.Column('started_at', sa.DateTime(timezone=True), nullable=False),
        sa.Column('last_seen', sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint('id'),
    )
    with op.batch_alter_table('workers', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_workers_last_seen'), ['last_seen'], unique=False)

    op.create_table(
        'builds',
        sa.Column('id', sa.Integer(), nullable=False),
        sa.Column('model_id', sa.Integer(), nullable=False),
        sa.Column('spec', sa.JSON(), nullable=False),
        sa.Column('spec_hash', sa.String(length=64), nullable=False),
        sa.Column('targets', sa.JSON(), nullable=False),
        sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ['model_id'],
            ['models.id'],
        ),
        sa.PrimaryKeyConstraint('id'),
    )
    with op.batch_alter_table('builds', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_builds_model_id'), ['model_id'], unique=False)
        batch_op.create_index(batch_op.f('ix_builds_spec_hash'), ['spec_hash'], unique=False)

    op.create_table(
        'engines',
        sa.Column('id', sa.Integer(), nullable=False),
        sa.Column('model_id', sa.Integer(), nullable=False),
        sa.Column('model_sha256', sa.String(length=64), nullable=False),
        sa.Column('spec_hash', sa.String(length=64), nullable=False),
        sa.Column('target', sa.String(length=64), nullable=False),
        sa.Column('backend', sa.String(length=32), nullable=False),
        sa.Column('backend_version', sa.String(length=64), nullable=False),
        sa.Column('precision', sa.String(length=8), nullable=False),
        sa.Column('compute_capability', sa.String(length=8), nullable=True),
        sa.Column('compute_capabilities', sa.JSON(), nullable=False),
        sa.Column('gpu_name', sa.String(length=200), nullable=True),
        sa.Column('platform', sa.String(length=16), nullable=False),
        sa.Column('trt_version', sa.String(length=64), nullable=True),
        sa.Column('cuda_version', sa.String(length=32), nullable=True),
        sa.Column('driver_version', sa.String(length=32), nullable=True),
        sa.Column('hardware_compat', sa.String(length=32), nullable=False),
        sa.Column('version_compatible', sa.Boolean(), nullable=False),
        sa.Column('sha256', sa.String(length=64), nullable=False),
        sa.Column('size', sa.BigInteger(), nullable=False),
        sa.Column('blob_key', sa.String(length=200), nullable=False),
        sa.Column('build_seconds', sa.Float(), nullable=False),
        sa.Column('built_by', sa.String(length=200), nullable=True),
        sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ['model_id'],
            ['models.id'],
        ),
        sa.PrimaryKeyConstraint('id'),
        sa.UniqueConstraint('model_sha256', 'spec_hash', 'target', 'backend_version', name='uq_engines_build_key'),
    )
    with op.batch_alter_table('engines', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_engines_backend'), ['backend'], unique=False)
        batch_op.create_index(batch_op.f('ix_engines_compute_capability'), ['compute_capability'], unique=False)
        batch_op.create_index(batch_op.f('ix_engines_model_id'), ['model_id'], unique=False)
        batch_op.create_index(batch_op.f('ix_engines_precision'), ['precision'], unique=False)
        batch_op.create_index(batch_op.f('ix_engines_sha256'), ['sha256'], unique=False)
        batch_op.create_index(batch_op.f('ix_engines_spec_hash'), ['spec_hash'], unique=False)
        batch_op.create_index(batch_op.f('ix_engines_target'), ['target'], unique=False)
        batch_op.create_index(batch_op.f('ix_engines_trt_version'), ['trt_version'], unique=False)

    op.create_table(
        'build_tasks',
        sa.Column('id', sa.Integer(), nullable=False),
        sa.Column('build_id', sa.Integer(), nullable=False),
        sa.Column('target', sa.String(length=64), nullable=False),
        sa.Column('state', sa.String(length=16), nullable=False),
        sa.Column('worker_id', sa.String(length=200), nullable=True),
        sa.Column('attempts', sa.Integer(), nullable=False),
        sa.Column('reused', sa.Boolean(), nullable=False),
        sa.Column('engine_id', sa.Integer(), nullable=True),
        sa.Column('error', sa.Text(), nullable=True),
        sa.Column('log_tail', sa.Text(), nullable=True),
        sa.Column('queued_at', sa.DateTime(timezone=True), nullable=False),
        sa.Column('started_at', sa.DateTime(timezone=True), nullable=True),
        sa.Column('finished_at', sa.DateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(
            ['build_id'],
            ['builds.id'],
        ),
        sa.ForeignKeyConstraint(
            ['engine_id'],
            ['engines.id'],
        ),
        sa.PrimaryKeyConstraint('id'),
    )
    with op.batch_alter_table('build_tasks', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_build_tasks_build_id'), ['build_id'], unique=False)
        batch_op.create_index(batch_op.f('ix_build_tasks_state'), ['state'], unique=False)
        batch_op.create_index(batch_op.f('ix_build_tasks_target'), ['target'], unique=False)


def downgrade() -> None:
    with op.batch_alter_table('build_tasks', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_build_tasks_target'))
        batch_op.drop_index(batch_op.f('ix_build_tasks_state'))
        batch_op.drop_index(batch_op.f('ix_build_tasks_build_id'))

    op.drop_table('build_tasks')
    with op.batch_alter_table('engines', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_engines_trt_version'))
        batch_op.drop_index(batch_op.f('ix_engines_target'))
        batch_op.drop_index(batch_op.f('ix_engines_spec_hash'))
        batch_op.drop_index(batch_op.f('ix_engines_sha256'))
        batch_op.drop_index(batch_op.f('ix_engines_precision'))
        batch_op.drop_index(batch_op.f('ix_engines_model_id'))
        batch_op.drop_index(batch_op.f('ix_engines_compute_capability'))
        batch_op.drop_index(batch_op.f('ix_engines_backend'))

    op.drop_table('engines')
    with op.batch_alter_table('builds', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_builds_spec_hash'))
        batch_op.drop_index(batch_op.f('ix_builds_model_id'))

    op.drop_table('builds')
    with op.batch_alter_table('workers', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_workers_last_seen'))

    op.drop_table('workers')
    with op.batch_alter_table('models', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_models_sha256'))
        batch_op.drop_index(batch_op.f('ix_models_name'))

    op.drop_table('models')
