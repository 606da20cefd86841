"""Which folder the demo may clear: only one it made (or recognisably a cache folder), or an empty one.

Without --keep the demo starts from an empty cache. It must never delete a folder the user named by mistake
(`--cache .` in a checkout, a folder of documents): anything else is refused with a message.
"""
from __future__ import annotations

import shutil
from pathlib import Path

MARKER = ".chai-demo-cache"  # written into every cache folder the demo creates
# What a cache folder the store made holds (cache_store/folder/layout.py, manifest.py, recovery.py).
CACHE_NAMES = {"latents", "index", "quarantine", "manifest.sqlite", "manifest.sqlite-wal", "manifest.sqlite-shm",
               ".writer.lock", MARKER}


def is_demo_cache(folder: Path) -> bool:
    """True for a folder holding nothing but what the demo's cache writes (and at least some of it)."""
    names = {p.name for p in folder.iterdir()}
    return bool(names) and names <= CACHE_NAMES and bool(names & {"latents", "manifest.sqlite", MARKER})


def prepare(folder: Path, keep: bool) -> str | None:
    """Clear `folder` unless `keep`; a message (and nothing touched) when it may not be used or cleared."""
    if folder.is_symlink():
        return f"--cache {folder} is a symbolic link: name the cache folder itself"
    if folder.exists() and not folder.is_dir():
        return f"--cache {folder} is a file, not a folder: name a folder (created if missing) or move the file"
    if not folder.exists() or not any(folder.iterdir()):
        return None
    if not is_demo_cache(folder):
        return (f"--cache {folder} holds files that are not a cache the demo made; refusing to "
                f"{'use' if keep else 'clear'} it. Name an empty or new folder (the default is ./demo_cache)")
    if not keep:
        shutil.rmtree(folder)
    return None


def mark(folder: Path) -> None:
    """Record that the demo made this cache folder."""
    (folder / MARKER).write_text("a cache folder made by bench/demo_chai.py; the demo may clear it\n")
