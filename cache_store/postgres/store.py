"""A named cache on a PostgreSQL server, shared by every worker of a render farm (a CacheBackend).

The server is the source of truth: entries, entity texts and vectors, postings, byte accounting, recency and
use counts, and a monotonic change log of entity additions and deletions; the latent bytes too (bytea, the
same self-describing safetensors bytes a cache folder keeps in files, checksummed). Each worker keeps its own
entity index (hnswlib once large), caught up from the change log before every lookup and saved in a local
folder, so a restart replays only what changed. See rows.py for how writers serialise.
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
from ..config import StoreConfig
from ..errors import CacheEntryError, CacheError, CacheUnavailableError
from ..index.keeper import IndexKeeper
from ..lookup import flow as lookup_flow
from ..lookup.posting_cache import PostingCache
from ..lookup.rule import HitRule
from ..naming import validate_cache_name
from ..prepare import check_fits, prepare_entry
from ..types import EmbeddedEntities, EntryInfo, InsertResult, LookupResult, StoreStats, VerifyReport
from . import maintenance as pg_maintenance
from . import schema as pg_schema
from .change_log import PgChangeLog
from .db import PgDb
from .read import ENTRY_SQL, entry_from_row
from .rows import State, delete_entries, insert_entry, victims
from .url import ServerURL

log = logging.getLogger(__name__)

INDEX_FOLDER = ".server-index"  # under the local cache root: <schema>-<instance>/ per cache and server


class PgCacheStore(StoreBase):
    """A budgeted, entity-indexed store of donor latents on a PostgreSQL server (a CacheBackend)."""

    index_dir: Path  # this worker's entity-index folder and its lock, set by _open
    _index_lock: FileLock

    def __init__(self, server: ServerURL, name: str, config: StoreConfig | None = None, *,
                 index_root: str | os.PathLike | None = None, index_kwargs: Mapping[str, Any] | None = None) -> None:
        self.server = server
        self.name = validate_cache_name(name)
        self.config = config or StoreConfig()
        self._index_kwargs = index_options(self.config, index_kwargs)
        self.schema = pg_schema.schema_name(self.name)
        self.root = f"{server.label}/{self.name}"  # what reports print (no password, no options)
        self.db = PgDb(server, self.schema, self.config.server_timeout_s)
        self._index_root = Path(index_root) if index_root is not None else Path.home() / ".cache" / "chai-cache"
        self.keeper: IndexKeeper = None  # type: ignore[assignment]  # set by _open
        self.warnings: list[str] = []
        try:
            self._open()
        except CacheUnavailableError as exc:
            if not exc.transient:
                self.db.close()
                raise
            # A server restarting as this worker starts: lookups are misses until it answers, then it opens.
            log.warning("[CHAI] cache %s: %s; it opens on first use once the server answers", self.root, exc)
            self.warnings.append(str(exc))

    def _open(self) -> None:
        """Create or migrate the cache's schema, store the opener's settings, load this worker's index."""
        if self.keeper is not None:
            return
        with self.db.write() as cur:
            done = pg_schema.ensure(cur, self.db.psycopg.sql, self.schema, self.name, self.config.budget_bytes,
                                    self.config.policy)
            self._apply_settings(cur)
        if done:
            log.info("[CHAI] cache %s: schema %s %s", self.root, self.schema, done)
        instance = str(self.db.query("SELECT instance FROM state")[0][0])[:12]
        self.index_dir = self._index_root / INDEX_FOLDER / f"{self.schema}-{instance}"
        self._index_lock = FileLock(str(self._index_root / INDEX_FOLDER / f".{self.schema}-{instance}.lock"),
                                    timeout=60)
        self.index_dir.mkdir(parents=True, exist_ok=True)
        keeper = IndexKeeper(PgChangeLog(self.db), self.index_dir, self._index_kwargs)
        with self._index_lock:
            keeper.load()
        self.keeper = keeper
        self.postings: PostingCache | None = PostingCache()
        self._save_index_if_due(opening=True)

    # ------------------------------------------------------------------ settings that belong to the cache
    def _apply_settings(self, cur: Any) -> None:
        """Store the opener's explicit budget/policy (logged when it changes)."""
        if self.config.budget_bytes is None and self.config.policy is None:
            return
        state = State.lock(cur)
        for key, asked in (("budget_bytes", self.config.budget_bytes), ("policy", self.config.policy)):
            current = getattr(state, key)
            if asked is not None and asked != current:
                setattr(state, key, asked)
                log.warning("[CHAI] cache %s: %s changed from %s to %s by this open", self.root, key, current, asked)
        state.save(cur)

    def _settings(self) -> tuple[int, str]:
        self._open()
        budget, policy = self.db.query("SELECT budget_bytes, policy FROM state")[0]
        return int(budget), str(policy)

    def set_budget(self, budget_bytes: int) -> None:
        """Change the cache's budget (logged); the next insert or prune enforces it."""
        self._open()
        StoreConfig(budget_bytes=budget_bytes)
        with self.db.write() as cur:
            state = State.lock(cur)
            old, state.budget_bytes = state.budget_bytes, int(budget_bytes)
            state.save(cur)
        if old != budget_bytes:
            log.warning("[CHAI] cache %s: budget_bytes changed from %s to %d", self.root, old, budget_bytes)

    # ------------------------------------------------------------------ writing
    def insert(self, prompt: str, entities: EmbeddedEntities, fingerprint: str, latents: Mapping[str, Any],
               sigmas: Sequence[float], shape: Sequence[int] | None = None,
               meta: Mapping[str, Any] | None = None) -> InsertResult:
        """Validate and store a full run's donor latents in one transaction, evicting so the budget holds."""
        self._open()
        record, data = prepare_entry(prompt, entities, fingerprint, latents, sigmas, shape, meta)
        check_fits(len(data), self.budget_bytes)
        digest = lat.checksum(data)
        with self.db.write() as cur:
            cur.execute("SELECT nextval(pg_get_serial_sequence('entries', 'id'))")
            entry_id = int(cur.fetchone()[0])
            # The bytes go first, before the state lock: other writers wait only for the metadata below.
            cur.execute("INSERT INTO blobs (entry_id, data) VALUES (%s, %s)", (entry_id, data))
            state = State.lock(cur)
            check_fits(len(data), state.budget_bytes)
            chosen = victims(cur, state.total_bytes + len(data) - state.budget_bytes, state.policy)
            evicted = delete_entries(cur, state, chosen)
            insert_entry(cur, state, record, entry_id, len(data), digest)
            state.save(cur)
        self._sync_index()
        return InsertResult(entry_id=entry_id, nbytes=len(data), evicted=tuple(evicted))

    def _sync_index(self) -> None:
        self.keeper.sync()
        self._save_index_if_due()

    def _save_index(self) -> None:
        try:
            with self._index_lock:
                self.keeper.save()
        except (Timeout, OSError, CacheError) as exc:
            log.warning("[CHAI] could not save the local entity index of %s: %s", self.root, exc)

    # ------------------------------------------------------------------ reading (what lookup_flow uses)
    @property
    def generation(self) -> int:
        """Changes whenever entries are added, evicted or cleared (by any worker)."""
        self._open()
        return int(self.db.query("SELECT generation FROM state")[0][0])

    @property
    def _index(self) -> Any:
        return self.keeper.index if self.keeper is not None else None

    def lookup(self, entities: EmbeddedEntities, fingerprint: str, shape: Sequence[int], rule: HitRule,
               touch: bool = True, load: bool = True) -> LookupResult:
        """Best compatible entry that `rule` lets serve the request, or a miss with its reason."""
        self._open()
        return lookup_flow.lookup(self, entities, fingerprint, shape, rule, touch=touch, load=load)

    def stored_embedder(self) -> str | None:
        """The embedder of the cache's vectors (None while empty)."""
        return self.db.query("SELECT embedder FROM state")[0][0]

    def entry(self, entry_id: int) -> EntryInfo | None:
        """One entry, or None."""
        self._open()
        rows = self.db.query(ENTRY_SQL + " WHERE e.id = ?", (int(entry_id),))
        return entry_from_row(rows[0]) if rows else None

    def _entry_bytes(self, entry: EntryInfo) -> tuple[bytes, str, str]:
        """An entry's latent bytes and committed checksum, from the server."""
        rows = self.db.query("SELECT b.data, e.checksum FROM blobs b JOIN entries e ON e.id = b.entry_id "
                             "WHERE b.entry_id = ?", (entry.id,), binary=True)
        if not rows:
            raise CacheEntryError(f"cache entry {entry.id} has no latent bytes on the server (evicted meanwhile?)")
        return bytes(rows[0][0]), rows[0][1], f"the latents of entry {entry.id}"

    def _touch_entry(self, entry: EntryInfo) -> EntryInfo:
        row = self._touch(entry.id, True)
        return replace(entry, last_used=float(row[0]), hits=int(row[1])) if row else entry

    def touch(self, entry_id: int, count_hit: bool = True) -> None:
        """Refresh an entry's recency (and its use count for LFU); no lock beyond the entry's row."""
        self._open()
        self._touch(entry_id, count_hit)

    def _touch(self, entry_id: int, count_hit: bool) -> tuple | None:
        # Recency is a hint, not a promise: this commit does not wait for the server's disk (a crash may forget
        # the last few hits; nothing else), which keeps a WAL flush off every hit.
        rows = self.db.query("UPDATE entries SET last_used = ?, use_tick = nextval('ticks'), hits = hits + ? "
                             "WHERE id = ? RETURNING last_used, hits", (time.time(), int(count_hit), int(entry_id)))
        return rows[0] if rows else None

    def set_aside(self, damaged: list[tuple[EntryInfo | int, str]]) -> None:
        """Move entries whose latents failed to load to the quarantine table (bytes kept) and drop them."""
        if damaged:
            pg_maintenance.set_aside(self.db, self.keeper, [(item if isinstance(item, int) else item.id, reason)
                                                            for item, reason in damaged])

    def load_latents(self, entry_id: int) -> tuple[dict[str, Any], list[float]]:
        """An entry's tensors (checksum verified) and the sigmas they were captured at."""
        self._open()
        entry = self.entry(entry_id)
        if entry is None:
            raise CacheEntryError(f"cache entry {entry_id} does not exist (evicted?)")
        return self.read_entry(entry), list(entry.sigmas)

    # ------------------------------------------------------------------ management
    def stats(self) -> StoreStats:
        """Counts, sizes and settings."""
        self._open()
        with self.db.read() as cur:
            cur.execute("SELECT COUNT(*), COALESCE(SUM(nbytes), 0), COALESCE(SUM(hits), 0) FROM entries")
            n, total, hits = cur.fetchone()
            cur.execute("SELECT COUNT(*) FROM entities")
            n_ent = cur.fetchone()[0]
            cur.execute("SELECT budget_bytes, policy, embedder, generation FROM state")
            budget, policy, embedder, generation = cur.fetchone()
            cur.execute("SELECT MAX(version) FROM schema_version")
            version = cur.fetchone()[0]
            cur.execute("SELECT COUNT(*), COALESCE(SUM(octet_length(data)), 0) FROM quarantine")
            q_files, q_bytes = cur.fetchone()
        index = self.keeper.index
        return StoreStats(root=self.root, entries=int(n), entities=int(n_ent), bytes=int(total),
                          budget_bytes=int(budget), policy=policy, embedder=embedder, generation=int(generation),
                          format_version=int(version), total_hits=int(hits),
                          index_backend=index.backend if index is not None else "empty",
                          quarantine_files=int(q_files), quarantine_bytes=int(q_bytes))

    def empty_quarantine(self) -> tuple[int, int]:
        """Delete what repair and lookups set aside in the quarantine table; return the (rows, bytes) removed."""
        self._open()
        with self.db.write() as cur:
            cur.execute("DELETE FROM quarantine RETURNING COALESCE(octet_length(data), 0)")
            sizes = [int(r[0]) for r in cur.fetchall()]
        return len(sizes), sum(sizes)

    def entries(self, limit: int | None = None) -> list[EntryInfo]:
        """Entries, most recently used first."""
        self._open()
        rows = self.db.query(ENTRY_SQL + " ORDER BY e.use_tick DESC" + (" LIMIT ?" if limit else ""),
                             (int(limit),) if limit else ())
        return [e for e in (entry_from_row(r) for r in rows) if e is not None]

    def prune(self, budget_bytes: int | None = None) -> list[int]:
        """Evict by policy until the latents fit the budget; a given budget first becomes the cache's own."""
        self._open()
        if budget_bytes is not None:
            self.set_budget(int(budget_bytes))
        with self.db.write() as cur:
            state = State.lock(cur)
            chosen = delete_entries(cur, state, victims(cur, state.total_bytes - state.budget_bytes, state.policy))
            state.save(cur)
        self.keeper.sync()
        if chosen:
            log.info("[CHAI] pruned %d entries of %s to fit its budget", len(chosen), self.root)
        return chosen

    def clear(self) -> int:
        """Remove every entry and entity of this cache (quarantined bytes stay); return how many entries."""
        self._open()
        with self.db.unbounded():
            n = pg_maintenance.clear(self.db)
        with self._index_lock:
            for old in self.index_dir.iterdir():
                lat.remove_files(self.index_dir, [old.name])
            self.keeper.load()
        log.info("[CHAI] cleared %d entries of %s", n, self.root)
        return n

    def verify(self, repair: bool = False) -> VerifyReport:
        """Every problem found, through a read-only transaction (changes nothing)."""
        if repair:
            return self.repair()
        with self.db.unbounded():
            return pg_maintenance.verify(self.db, self.name)

    def repair(self) -> VerifyReport:
        """Fix what verify finds and report every action."""
        self._open()
        with self.db.unbounded():
            report = pg_maintenance.repair(self.db, self.name)
        with self._index_lock:
            self.keeper.rebuild()
            self.keeper.save()
        report.repaired.append("rebuilt and saved this worker's entity index (other workers rebuild theirs on "
                               "their next lookup)")
        return report

    def flush(self) -> None:
        """Persist the local entity index now."""
        self.keeper.sync()
        self._save_index()

    def close(self) -> None:
        """Save the local index if it changed and close the connection."""
        try:
            if self.keeper is not None and self.keeper.unsaved:
                self.flush()
        except CacheError as exc:
            log.warning("[CHAI] could not bring the entity index of %s up to date on close: %s", self.root, exc)
        finally:
            self.db.close()
