"""One cache folder: latent files + SQLite manifest + entity vector index, behind the CacheBackend interface.

The parts: manifest (SQLite), rows (entry rows), validate (what may be committed), recovery (adopt, quarantine,
rebuild), index_sync (the in-memory index), lookup_flow and ranking (the lookup, shared with the PostgreSQL backend),
maintenance (verify, repair, prune, clear).
Opening never deletes: files the manifest lacks are adopted or quarantined, a damaged manifest is rebuilt.
"""
from __future__ import annotations

import logging
import os
import time
from pathlib import Path
from typing import Any, Mapping, Sequence

from filelock import FileLock, Timeout

from . import latents as lat
from . import lookup_flow, maintenance
from .backend import StoredSettings
from .config import DEFAULT_BUDGET_BYTES, DEFAULT_POLICY, POLICIES, StoreConfig
from .errors import CacheEntryError, CacheError, EmbedderMismatchError, InvalidEntryError
from .index_sync import IndexKeeper
from .layout import INDEX_DIR, LATENT_DIR, LOCK_NAME
from .lock_file import check_lock_file
from .manifest import Manifest
from .naming import is_entry_file_name
from .prepare import NothingToStoreError, check_fits, prepare_entry  # noqa: F401  (NothingToStoreError: re-exported)
from .recovery import adopt_unlisted, open_manifest, quarantine, scan_latents, sweep_temporaries
from .rows import compact_log, delete_entries, insert_entry, recount_bytes, total_bytes, victims
from .types import EmbeddedEntities, EntryInfo, InsertResult, LookupResult, StoreStats, VerifyReport
from .validate import check_latents

log = logging.getLogger(__name__)

SAVE_INDEX_EVERY = 1000  # logged entity changes before this process persists the index again ...
SAVE_INDEX_INTERVAL = 300.0  # ... but at most every 5 minutes: a save writes the whole index (~90 MB at 100k);
                             # a reopen replays whatever the index_log recorded since the last save
SET_ASIDE_TIMEOUT = 5.0  # a lookup waits this long for the writer lock to quarantine a damaged entry, then skips


class CacheStore(StoredSettings):
    """A persistent, budgeted, entity-indexed store of donor latents in one folder (a CacheBackend)."""

    def __init__(self, root: str | os.PathLike, config: StoreConfig | None = None, *, lock_timeout: float = 120.0,
                 index_kwargs: Mapping[str, Any] | None = None) -> None:
        self.root = Path(root)
        self.config = config or StoreConfig()
        self.latent_dir = self.root / LATENT_DIR
        self.index_dir = self.root / INDEX_DIR
        self.latent_dir.mkdir(parents=True, exist_ok=True)
        self.index_dir.mkdir(exist_ok=True)
        check_lock_file(self.root)
        self._writer = FileLock(str(self.root / LOCK_NAME), timeout=lock_timeout)
        self._warned_touch = False
        with self._writer:
            sweep_temporaries(self.root, self.latent_dir, self.index_dir)
            self.manifest, opened = open_manifest(self.root, self.latent_dir)
            adopted = adopt_unlisted(self.manifest, self.root, self.latent_dir)
            self.warnings = opened.lines() + adopted.lines() + self._missing_files()
            with self.manifest.write() as cur:
                recount_bytes(cur)
                self._apply_settings(cur)
            self.keeper = IndexKeeper(self.manifest, self.index_dir, index_kwargs or {})
            self.keeper.load()
            if self.keeper.unsaved >= SAVE_INDEX_EVERY:  # a large rebuild is slow: persist it at once
                self.keeper.save()
        for line in self.warnings:
            log.warning("[CHAI] cache %s: %s", self.root, line)

    # ------------------------------------------------------------------ settings that belong to the cache
    def _apply_settings(self, cur: Any) -> None:
        """Store the opener's explicit budget/policy (logged when it changes); defaults for a new cache."""
        for key, asked, default in (("budget_bytes", self.config.budget_bytes, DEFAULT_BUDGET_BYTES),
                                    ("policy", self.config.policy, DEFAULT_POLICY)):
            row = cur.execute("SELECT value FROM meta WHERE key=?", (key,)).fetchone()
            current = _setting(key, row[0] if row else None)
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
        meta = dict(self.manifest.query("SELECT key, value FROM meta WHERE key IN ('budget_bytes', 'policy')"))
        return (_setting("budget_bytes", meta.get("budget_bytes")) or DEFAULT_BUDGET_BYTES,
                _setting("policy", meta.get("policy")) or DEFAULT_POLICY)

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
            stored, dim = self.manifest.meta("embedder"), self.manifest.meta("dim")
            if stored is not None and (stored != record.embedder or dim != str(record.vectors.shape[1])):
                raise EmbedderMismatchError(
                    f"this cache holds {dim}-d vectors of embedder {stored!r}; it cannot store vectors of "
                    f"{record.embedder!r}. Use the same embedder, or another cache name")
            lat.write_atomic(self.latent_dir, name, data)
            try:
                with self.manifest.write() as cur:
                    budget = _setting("budget_bytes", cur.execute(
                        "SELECT value FROM meta WHERE key='budget_bytes'").fetchone()[0]) or DEFAULT_BUDGET_BYTES
                    check_fits(len(data), budget)
                    chosen = victims(cur, total_bytes(cur) + len(data) - budget, self.policy_in(cur))
                    evicted_files = delete_entries(cur, chosen)
                    entry_id = insert_entry(cur, record, name, len(data), lat.checksum(data))
                    compact_log(cur)
            except BaseException:
                lat.remove_files(self.latent_dir, [name])
                raise
            lat.remove_files(self.latent_dir, [f for f in evicted_files if is_entry_file_name(f)])
            self.keeper.sync()
            if (self.keeper.unsaved >= SAVE_INDEX_EVERY
                    and time.monotonic() - self.keeper.last_save >= SAVE_INDEX_INTERVAL):
                self.keeper.save()
        return InsertResult(entry_id=entry_id, nbytes=len(data), evicted=tuple(chosen))

    @staticmethod
    def policy_in(cur: Any) -> str:
        """The eviction policy as the current transaction sees it."""
        row = cur.execute("SELECT value FROM meta WHERE key='policy'").fetchone()
        return _setting("policy", row[0] if row else None) or DEFAULT_POLICY

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

    def lookup(self, entities: EmbeddedEntities, fingerprint: str, shape: Sequence[int], threshold: float,
               touch: bool = True, load: bool = True, scenes_must_agree: bool = True) -> LookupResult:
        """Best compatible entry sharing an entity at similarity >= threshold, or a miss with its reason."""
        return lookup_flow.lookup(self, entities, fingerprint, shape, threshold, touch=touch, load=load,
                                  scenes_must_agree=scenes_must_agree)

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

    def read_entry(self, entry: EntryInfo) -> dict[str, Any]:
        """Tensors of an entry: checksum verified, finite, of the entry's shape and dtype."""
        if not is_entry_file_name(entry.file):
            raise CacheEntryError(f"invalid file name {entry.file!r} in the manifest")
        checksum = self.manifest.query("SELECT checksum FROM entries WHERE id=?", (entry.id,))
        tensors = lat.read_verified(self.latent_dir / entry.file, checksum[0][0] if checksum else "")
        try:
            _, dtype = check_latents(tensors, entry.shape)
        except InvalidEntryError as exc:
            raise CacheEntryError(f"latent file {entry.file}: {exc}") from exc
        if dtype != entry.dtype:
            raise CacheEntryError(f"latent file {entry.file} holds {dtype}, the manifest says {entry.dtype}")
        return tensors

    def touch_best_effort(self, entry: EntryInfo) -> EntryInfo:
        """Refresh recency; on a full or read-only disk serve the hit anyway and warn once."""
        try:
            self.touch(entry.id)
            return self.manifest.entry(entry.id) or entry
        except CacheError as exc:
            if not self._warned_touch:
                log.warning("[CHAI] cache %s: could not record a hit's recency (%s); hits are still served",
                            self.root, exc)
                self._warned_touch = True
            return entry

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
        """Refresh an entry's recency (and its use count for LFU)."""
        with self.manifest.write() as cur:
            tick = Manifest.bump(cur, "tick")
            cur.execute("UPDATE entries SET last_used=?, use_tick=?, hits=hits+? WHERE id=?",
                        (time.time(), tick, int(count_hit), entry_id))

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
                          budget_bytes=_setting("budget_bytes", meta.get("budget_bytes")) or DEFAULT_BUDGET_BYTES,
                          policy=_setting("policy", meta.get("policy")) or DEFAULT_POLICY,
                          embedder=meta.get("embedder"), generation=int(meta.get("generation", 0)),
                          format_version=int(meta.get("format_version", 0)), total_hits=hits,
                          index_backend=index.backend if index is not None else "empty")

    def entries(self, limit: int | None = None) -> list[EntryInfo]:
        """Entries, most recently used first."""
        return self.manifest.entries(limit)

    def prune(self, budget_bytes: int | None = None) -> list[int]:
        """Evict by policy until the latents fit the budget; a given budget first becomes the cache's own."""
        return maintenance.prune(self, budget_bytes)

    def clear(self) -> int:
        """Remove every entry, entity and latent file; return how many entries were removed."""
        return maintenance.clear(self)

    def verify(self, repair: bool = False) -> VerifyReport:
        """Every problem in the folder, found through a read-only manifest connection (changes nothing)."""
        return self.repair() if repair else maintenance.verify_folder(self.root)

    def repair(self) -> VerifyReport:
        """Fix what verify finds and report every action (what was dropped, quarantined or rebuilt)."""
        return maintenance.repair(self)

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


def _setting(key: str, value: str | None) -> Any:
    """A stored budget (positive int) or policy, or None when absent or unreadable."""
    if value is None:
        return None
    if key == "policy":
        return value if value in POLICIES else None
    try:
        number = int(value)
    except ValueError:
        return None
    return number if number > 0 else None
