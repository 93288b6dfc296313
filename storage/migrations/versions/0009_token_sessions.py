"""Tokens may have a parent: a dashboard session is a token opened by signing in with another, and revoking that
one revokes its sessions

Revision ID: 0009
Revises: 0008
"""

import sqlalchemy as sa
from alembic import op

revision = '0009'
down_revision = '0008'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("api_tokens") as batch:
        batch.add_column(sa.Column("parent_id", sa.Integer(), nullable=True))
        batch.create_foreign_key("fk_api_tokens_parent_id", "api_tokens", ["parent_id"], ["id"])
        batch.create_index("ix_api_tokens_parent_id", ["parent_id"])


def downgrade() -> None:
    with op.batch_alter_table("api_tokens") as batch:
        batch.drop_index("ix_api_tokens_parent_id")
        batch.drop_constraint("fk_api_tokens_parent_id", type_="foreignkey")
        batch.drop_column("parent_id")
