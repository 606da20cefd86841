"""What the CLI checks before it opens anything: that a read-only command names a cache that exists (opening
creates one), and that text from the cache reaches the terminal without its control characters."""
from __future__ import annotations

import os
import unicodedata
from pathlib import Path
from typing import Any

from .errors import CacheError
from .layout import LATENT_DIR
from .manifest import MANIFEST_NAME
from .naming import cache_dir

READ_ONLY = ("stats", "list", "verify")
_BIDI = set(range(0x202A, 0x202F)) | set(range(0x2066, 0x206A))  # overrides that reorder what a terminal shows


class MissingCacheError(CacheError):
    """A read-only command named a cache that does not exist."""


def is_cache_folder(path: Path) -> bool:
    """True for a folder the store made (a manifest or a latents/ folder in it)."""
    return path.is_dir() and (os.path.lexists(path / MANIFEST_NAME) or (path / LATENT_DIR).is_dir())


def _named(caches: list[str], where: str) -> str:
    return f"caches there: {', '.join(caches)}" if caches else f"there is no cache {where} yet"


def check_folder_cache(root: Path, name: str) -> None:
    """MissingCacheError naming the caches that exist, unless root/name is a cache folder."""
    folder = cache_dir(root, name)
    if is_cache_folder(folder):
        return
    root = folder.parent
    if not root.is_dir():
        raise MissingCacheError(f"the cache root {root} does not exist (check --root, or $CHAI_CACHE_DIR)")
    caches = sorted(p.name for p in root.iterdir() if is_cache_folder(p))
    raise MissingCacheError(f"cache '{name}' does not exist under {root}; {_named(caches, 'under this root')} "
                            "(check --name; nothing was created)")


def check_server_cache(db: Any, name: str) -> None:
    """MissingCacheError naming the server's caches, unless cache `name` has a schema there."""
    if db.query("SELECT to_regclass(?)", (f'"{db.schema}".schema_version',))[0][0] is not None:
        return
    rows = db.query("SELECT nspname FROM pg_namespace WHERE nspname LIKE 'chai\\_%' AND "
                    "to_regclass(quote_ident(nspname) || '.schema_version') IS NOT NULL ORDER BY 1")
    caches = [str(r[0])[len("chai_"):] for r in rows]
    raise MissingCacheError(f"cache '{name}' does not exist on {db.server.label}; "
                            f"{_named(caches, 'on this server')} (check --name; nothing was created)")


def printable(text: str) -> str:
    """`text` with control characters (terminal escape sequences, bidi overrides) written as escapes."""
    out = []
    for ch in text:
        if unicodedata.category(ch) == "Cc" or ord(ch) in _BIDI:
            out.append(ch.encode("unicode_escape").decode("ascii"))
        else:
            out.append(ch)
    return "".join(out)
