"""Whether a cache exists on a PostgreSQL server, checked before a read-only command opens it (opening creates
its schema)."""
from __future__ import annotations

from ..errors import MissingCacheError
from .db import PgDb
from .schema import schema_name
from .url import ServerURL


def check_db_cache(db: PgDb, name: str) -> None:
    """MissingCacheError naming the server's caches, unless cache `name` has a schema there."""
    if db.query("SELECT to_regclass(?)", (f'"{db.schema}".schema_version',))[0][0] is not None:
        return
    rows = db.query("SELECT nspname FROM pg_namespace WHERE nspname LIKE 'chai\\_%' AND "
                    "to_regclass(quote_ident(nspname) || '.schema_version') IS NOT NULL ORDER BY 1")
    caches = [str(r[0])[len("chai_"):] for r in rows]
    raise MissingCacheError.naming(f"cache '{name}' does not exist on {db.server.label}", caches, "on this server")


def check_server_cache(server: ServerURL, name: str) -> None:
    """check_db_cache over a connection of its own, closed again."""
    db = PgDb(server, schema_name(name))
    try:
        check_db_cache(db, name)
    finally:
        db.close()
