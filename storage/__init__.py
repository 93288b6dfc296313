"""The catalog (SQLAlchemy + Alembic) and the blob stores (S3, local directory)."""
