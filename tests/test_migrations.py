"""Alembic: upgrade -> downgrade -> upgrade on a fresh database, and the migrations match the models."""
import os

import pytest
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from conftest import ROOT, RUN_ID, SERVER_URL, admin_engine
from sqlalchemy import create_engine, inspect, text

from jobs.models import Base

TABLES = {"jobs", "items", "item_results", "api_keys", "schedules", "schedule_runs", "files", "batches"}


@pytest.fixture
def fresh_db():
    name = f"test_{RUN_ID}_migrations"
    admin = admin_engine()
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    url = SERVER_URL.set(database=name)
    yield url
    with admin.connect() as conn:
        conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    admin.dispose()


def tables(engine) -> set[str]:
    return set(inspect(engine).get_table_names()) - {"alembic_version"}


def test_upgrade_downgrade_upgrade(fresh_db):
    config = Config(str(ROOT / "alembic.ini"))
    config.set_main_option("sqlalchemy.url", fresh_db.render_as_string(hide_password=False).replace("%", "%%"))
    engine = create_engine(fresh_db)
    try:
        assert tables(engine) == set()
        command.upgrade(config, "head")
        assert tables(engine) == TABLES
        command.downgrade(config, "base")
        assert tables(engine) == set()
        command.upgrade(config, "head")
        assert tables(engine) == TABLES
        with engine.connect() as conn:
            diff = compare_metadata(MigrationContext.configure(conn), Base.metadata)
        assert diff == [], f"models and migrations differ: {diff}"
    finally:
        engine.dispose()


def test_the_session_database_is_not_the_default_one(database):
    assert database.rsplit("/", 1)[1] == f"test_{RUN_ID}" == os.environ["DATABASE_URL"].rsplit("/", 1)[1]
