"""benchmark stage: benchmark tasks, sweeps, derived models and samples

Revision ID: 0003
Revises: 0002
"""

import sqlalchemy as sa
from alembic import op

revision = '0003'
down_revision = '0002'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        'sweeps',
        sa.Column('id', sa.Integer(), nullable=False),
        sa.Column('model_id', sa.Integer(), nullable=False),
        sa.Column('axes', sa.JSON(), nullable=False),
        sa.Column('targets', sa.JSON(), nullable=False),
        sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ['model_id'],
            ['models.id'],
        ),
        sa.PrimaryKeyConstraint('id'),
    )
    op.create_index('ix_sweeps_model_id', 'sweeps', ['model_id'], unique=False)
    op.create_table(
        'benchmark_tasks',
        sa.Column('id', sa.Integer(), nullable=False),
        sa.Column('engine_id', sa.Integer(), nullable=False),
        sa.Column('target', sa.String(length=64), nullable=False),
        sa.Column('checks_hash', sa.String(length=64), nullable=False),
        sa.Column('spec', sa.JSON(), nullable=False),
        sa.Column('state', sa.String(length=16), nullable=False),
        sa.Column('worker_id', sa.String(length=200), nullable=True),
        sa.Column('attempts', sa.Integer(), nullable=False),
        sa.Column('error', sa.Text(), nullable=True),
        sa.Column('queued_at', sa.DateTime(timezone=True), nullable=False),
        sa.Column('started_at', sa.DateTime(timezone=True), nullable=True),
        sa.Column('finished_at', sa.DateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(
            ['engine_id'],
            ['engines.id'],
        ),
        sa.PrimaryKeyConstraint('id'),
        sa.UniqueConstraint('engine_id', 'checks_hash', name='uq_benchmark_tasks_engine_checks'),
    )
    op.create_index('ix_benchmark_tasks_engine_id', 'benchmark_tasks', ['engine_id'], unique=False)
    op.create_index('ix_benchmark_tasks_state', 'benchmark_tasks', ['state'], unique=False)
    op.create_index('ix_benchmark_tasks_target', 'benchmark_tasks', ['target'], unique=False)
    with op.batch_alter_table('models') as batch:
        batch.add_column(sa.Column('source_model_id', sa.Integer(), nullable=True))
        batch.add_column(sa.Column('derivation', sa.JSON(), nullable=True))
        batch.add_column(sa.Column('samples_sha256', sa.String(length=64), nullable=True))
        batch.add_column(sa.Column('samples_key', sa.String(length=200), nullable=True))
        batch.add_column(sa.Column('samples_info', sa.JSON(), nullable=True))
        batch.create_index('ix_models_source_model_id', ['source_model_id'], unique=False)
        batch.create_foreign_key('fk_models_source_model_id', 'models', ['source_model_id'], ['id'])
    with op.batch_alter_table('builds') as batch:
        batch.add_column(sa.Column('sweep_id', sa.Integer(), nullable=True))
        batch.add_column(sa.Column('variant', sa.String(length=200), nullable=True))
        batch.add_column(sa.Column('quantize', sa.JSON(), nullable=True))
        batch.create_index('ix_builds_sweep_id', ['sweep_id'], unique=False)
        batch.create_foreign_key('fk_builds_sweep_id', 'sweeps', ['sweep_id'], ['id'])
    with op.batch_alter_table('workers') as batch:
        batch.add_column(sa.Column('bench_targets', sa.JSON(), nullable=False, server_default='[]'))


def downgrade() -> None:
    with op.batch_alter_table('workers') as batch:
        batch.drop_column('bench_targets')
    with op.batch_alter_table('builds') as batch:
        batch.drop_constraint('fk_builds_sweep_id', type_='foreignkey')
        batch.drop_index('ix_builds_sweep_id')
        batch.drop_column('quantize')
        batch.drop_column('variant')
        batch.drop_column('sweep_id')
    with op.batch_alter_table('models') as batch:
        batch.drop_constraint('fk_models_source_model_id', type_='foreignkey')
        batch.drop_index('ix_models_source_model_id')
        batch.drop_column('samples_info')
        batch.drop_column('samples_key')
        batch.drop_column('samples_sha256')
        batch.drop_column('derivation')
        batch.drop_column('source_model_id')
    op.drop_index('ix_benchmark_tasks_target', table_name='benchmark_tasks')
    op.drop_index('ix_benchmark_tasks_state', table_name='benchmark_tasks')
    op.drop_index('ix_benchmark_tasks_engine_id', table_name='benchmark_tasks')
    op.drop_table('benchmark_tasks')
    op.drop_index('ix_sweeps_model_id', table_name='sweeps')
    op.drop_table('sweeps')
