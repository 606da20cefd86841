"""One cache folder: latent files + SQLite manifest + entity vector index, behind the CacheBackend interface.

The parts, in this folder: manifest (SQLite), change_log (what the index follows), rows (entry rows), recovery
(adopt, quarantine, rebuild), maintenance (verify, repair, prune, clear); shared with the PostgreSQL backend:
validate (what may be committed), index/keeper (the in-memory index), lookup/ (the hit rule and the lookup).
Opening never deletes: files the manifest lacks are adopted or quarantined, a damaged manifest is rebuilt.
"""
from __future__ import annotations

import logging
import os
import time
from dataclasses import replace
from pathlib import Path
from typing import Any, Mapping, Sequence

from filelock import FileLock, Timeout

from .. import latents as lat
from ..backend import StoreBase, index_options
from ..config import DEFAULT_BUDGET_BYTES, DEFAULT_POLICY, StoreConfig
from ..errors import CacheEntryError, CacheError
from ..index.keeper import IndexKeeper
from ..lookup import flow as lookup_flow
from ..lookup.posting_cache import PostingCache
from ..lookup.rule import HitRule
from ..naming import is_entry_file_name
from ..prepare import check_fits, prepare_entry
from ..types import EmbeddedEntities, EntryInfo, InsertResult, LookupResult, StoreStats, VerifyReport
from ..validate import check_embedder
from . import maintenance
from .change_log import ManifestLog
from .layout import INDEX_DIR, LATENT_DIR, LOCK_NAME
from .lock_file import check_lock_file
from .manifest import Manifest
from .recovery import (adopt_unlisted, empty_quarantine, open_manifest, quarantine, quarantine_size, scan_latents,
                       sweep_temporaries)
from .rows import (compact_log, delete_entries, insert_entry, policy_in, recount_bytes, stored_embedder, stored_setting,
                   total_bytes, victims)

log = logging.getLogger(__name__)

SET_ASIDE_TIMEOUT = 5.0  # a lookup waits this long for the writer lock to quarantine a damaged entry, then skips


class CacheStore(StoreBase):
    """A persistent, budgeted, entity-indexed store of donor latents in one folder (a CacheBackend)."""

    def __init__(self, root: str | os.PathLike, config: StoreConfig | None = None, *, lock_timeout: float = 120.0,
                 index_kwargs: Mapping[str, Any] | None = None) -> None:
        self.root = Path(root)
        self.config = config or StoreConfig()
        options = index_options(self.config, index_kwargs)
        self.latent_dir = self.root / LATENT_DIR
        self.index_dir = self.root / INDEX_DIR
        self.latent_dir.mkdir(parents=True, exist_ok=True)
        self.index_dir.mkdir(exist_ok=True)
        check_lock_file(self.root)
        self._writer = FileLock(str(self.root / LOCK_NAME), timeout=lock_timeout)
        with self._writer:
            sweep_temporaries(self.root, self.latent_dir, self.index_dir)
            budget = self.config.budget_bytes or DEFAULT_BUDGET_BYTES  # for a manifest that lost its own
            self.manifest, opened = open_manifest(self.root, self.latent_dir, budget)
            adopted = adopt_unlisted(self.manifest, self.root, self.latent_dir, budget)
            self.warnings = opened.lines() + adopted.lines() + self._missing_files()
            with self.manifest.write() as cur:
                recount_bytes(cur)
                self._apply_settings(cur)
            self.keeper = IndexKeeper(ManifestLog(self.manifest), self.index_dir, options)
            self.postings: PostingCache | None = PostingCache()
            self.keeper.load()
            self._save_index_if_due(opening=True)
        for line in self.warnings:
            log.warning("[CHAI] cache %s: %s", self.root, line)

    # ------------------------------------------------------------------ settings that belong to the cache
    def _apply_settings(self, cur: Any) -> None:
        """Store the opener's explicit budget/policy (logged when it changes); defaults for a new cache."""
        for key, asked, default in (("budget_bytes", self.config.budget_bytes, DEFAULT_BUDGET_BYTES),
                                    ("policy", self.config.policy, DEFAULT_POLICY)):
            row = cur.execute("SELECT value FROM meta WHERE key=?", (key,)).fetchone()
            current = stored_setting(key, row[0] if row else None)
            if key == "budget_bytes" and current is None:  # new or rebuilt: never below what was recovered
                default = max(default, int(cur.execute("SELECT value FROM meta WHERE key='total_bytes'")
                                           .fetchone()[0]))
            wanted = asked if asked is not None else (current if current is not None else default)
            if wanted != current:
                Manifest.set_meta(cur, key, str(wanted))
                if current is not None:
                    log.warning("[CHAI] cache %s: %s changed from %s to %s by this open", self.root, key,
                                current, wanted)

    def _settings(self) -> tuple[int, str]:
        rows = self.manifest.query("SELECT key, value FROM meta WHERE key IN ('budget_bytes', 'policy')")
        meta = {key: value for key, value in rows}
        return (stored_setting("budget_bytes", meta.get("budget_bytes")) or DEFAULT_BUDGET_BYTES,
                stored_setting("policy", meta.get("policy")) or DEFAULT_POLICY)

    def set_budget(self, budget_bytes: int) -> None:
        """Change the cache's budget (logged); the next insert or prune enforces it."""
        StoreConfig(budget_bytes=budget_bytes)
        with self._writer, self.manifest.write() as cur:
            old = cur.execute("SELECT value FROM meta WHERE key='budget_bytes'").fetchone()
            Manifest.set_meta(cur, "budget_bytes", str(int(budget_bytes)))
        if old is None or old[0] != str(int(budget_bytes)):
            log.warning("[CHAI] cache %s: budget_bytes changed from %s to %d", self.root,
                        old[0] if old else None, budget_bytes)

    def _missing_files(self) -> list[str]:
        """Warnings for rows whose file is gone or unusable (left for lookups to skip and repair to drop)."""
        try:
            files = scan_latents(self.latent_dir)
        except OSError:
            files = {}
        bad = sum(files.get(str(name)) != (True, nbytes)
                  for name, nbytes in self.manifest.query("SELECT file, nbytes FROM entries"))
        return [f"{bad} entr(y/ies) have a missing or damaged latent file: lookups skip them; "
                "`repair` drops them"] if bad else []

    # ------------------------------------------------------------------ writing
    def insert(self, prompt: str, entities: EmbeddedEntities, fingerprint: str, latents: Mapping[str, Any],
               sigmas: Sequence[float], shape: Sequence[int] | None = None,
               meta: Mapping[str, Any] | None = None) -> InsertResult:
        """Validate and store a full-mode generation's donor latents, evicting so the budget holds on return."""
        record, data = prepare_entry(prompt, entities, fingerprint, latents, sigmas, shape, meta)
        self._check_fits(len(data))
        name = lat.new_entry_file_name()
        with self._writer:
            with self.manifest.read() as cur:
                check_embedder(*stored_embedder(cur), record)  # before the file is written
            lat.write_atomic(self.latent_dir, name, data)
            try:
                with self.manifest.write() as cur:
                    budget = stored_setting("budget_bytes", cur.execute(
                        "SELECT value FROM meta WHERE key='budget_bytes'").fetchone()[0]) or DEFAULT_BUDGET_BYTES
                    check_fits(len(data), budget)
                    chosen = victims(cur, total_bytes(cur) + len(data) - budget, policy_in(cur))
                    evicted_files = delete_entries(cur, chosen)
                    entry_id = insert_entry(cur, record, name, len(data), lat.checksum(data))
                    compact_log(cur)
            except BaseException:
                lat.remove_files(self.latent_dir, [name])
                raise
            lat.remove_files(self.latent_dir, [f for f in evicted_files if is_entry_file_name(f)])
            self.keeper.sync()
            self._save_index_if_due()
        return InsertResult(entry_id=entry_id, nbytes=len(data), evicted=tuple(chosen))

    def _check_fits(self, nbytes: int) -> None:
        check_fits(nbytes, self.budget_bytes)

    # ------------------------------------------------------------------ reading
    @property
    def generation(self) -> int:
        """Changes whenever entries are added, evicted or cleared (by any process)."""
        return int(self.manifest.meta("generation", "0") or 0)

    @property
    def _index(self) -> Any:
        return self.keeper.index

    def lookup(self, entities: EmbeddedEntities, fingerprint: str, shape: Sequence[int], rule: HitRule,
               touch: bool = True, load: bool = True) -> LookupResult:
        """Best compatible entry that `rule` lets serve the request, or a miss with its reason."""
        return lookup_flow.lookup(self, entities, fingerprint, shape, rule, touch=touch, load=load)

    # ------------------------------------------------------------------ what the lookup flow reads
    @property
    def db(self) -> Manifest:
        """The manifest: ranking queries run on it."""
        return self.manifest

    def stored_embedder(self) -> str | None:
        """The embedder of the cache's vectors (None while empty)."""
        return self.manifest.meta("embedder")

    def entry(self, entry_id: int) -> EntryInfo | None:
        """One entry, or None."""
        return self.manifest.entry(entry_id)

    def _entry_bytes(self, entry: EntryInfo) -> tuple[bytes, str, str]:
        """An entry's file bytes and committed checksum (symlinks and bad names refused)."""
        if not is_entry_file_name(entry.file):
            raise CacheEntryError(f"invalid file name {entry.file!r} in the manifest")
        if entry.checksum:  # read with the row (ids are never reused, and a row's checksum never changes)
            committed = entry.checksum
        else:
            checksum = self.manifest.query("SELECT checksum FROM entries WHERE id=?", (entry.id,))
            committed = checksum[0][0] if checksum else ""
        return lat.read_entry_bytes(self.latent_dir / entry.file), committed, f"latent file {entry.file}"

    def _touch_entry(self, entry: EntryInfo) -> EntryInfo:
        row = self._touch(entry.id, True)
        return replace(entry, last_used=float(row[0]), hits=int(row[1])) if row else entry

    def _save_index(self) -> None:
        self.keeper.save()  # callers hold the writer lock

    def set_aside(self, damaged: list[tuple[EntryInfo | int, str]]) -> None:
        """Quarantine the files of entries that failed to load and drop their rows, if the lock comes soon."""
        if not damaged:
            return
        try:
            self._writer.acquire(timeout=SET_ASIDE_TIMEOUT)
        except Timeout:
            log.warning("[CHAI] another writer is busy; damaged entries stay until the next lookup or repair")
            return
        try:
            for item, reason in damaged:
                entry_id = item if isinstance(item, int) else item.id
                if not isinstance(item, int) and is_entry_file_name(item.file):
                    path = self.latent_dir / item.file
                    if os.path.lexists(path):
                        quarantine(self.root, path, f"entry {entry_id}: {reason}")
                with self.manifest.write() as cur:
                    delete_entries(cur, [entry_id])
            self.keeper.sync()
        except (OSError, CacheError) as exc:  # the disk refuses: repair later
            log.warning("[CHAI] could not set damaged entries aside now: %s", exc)
        finally:
            self._writer.release()

    def load_latents(self, entry_id: int) -> tuple[dict[str, Any], list[float]]:
        """An entry's tensors (checksum verified) and the sigmas they were captured at."""
        entry = self.manifest.entry(entry_id)
        if entry is None:
            raise CacheEntryError(f"cache entry {entry_id} does not exist (evicted?)")
        return self.read_entry(entry), list(entry.sigmas)

    def touch(self, entry_id: int, count_hit: bool = True) -> None:
        """Refresh an entry's recency (and its use count for LFU); not waiting for the disk (a power cut may
        lose a hit's recency, nothing else)."""
        self._touch(entry_id, count_hit)

    def _touch(self, entry_id: int, count_hit: bool) -> tuple | None:
        # The row as the update left it, read in the same transaction (no second read of the entry after it).
        with self.manifest.write(durable=False) as cur:
            tick = Manifest.bump(cur, "tick")
            cur.execute("UPDATE entries SET last_used=?, use_tick=?, hits=hits+? WHERE id=?",
                        (time.time(), tick, int(count_hit), entry_id))
            return cur.execute("SELECT last_used, hits FROM entries WHERE id=?", (entry_id,)).fetchone()

    # ------------------------------------------------------------------ management
    def stats(self) -> StoreStats:
        """Counts, sizes and settings."""
        with self.manifest.read() as cur:
            n, total, hits = cur.execute(
                "SELECT COUNT(*), COALESCE(SUM(nbytes), 0), COALESCE(SUM(hits), 0) FROM entries").fetchone()
            n_ent = cur.execute("SELECT COUNT(*) FROM entities").fetchone()[0]
            meta = dict(cur.execute("SELECT key, value FROM meta").fetchall())
        index = self.keeper.index
        return StoreStats(root=str(self.root), entries=n, entities=n_ent, bytes=total,
                          budget_bytes=stored_setting("budget_bytes", meta.get("budget_bytes")) or DEFAULT_BUDGET_BYTES,
                          policy=stored_setting("policy", meta.get("policy")) or DEFAULT_POLICY,
                          embedder=meta.get("embedder"), generation=int(meta.get("generation", 0)),
                          format_version=int(meta.get("format_version", 0)), total_hits=hits,
                          index_backend=index.backend if index is not None else "empty",
                          **dict(zip(("quarantine_files", "quarantine_bytes"), quarantine_size(self.root))))

    def empty_quarantine(self) -> tuple[int, int]:
        """Delete what open and repair set aside in quarantine/; return the (files, bytes) removed."""
        with self._writer:
            return empty_quarantine(self.root)

    def entries(self, limit: int | None = None) -> list[EntryInfo]:
        """Entries, most recently used first."""
        return self.manifest.entries(limit)

    def prune(self, budget_bytes: int | None = None) -> list[int]:
        """Evict by policy until the latents fit the budget; a given budget first becomes the cache's own."""
        if budget_bytes is not None:
            self.set_budget(int(budget_bytes))
        with self._writer:
            chosen = maintenance.prune(self.manifest, self.latent_dir, self.keeper, self.budget_bytes)
        if chosen:
            log.info("[CHAI] pruned %d entries of %s to fit its budget", len(chosen), self.root)
        return chosen

    def clear(self) -> int:
        """Remove every entry, entity and latent file; return how many entries were removed."""
        with self._writer:
            n = maintenance.clear(self.manifest, self.latent_dir, self.index_dir, self.keeper)
        log.info("[CHAI] cleared %d entries of %s", n, self.root)
        return n

    def verify(self, repair: bool = False) -> VerifyReport:
        """Every problem in the folder, found through a read-only manifest connection (changes nothing)."""
        return self.repair() if repair else maintenance.verify_folder(self.root)

    def repair(self) -> VerifyReport:
        """Fix what verify finds and report every action (what was dropped, quarantined or rebuilt)."""
        with self._writer:
            on_open, self.warnings = self.warnings, []
            return maintenance.repair(self.manifest, self.root, self.keeper, on_open)

    def flush(self) -> None:
        """Persist the entity index now."""
        with self._writer:
            self.keeper.sync()
            self.keeper.save()

    def close(self) -> None:
        """Persist the index if it changed and close the manifest."""
        try:
            if self.keeper.unsaved:
                self.flush()
        except (Timeout, OSError, CacheError) as exc:
            log.warning("[CHAI] could not save the entity index on close: %s", exc)
        finally:
            self.manifest.close()

