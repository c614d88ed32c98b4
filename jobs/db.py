"""Engine and session factory."""
from __future__ import annotations

from functools import cache

from sqlalchemy import BigInteger, any_, create_engine, literal
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.engine import Engine
from sqlalchemy.orm import Session, sessionmaker


@cache
def get_engine(url: str) -> Engine:
    return create_engine(url, pool_pre_ping=True, pool_size=5, max_overflow=10)


def session_factory(url: str) -> sessionmaker[Session]:
    return sessionmaker(get_engine(url), expire_on_commit=False)


def id_in(column, ids):
    """`column = ANY(:ids)`: one array parameter instead of len(ids) parameters (Postgres allows 65535)."""
    return column == any_(literal(list(ids), ARRAY(BigInteger)))
