"""Builds record the API token that asked for them

Revision ID: 0006
Revises: 0005
"""

import sqlalchemy as sa
from alembic import op

revision = '0006'
down_revision = '0005'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('builds') as batch:
        batch.add_column(sa.Column('token_id', sa.Integer(), nullable=True))
        batch.create_index('ix_builds_token_id', ['token_id'])
        batch.create_foreign_key(
            'fk_builds_token_id_api_tokens', 'api_tokens', ['token_id'], ['id'], ondelete='SET NULL'
        )


def downgrade() -> None:
    with op.batch_alter_table('builds') as batch:
        batch.drop_constraint('fk_builds_token_id_api_tokens', type_='foreignkey')
        batch.drop_index('ix_builds_token_id')
        batch.drop_column('token_id')
