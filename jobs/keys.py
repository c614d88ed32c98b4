"""API keys: created, looked up and revoked here (the CLI `python -m api.keys` and the tests call these).

A key is `e3k_` + 43 url-safe characters (32 random bytes). Only its sha256 is stored: the key has 256 bits of
entropy, so a fast unsalted hash cannot be brute-forced and lets a request be authenticated with one indexed
lookup (a slow password hash such as bcrypt is for low-entropy secrets chosen by people).
"""
from __future__ import annotations

import hashlib
import hmac
import secrets
from datetime import datetime, timezone

from sqlalchemy import select
from sqlalchemy.orm import Session

from .models import ApiKey

KEY_PREFIX = "e3k_"
DISPLAY_CHARS = 8  # characters after e3k_ kept for display


def hash_key(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def create_key(session: Session, name: str) -> tuple[ApiKey, str]:
    """A new key; returns (row, the plaintext key). The plaintext is never stored: show it once. Caller commits."""
    key = KEY_PREFIX + secrets.token_urlsafe(32)
    row = ApiKey(name=name, prefix=key[:len(KEY_PREFIX) + DISPLAY_CHARS], key_hash=hash_key(key))
    session.add(row)
    session.flush()
    return row, key


def authenticate(session: Session, key: str) -> ApiKey | None:
    """The active key row for this plaintext key, else None."""
    if not key.startswith(KEY_PREFIX) or len(key) > 128:
        return None
    digest = hash_key(key)
    row = session.scalar(select(ApiKey).where(ApiKey.key_hash == digest, ApiKey.revoked_at.is_(None)))
    # The lookup is by hash, so timing reveals nothing about the key; compare anyway for clarity.
    return row if row is not None and hmac.compare_digest(row.key_hash, digest) else None


def list_keys(session: Session) -> list[ApiKey]:
    return list(session.scalars(select(ApiKey).order_by(ApiKey.id)))


def revoke(session: Session, ident: str) -> ApiKey | None:
    """Revoke by id or display prefix. Returns the row, or None if no such key. Caller commits."""
    query = select(ApiKey).where(ApiKey.id == int(ident)) if ident.isdigit() else \
        select(ApiKey).where(ApiKey.prefix == ident)
    rows = session.scalars(query).all()
    if len(rows) != 1:
        return None
    if rows[0].revoked_at is None:
        rows[0].revoked_at = datetime.now(timezone.utc)
    return rows[0]
