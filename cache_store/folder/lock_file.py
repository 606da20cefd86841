"""The writer lock of a cache folder must be a plain file inside it: a link would make every writer open (and
truncate) whatever it points to, a FIFO or folder would stall or break every write."""
from __future__ import annotations

import os
from pathlib import Path

from .. import regular_files
from ..errors import CacheError
from .layout import LOCK_NAME


def check_lock_file(root: Path) -> None:
    """CacheError with what to do when root/.writer.lock is anything but a regular file (or missing)."""
    path = Path(root) / LOCK_NAME
    why = regular_files.refusal(path)
    if why:
        target = f" (to {os.readlink(path)})" if path.is_symlink() else ""
        raise CacheError(
            f"{path} is {why.split(' is ', 1)[1].split(',')[0]}{target}: the writer lock must be a plain file in "
            f"the cache folder. Remove it (only the link or file itself: `rm {path}`) or run `python -m "
            f"comfyui_chai.cache_store --root {Path(root).parent} --name {Path(root).name} repair`, which "
            "replaces it; then open the cache again")


def fix_lock_file(root: Path) -> str | None:
    """Replace a writer lock that is not a regular file by removing it (never what a link points to); what
    was done, or None."""
    path = Path(root) / LOCK_NAME
    why = regular_files.refusal(path)
    if not why:
        return None
    if path.is_dir() and not path.is_symlink():
        os.rmdir(path)  # an empty folder only: anything in it stays, and the error says so
    else:
        path.unlink()
    return f"removed {LOCK_NAME}: {why.split(' is ', 1)[1]} (a fresh lock file is created on open)"
