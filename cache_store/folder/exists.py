"""Whether a cache folder exists, checked before a read-only command opens it (opening creates the folder)."""
from __future__ import annotations

import os
from pathlib import Path

from ..errors import MissingCacheError
from .layout import LATENT_DIR
from .manifest import MANIFEST_NAME


def is_cache_folder(path: Path) -> bool:
    """True for a folder the store made (a manifest or a latents/ folder in it)."""
    return path.is_dir() and (os.path.lexists(path / MANIFEST_NAME) or (path / LATENT_DIR).is_dir())


def check_folder_cache(folder: Path) -> None:
    """MissingCacheError naming the caches beside it, unless `folder` is a cache folder."""
    folder = Path(folder)
    if is_cache_folder(folder):
        return
    root = folder.parent
    if not root.is_dir():
        raise MissingCacheError(f"the cache root {root} does not exist (check --root, or $CHAI_CACHE_DIR)")
    caches = sorted(p.name for p in root.iterdir() if is_cache_folder(p))
    raise MissingCacheError.naming(f"cache '{folder.name}' does not exist under {root}", caches, "under this root")
