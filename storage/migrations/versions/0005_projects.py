"""Projects: a model belongs to one (or to none: ''), a token may be limited to one

Revision ID: 0005
Revises: 0004
"""

import sqlalchemy as sa
from alembic import op

revision = '0005'
down_revision = '0004'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('models') as batch:
        batch.add_column(sa.Column('project', sa.String(length=64), nullable=False, server_default=''))
        batch.drop_constraint('uq_models_name_version', type_='unique')
        batch.create_unique_constraint('uq_models_project_name_version', ['project', 'name', 'version'])
        batch.create_index('ix_models_project', ['project'])
    with op.batch_alter_table('api_tokens') as batch:
        batch.add_column(sa.Column('project', sa.String(length=64), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('api_tokens') as batch:
        batch.drop_column('project')
    with op.batch_alter_table('models') as batch:
        batch.drop_index('ix_models_project')
        batch.drop_constraint('uq_models_project_name_version', type_='unique')
        batch.create_unique_constraint('uq_models_name_version', ['name', 'version'])
        batch.drop_column('project')
