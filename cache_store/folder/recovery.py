"""Recovery of a cache folder without deleting anything: adopt intact files, quarantine the rest, rebuild atomically.

Latent files describe themselves (metadata, entity vectors), so a file the manifest does not list is validated
and adopted into the manifest, or moved to ``quarantine/`` with a reason file. A manifest SQLite cannot use is
replaced by one built from the files in a temporary database that is renamed into place; the old one is kept in
quarantine. No step deletes a latent file, so a kill at any point loses nothing the next open cannot rebuild.
"""
from __future__ import annotations

import errno
import logging
import os
import shutil
import sqlite3
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from .. import latents as lat
from ..errors import CacheError, ManifestDamagedError, ManifestError
from ..naming import is_entry_file_name
from ..validate import EntryRecord
from .manifest import MANIFEST_NAME, Manifest
from .rows import insert_entry, recount_bytes, stored_setting

log = logging.getLogger(__name__)

QUARANTINE_DIR = "quarantine"
REBUILD_PREFIX = ".manifest-rebuild-"


@dataclass
class RecoveryLog:
    """What a recovery step adopted, quarantined and noticed."""

    adopted: list[str] = field(default_factory=list)
    quarantined: list[tuple[str, str]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def lines(self) -> list[str]:
        """One line per action, for reports and warnings."""
        out = [f"adopted {len(self.adopted)} latent file(s) into the manifest"] if self.adopted else []
        out += [f"quarantined {name}: {reason}" for name, reason in self.quarantined]
        return out + self.notes


def quarantine(root: Path, path: Path, reason: str) -> Path:
    """Move `path` (file, directory or link) into root/quarantine with a .reason.txt beside it."""
    target_dir = own_quarantine(root)
    target = target_dir / f"{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:6]}-{path.name}"
    os.replace(path, target)
    try:
        (target_dir / (target.name + ".reason.txt")).write_text(reason + "\n", encoding="utf-8")
    except OSError as exc:  # a full disk: the move (a rename) stands, its reason goes to the log only
        log.warning("[CHAI] could not write the reason file for %s (%s)", target.name, exc)
    lat.fsync_dir(target_dir)
    log.warning("[CHAI] moved %s to %s: %s", path.name, target, reason)
    return target


def own_quarantine(root: Path) -> Path:
    """root/quarantine as a real folder: a link (or file) in its place is renamed aside, never followed out of
    the cache."""
    target_dir = root / QUARANTINE_DIR
    if os.path.lexists(target_dir) and (target_dir.is_symlink() or not target_dir.is_dir()):
        aside = root / f"{QUARANTINE_DIR}.not-a-folder-{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:6]}"
        os.replace(target_dir, aside)
        log.warning("[CHAI] %s was not a folder of the cache (a link or file): renamed to %s; quarantine goes "
                    "into a fresh folder", target_dir, aside.name)
    target_dir.mkdir(exist_ok=True)
    return target_dir


def quarantine_size(root: Path) -> tuple[int, int]:
    """(things set aside, bytes of everything) in root/quarantine: a reason file is not counted as a thing;
    links are counted, never followed."""
    top = root / QUARANTINE_DIR
    if not top.is_dir() or top.is_symlink():
        return 0, 0
    files = sum(not name.endswith(".reason.txt") for name in os.listdir(top))
    size = 0
    for dirpath, dirnames, names in os.walk(top):
        for name in names + [d for d in dirnames if os.path.islink(os.path.join(dirpath, d))]:
            size += os.lstat(os.path.join(dirpath, name)).st_size
    return files, size


def empty_quarantine(root: Path) -> tuple[int, int]:
    """Delete everything in root/quarantine (never following a link); return the (files, bytes) removed."""
    gone = quarantine_size(root)
    target = own_quarantine(root)
    for path in list(target.iterdir()):
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            path.unlink()
    log.warning("[CHAI] emptied %s: %d file(s), %d bytes", target, *gone)
    return gone


def sweep_temporaries(root: Path, latent_dir: Path, index_dir: Path) -> list[str]:
    """Remove what interrupted writes left: temp latents, temp index files, abandoned manifest rebuilds."""
    gone = []
    for directory, test in ((latent_dir, lambda n: n.startswith(lat.TMP_PREFIX)),
                            (index_dir, lambda n: n.startswith(lat.TMP_PREFIX) or (n.startswith(".")
                                                                                   and n.endswith(".tmp"))),
                            (root, lambda n: n.startswith(REBUILD_PREFIX))):
        names = [p.name for p in directory.iterdir() if test(p.name) and not p.is_dir()]
        lat.remove_files(directory, names)
        gone += names
    return gone


def _validate_file(path: Path, embedder: str | None, dim: int | None,
                   limit: int | None) -> tuple[EntryRecord, bytes]:
    """An adoptable file's record and bytes; CacheError/OSError naming the reason otherwise."""
    record, data = lat.read_entry_file(path, limit)
    if embedder is not None and record.embedder != embedder:
        raise CacheError(f"made with embedder {record.embedder!r}, the cache holds {embedder!r}")
    if dim is not None and record.vectors.shape[1] != dim:
        raise CacheError(f"has {record.vectors.shape[1]}-d entity vectors, the cache {dim}-d")
    return record, data


def scan_latents(latent_dir: Path) -> dict[str, tuple[bool, int]]:
    """Entry-named things in latents/: name -> (a regular file, not a link, its size); one directory scan."""
    out: dict[str, tuple[bool, int]] = {}
    with os.scandir(latent_dir) as it:
        for entry in it:
            if is_entry_file_name(entry.name):
                regular = entry.is_file(follow_symlinks=False)
                out[entry.name] = (regular, entry.stat(follow_symlinks=False).st_size if regular else -1)
    return out


def unlisted_files(manifest: Manifest, latent_dir: Path) -> list[str]:
    """Entry-named things in latents/ that no manifest row lists, oldest first."""
    listed = {r[0] for r in manifest.query("SELECT file FROM entries")}
    with os.scandir(latent_dir) as it:
        found = [(e.stat(follow_symlinks=False).st_mtime, e.name) for e in it
                 if is_entry_file_name(e.name) and e.name not in listed]
    return [name for _, name in sorted(found)]


def adopt_files(manifest: Manifest, root: Path, latent_dir: Path, names: list[str], log_: RecoveryLog,
                budget: int | None = None) -> None:
    """Validate files and add the intact ones in one transaction; quarantine the others with their reason.
    No entry is larger than the cache's budget: the stored one, else `budget` (the opener's or the default, for a
    rebuilt manifest that holds none), so a larger file is refused unread."""
    embedder, dim_text = manifest.meta("embedder"), manifest.meta("dim")
    dim = int(dim_text) if dim_text and dim_text.isdigit() else None
    limit = stored_setting("budget_bytes", manifest.meta("budget_bytes")) or budget
    good: list[tuple[str, EntryRecord, bytes]] = []
    for name in names:
        path = latent_dir / name
        try:
            record, data = _validate_file(path, embedder, dim, limit)
        except (CacheError, OSError) as exc:
            try:
                quarantine(root, path, f"{name}: {exc}")
                log_.quarantined.append((name, str(exc)))
            except OSError as move_exc:
                log_.notes.append(f"could not quarantine {name} ({move_exc}); left in place")
            continue
        embedder, dim = embedder or record.embedder, dim or record.vectors.shape[1]
        good.append((name, record, data))
    if not good:
        return
    with manifest.write() as cur:
        for name, record, data in good:
            insert_entry(cur, record, name, len(data), lat.checksum(data))
        recount_bytes(cur)
        Manifest.bump(cur, "index_epoch")
    log_.adopted += [name for name, _, _ in good]


def rebuild_manifest(root: Path, latent_dir: Path, reason: str, budget: int | None = None) -> RecoveryLog:
    """Build a new manifest from the latent files in a temporary database and rename it into place."""
    log.warning("[CHAI] rebuilding the cache manifest in %s from its latent files (%s)", root, reason)
    log_ = RecoveryLog(notes=[f"rebuilt the manifest from the latent files ({reason})"])
    tmp = root / f"{REBUILD_PREFIX}{uuid.uuid4().hex}.sqlite"
    try:
        fresh = Manifest(tmp)
        try:
            names = sorted((p for p in latent_dir.iterdir() if is_entry_file_name(p.name)),
                           key=lambda p: p.lstat().st_mtime)
            adopt_files(fresh, root, latent_dir, [p.name for p in names], log_, budget)
            fresh.conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        finally:
            fresh.close()
    except (CacheError, OSError, sqlite3.Error) as exc:  # the old manifest stays where it is
        _remove_rebuild(tmp, with_db=True)
        if "full" in str(exc).lower() or getattr(exc, "errno", None) == errno.ENOSPC:
            raise ManifestError(f"could not rebuild the cache manifest in {root} ({reason}): the disk holding "
                                "the cache is full; free space and open it again (the old manifest is left in "
                                "place)") from exc
        raise
    _remove_rebuild(tmp, with_db=False)
    for suffix in ("", "-wal", "-shm"):
        old = root / (MANIFEST_NAME + suffix)
        if os.path.lexists(old):  # a link or FIFO in its place too
            quarantine(root, old, f"{MANIFEST_NAME}{suffix} replaced by a rebuild: {reason}")
    os.replace(tmp, root / MANIFEST_NAME)
    lat.fsync_dir(root)
    return log_


def _remove_rebuild(tmp: Path, with_db: bool) -> None:
    for suffix in ("", "-wal", "-shm") if with_db else ("-wal", "-shm"):
        try:
            Path(str(tmp) + suffix).unlink(missing_ok=True)
        except OSError:
            pass


def open_manifest(root: Path, latent_dir: Path, budget: int | None = None) -> tuple[Manifest, RecoveryLog]:
    """The folder's manifest, rebuilt from the files first when SQLite or the schema make it unusable."""
    path = root / MANIFEST_NAME
    try:
        return Manifest(path), RecoveryLog()
    except ManifestDamagedError as exc:
        log_ = rebuild_manifest(root, latent_dir, str(exc), budget)
        return Manifest(path), log_


def adopt_unlisted(manifest: Manifest, root: Path, latent_dir: Path, budget: int | None = None) -> RecoveryLog:
    """Adopt or quarantine every entry-named file no row lists (non-regular ones are quarantined)."""
    log_ = RecoveryLog()
    names = unlisted_files(manifest, latent_dir)
    if names:
        adopt_files(manifest, root, latent_dir, names, log_, budget)
    return log_
