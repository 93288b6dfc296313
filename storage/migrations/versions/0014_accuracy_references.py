"""Accuracy references: the inputs of a check and ONNX Runtime FP32's outputs on them, which deploy machines judge
their engines against; each benchmark task names the one its settings use

Revision ID: 0014
Revises: 0013
"""

import sqlalchemy as sa
from alembic import op

revision = '0014'
down_revision = '0013'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        'accuracy_references',
        sa.Column('id', sa.Integer(), nullable=False),
        sa.Column('identity', sa.String(length=64), nullable=False),
        sa.Column('model_id', sa.Integer(), nullable=False),
        sa.Column('blob_key', sa.String(length=200), nullable=False),
        sa.Column('sha256', sa.String(length=64), nullable=False),
        sa.Column('size', sa.BigInteger(), nullable=False),
        sa.Column('origin', sa.Text(), nullable=False),
        sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(['model_id'], ['models.id']),
        sa.PrimaryKeyConstraint('id'),
        sa.UniqueConstraint('identity'),
    )
    op.create_index('ix_accuracy_references_model_id', 'accuracy_references', ['model_id'], unique=False)
    with op.batch_alter_table('benchmark_tasks') as batch:
        batch.add_column(sa.Column('reference_id', sa.Integer(), nullable=True))
        batch.create_foreign_key(
            'fk_benchmark_tasks_reference_id', 'accuracy_references', ['reference_id'], ['id'], ondelete='SET NULL'
        )


def downgrade() -> None:
    with op.batch_alter_table('benchmark_tasks') as batch:
        batch.drop_constraint('fk_benchmark_tasks_reference_id', type_='foreignkey')
        batch.drop_column('reference_id')
    op.drop_table('accuracy_references')
