"""One place that maps a cache's location to its backend: a folder path, or a server URL by its scheme.

A third backend adds its folder (beside folder/ and postgres/) and its lines to SERVER_BACKENDS,
SERVER_VERIFIERS and SERVER_CHECKS (docs/adding-a-backend.md).
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Callable
from urllib.parse import urlsplit

from .backend import CacheBackend
from .config import StoreConfig
from .errors import CacheError
from .folder.exists import check_folder_cache
from .folder.lock_file import fix_lock_file
from .folder.maintenance import verify_folder
from .folder.store import CacheStore
from .postgres.url import ServerURL
from .types import VerifyReport


def _postgres_verify(server: ServerURL, name: str) -> VerifyReport:
    from .postgres.db import PgDb
    from .postgres.maintenance import verify
    from .postgres.schema import schema_name

    db = PgDb(server, schema_name(name))
    try:
        return verify(db, name)
    finally:
        db.close()


def _postgres_check(server: ServerURL, name: str) -> None:
    from .postgres.exists import check_server_cache

    check_server_cache(server, name)


def _postgres(server: ServerURL, name: str, settings: StoreConfig, local_root: Path | None) -> Any:
    from .postgres.store import PgCacheStore  # psycopg and the server only when a server cache is opened

    return PgCacheStore(server, name, settings, index_root=local_root)


# URL scheme -> opener(server, cache name, settings, local folder for this worker's index)
SERVER_BACKENDS: dict[str, Callable[[ServerURL, str, StoreConfig, Path | None], Any]] = {
    "postgresql": _postgres, "postgres": _postgres,
}
# URL scheme -> read-only verify(server, cache name), which never opens (so never changes) the cache
SERVER_VERIFIERS: dict[str, Callable[[ServerURL, str], VerifyReport]] = {
    "postgresql": _postgres_verify, "postgres": _postgres_verify,
}
# URL scheme -> read-only check(server, cache name): MissingCacheError unless the cache exists, creating nothing
SERVER_CHECKS: dict[str, Callable[[ServerURL, str], None]] = {
    "postgresql": _postgres_check, "postgres": _postgres_check,
}


def _scheme(server: ServerURL, table: dict[str, Any]) -> Any:
    scheme = urlsplit(server.url).scheme.lower()
    if scheme not in table:
        raise CacheError(f"no cache backend serves {scheme}:// URLs (known: {', '.join(table)})")
    return table[scheme]


def open_store(location: str | os.PathLike | ServerURL, settings: StoreConfig | None = None, *,
               name: str = "default", local_root: str | os.PathLike | None = None) -> CacheBackend:
    """The backend (a CacheBackend) at `location`: a ServerURL opens cache `name` on that server (keeping this
    worker's entity index under `local_root`); a path opens the cache folder at that path."""
    settings = settings or StoreConfig()
    if isinstance(location, ServerURL):
        local = Path(local_root) if local_root is not None else None
        return _scheme(location, SERVER_BACKENDS)(location, name, settings, local)
    return CacheStore(Path(location), settings)


def verify_store(location: str | os.PathLike | ServerURL, *, name: str = "default") -> VerifyReport:
    """Every problem of the cache at `location`, read-only: the cache is never opened for writing."""
    if isinstance(location, ServerURL):
        return _scheme(location, SERVER_VERIFIERS)(location, name)
    return verify_folder(Path(location))


def check_store(location: str | os.PathLike | ServerURL, *, name: str = "default") -> None:
    """MissingCacheError naming the caches that do exist, unless there is a cache at `location`; read-only (what
    stats, list and verify check first: opening would create a cache a typo named)."""
    if isinstance(location, ServerURL):
        _scheme(location, SERVER_CHECKS)(location, name)
    else:
        check_folder_cache(Path(location))


def fix_before_repair(location: str | os.PathLike | ServerURL) -> list[str]:
    """Fix what keeps the cache at `location` from opening at all (a folder's writer lock that is not a plain
    file) before `repair` opens it; the actions taken."""
    if isinstance(location, ServerURL):
        return []
    fixed = fix_lock_file(Path(location))
    return [fixed] if fixed else []
