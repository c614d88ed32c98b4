"""Manage API keys: `python -m api.keys create --name NAME` (prints the key once), `list`, `revoke ID_OR_PREFIX`.

Uses DATABASE_URL like the API. The key is printed on stdout and nowhere else; only its sha256 is stored.
"""
from __future__ import annotations

import argparse
import sys

from jobs import keys
from jobs.config import get_settings
from jobs.db import session_factory


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m api.keys", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    create = sub.add_parser("create", help="create a key and print it (once)")
    create.add_argument("--name", required=True, help="who or what uses the key")
    sub.add_parser("list", help="list keys (id, prefix, name, created, revoked)")
    revoke = sub.add_parser("revoke", help="revoke a key by id or display prefix")
    revoke.add_argument("key", help="the id or the prefix shown by `list`")
    args = parser.parse_args(argv)
    if args.command == "create" and not (1 <= len(args.name) <= 128):
        parser.error("--name: 1 to 128 characters")

    Session = session_factory(get_settings().database_url)
    with Session.begin() as session:
        if args.command == "create":
            row, key = keys.create_key(session, args.name)
            print(key)
            print(f"created key {row.id} ({row.prefix}..., name {row.name!r}); it is not shown again",
                  file=sys.stderr)
        elif args.command == "list":
            for row in keys.list_keys(session):
                revoked = row.revoked_at.isoformat() if row.revoked_at else "-"
                print(f"{row.id}\t{row.prefix}...\t{row.name}\tcreated {row.created_at.isoformat()}\t"
                      f"revoked {revoked}")
        else:
            row = keys.revoke(session, args.key)
            if row is None:
                print(f"no single key matches {args.key!r}", file=sys.stderr)
                return 1
            print(f"revoked key {row.id} ({row.prefix}...)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
