"""Verdicts and benchmarks belong to the project that asked for them; an engine row holds only what its bytes are

Revision ID: 0010
Revises: 0009
"""

import sqlalchemy as sa
from alembic import op

revision = '0010'
down_revision = '0009'
branch_labels = None
depends_on = None

# The project each engine's existing checks were made for: the project of the model it was built for.
_ENGINE_PROJECT = (
    "(SELECT models.project FROM engines JOIN models ON models.id = engines.model_id WHERE engines.id = {}.engine_id)"
)


def upgrade() -> None:
    op.create_table(
        'engine_verdicts',
        sa.Column('id', sa.Integer(), nullable=False),
        sa.Column('engine_id', sa.Integer(), nullable=False),
        sa.Column('project', sa.String(length=64), nullable=False, server_default=''),
        sa.Column('accuracy', sa.JSON(), nullable=False),
        sa.Column('accuracy_pass', sa.Boolean(), nullable=True),
        sa.Column('benchmark_task_id', sa.Integer(), nullable=True),
        sa.Column('checked_at', sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(['engine_id'], ['engines.id']),
        sa.ForeignKeyConstraint(['benchmark_task_id'], ['benchmark_tasks.id'], ondelete='SET NULL'),
        sa.PrimaryKeyConstraint('id'),
        sa.UniqueConstraint('engine_id', 'project', name='uq_engine_verdicts_engine_project'),
    )
    op.create_index('ix_engine_verdicts_engine_id', 'engine_verdicts', ['engine_id'], unique=False)
    with op.batch_alter_table('benchmark_tasks') as batch:
        batch.add_column(sa.Column('project', sa.String(length=64), nullable=False, server_default=''))
        batch.drop_constraint('uq_benchmark_tasks_engine_checks', type_='unique')
        batch.create_unique_constraint(
            'uq_benchmark_tasks_engine_checks_project', ['engine_id', 'checks_hash', 'project']
        )
    with op.batch_alter_table('benchmarks') as batch:
        batch.add_column(sa.Column('project', sa.String(length=64), nullable=False, server_default=''))
        batch.add_column(sa.Column('cpu_name', sa.String(length=200), nullable=True))
    # What was checked before this revision was checked for the project of the model the engine was built for.
    for table in ('benchmark_tasks', 'benchmarks'):
        op.execute(f"UPDATE {table} SET project = COALESCE({_ENGINE_PROJECT.format(table)}, '')")
    op.execute(
        "INSERT INTO engine_verdicts (engine_id, project, accuracy, accuracy_pass, checked_at) "
        "SELECT engines.id, models.project, engines.accuracy, engines.accuracy_pass, engines.created_at "
        "FROM engines JOIN models ON models.id = engines.model_id WHERE engines.accuracy IS NOT NULL"
    )
    with op.batch_alter_table('engines') as batch:
        batch.drop_column('accuracy_pass')
        batch.drop_column('accuracy')


def downgrade() -> None:
    with op.batch_alter_table('engines') as batch:
        batch.add_column(sa.Column('accuracy', sa.JSON(), nullable=True))
        batch.add_column(sa.Column('accuracy_pass', sa.Boolean(), nullable=True))
    # Back to one verdict per engine: the one of the project the engine was built for.
    op.execute(
        "UPDATE engines SET accuracy = (SELECT v.accuracy FROM engine_verdicts v JOIN models m "
        "ON m.id = engines.model_id WHERE v.engine_id = engines.id AND v.project = m.project), "
        "accuracy_pass = (SELECT v.accuracy_pass FROM engine_verdicts v JOIN models m "
        "ON m.id = engines.model_id WHERE v.engine_id = engines.id AND v.project = m.project)"
    )
    with op.batch_alter_table('benchmarks') as batch:
        batch.drop_column('cpu_name')
        batch.drop_column('project')
    op.execute(
        "DELETE FROM benchmark_tasks WHERE id NOT IN (SELECT MIN(id) FROM benchmark_tasks "
        "GROUP BY engine_id, checks_hash)"
    )
    with op.batch_alter_table('benchmark_tasks') as batch:
        batch.drop_constraint('uq_benchmark_tasks_engine_checks_project', type_='unique')
        batch.create_unique_constraint('uq_benchmark_tasks_engine_checks', ['engine_id', 'checks_hash'])
        batch.drop_column('project')
    op.drop_index('ix_engine_verdicts_engine_id', table_name='engine_verdicts')
    op.drop_table('engine_verdicts')
