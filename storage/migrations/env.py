"""Alembic environment: reads the database URL from enginefarm's one settings object."""

from alembic import context

from enginefarm.core.config import get_settings
from storage.db import make_engine
from storage.tables import Base

config = context.config
url = config.get_main_option("sqlalchemy.url") or get_settings().resolved_database_url


def run_migrations() -> None:
    engine = make_engine(url)
    with engine.connect() as connection:
        if url.startswith("sqlite"):
            # Batch migrations copy and drop tables; SQLite would refuse the drop of a referenced table.
            connection.exec_driver_sql("PRAGMA foreign_keys=OFF")
            connection.commit()
        context.configure(
            connection=connection, target_metadata=Base.metadata, render_as_batch=url.startswith("sqlite")
        )
        with context.begin_transaction():
            context.run_migrations()
    engine.dispose()


run_migrations()
