"""What a storage backend is: the CacheBackend protocol the service, the nodes and the CLI use, and the StoreBase
every backend builds on; what a backend hands the shared lookup is `lookup.source.LookupSource` (with the SQL
contract of its `db`). A cache folder (folder/) and a PostgreSQL cache (postgres/) are the two backends; `open_store` picks
one by location. Nothing here names files or SQLite.
"""
from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any, Mapping, Protocol, Sequence, runtime_checkable

from . import latents as lat
from .config import StoreConfig
from .errors import CacheEntryError, CacheError, InvalidEntryError
from .index.ann import require_hnswlib
from .index.keeper import IndexKeeper
from .index.vector_index import DEFAULT_EF
from .lookup.rule import HitRule
from .lookup.stored_vectors import stored_vectors
from .types import EmbeddedEntities, EntryInfo, InsertResult, LookupResult, StoreStats, VerifyReport
from .validate import check_latents

log = logging.getLogger(__name__)

SAVE_INDEX_EVERY = 1000  # logged entity changes before this process persists the index again ...
SAVE_INDEX_INTERVAL = 300.0  # ... but at most every 5 minutes: a save writes the whole index (~90 MB at 100k);
                             # a reopen replays whatever the change log recorded since the last save


def index_options(config: StoreConfig, extra: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The VectorIndex keywords of an opener: its config's index backend, then `extra` (tests, benches); a
    CacheError naming the fix when that is "hnsw" and hnswlib is not installed."""
    options = {"backend": config.index_backend, "ef": DEFAULT_EF, **(extra or {})}  # not a saved index's older ef
    if options["backend"] == "hnsw":
        try:
            require_hnswlib("this cache's settings")
        except ValueError as exc:
            raise CacheError(str(exc)) from None
    return options


@runtime_checkable
class CacheBackend(Protocol):
    """Operations on one named cache of donor latents (docs/cache-store.md)."""

    @property
    def root(self) -> Path | str:
        """Where the cache is, as reports print it: its folder, or the server's label and the cache's name."""

    @property
    def generation(self) -> int:
        """A number that changes whenever entries are added, evicted or cleared (by any process)."""

    @property
    def budget_bytes(self) -> int:
        """The cache's own budget for latent bytes (never exceeded after a write returns)."""

    def set_budget(self, budget_bytes: int) -> None:
        """Change the cache's budget (an explicit, logged action); the next write or prune enforces it."""

    def insert(self, prompt: str, entities: EmbeddedEntities, fingerprint: str, latents: Mapping[str, Any],
               sigmas: Sequence[float], shape: Sequence[int] | None = None,
               meta: Mapping[str, Any] | None = None) -> InsertResult:
        """Validate and store a full run's donor latents, evicting by policy so the budget holds on return."""

    def lookup(self, entities: EmbeddedEntities, fingerprint: str, shape: Sequence[int], rule: HitRule,
               touch: bool = True, load: bool = True) -> LookupResult:
        """Best compatible entry that `rule` lets serve the request, or a miss with its reason."""

    def stored_vectors(self, phrases: Sequence[str], embedder: str, dim: int) -> dict[str, Any]:
        """Vectors the cache holds for these entity identities, made by `embedder` (none when it is another)."""

    def load_latents(self, entry_id: int) -> tuple[dict[str, Any], list[float]]:
        """An entry's verified tensors and the sigmas they were captured at."""

    def entry(self, entry_id: int) -> EntryInfo | None:
        """One entry, or None (never stored, or evicted since)."""

    def touch(self, entry_id: int, count_hit: bool = True) -> None:
        """Refresh an entry's recency (and its use count for LFU)."""

    def stats(self) -> StoreStats:
        """Counts, sizes and settings."""

    def entries(self, limit: int | None = None) -> list[EntryInfo]:
        """Entries, most recently used first."""

    def prune(self, budget_bytes: int | None = None) -> list[int]:
        """Evict by policy until the cache fits its budget (after setting it to `budget_bytes` if given)."""

    def clear(self) -> int:
        """Remove every entry; return how many."""

    def empty_quarantine(self) -> tuple[int, int]:
        """Delete what was set aside (quarantine); return the (files, bytes) removed."""

    def verify(self) -> VerifyReport:
        """Every problem found, changing nothing."""

    def repair(self) -> VerifyReport:
        """Fix what verify finds, reporting each action."""

    def close(self) -> None:
        """Release the backend's resources."""

    def __enter__(self) -> Any:
        """The backend itself, closed on leaving the `with`."""

    def __exit__(self, *exc: object) -> None:
        """Close the backend."""


class StoreBase:
    """What every backend shares: budget and policy read from where it keeps them (`_settings`), verified reads
    (`_entry_bytes`), best-effort recency (`_touch_entry`), the index-save cadence, closing on leaving a `with`."""

    root: Any
    keeper: IndexKeeper
    _warned_touch = False

    def _settings(self) -> tuple[int, str]:
        raise NotImplementedError

    def _entry_bytes(self, entry: EntryInfo) -> tuple[bytes, str, str]:
        """An entry's stored bytes, the checksum committed with them, and how messages name them."""
        raise NotImplementedError

    def _touch_entry(self, entry: EntryInfo) -> EntryInfo:
        """Refresh an entry's recency; the entry as it is now (CacheError when the backend refuses)."""
        raise NotImplementedError

    def _save_index(self) -> None:
        """Persist the keeper's index (under whatever lock the backend needs)."""
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError

    @property
    def budget_bytes(self) -> int:
        """The cache's budget for latent bytes, as the cache itself stores it (shared by all its users)."""
        return self._settings()[0]

    @property
    def policy(self) -> str:
        """The cache's eviction policy, as the cache itself stores it."""
        return self._settings()[1]

    def read_entry(self, entry: EntryInfo) -> dict[str, Any]:
        """Tensors of an entry: checksum verified, finite, of the entry's shape and dtype."""
        data, digest, what = self._entry_bytes(entry)
        tensors = lat.tensors_verified(data, digest, what)
        try:
            _, dtype = check_latents(tensors, entry.shape)
        except InvalidEntryError as exc:
            raise CacheEntryError(f"{what}: {exc}") from exc
        if dtype != entry.dtype:
            raise CacheEntryError(f"{what} holds {dtype}, the entry says {entry.dtype}")
        return tensors

    def stored_vectors(self, phrases: Sequence[str], embedder: str, dim: int) -> dict[str, Any]:
        """{identity: vector} the cache already holds for these phrases (lookup/stored_vectors.py)."""
        return stored_vectors(self, phrases, embedder, dim)

    def touch_best_effort(self, entry: EntryInfo) -> EntryInfo:
        """Refresh recency; when the backend refuses (a full disk, a read-only server) serve the hit anyway and
        warn once."""
        try:
            return self._touch_entry(entry)
        except CacheError as exc:
            if not self._warned_touch:
                log.warning("[CHAI] cache %s: could not record a hit's recency (%s); hits are still served",
                            self.root, exc)
                self._warned_touch = True
            return entry

    def _save_index_if_due(self, *, opening: bool = False) -> None:
        """Save the index after SAVE_INDEX_EVERY logged changes, at most every SAVE_INDEX_INTERVAL seconds (at
        once after a large rebuild on open: rebuilding is slow)."""
        if self.keeper.unsaved >= SAVE_INDEX_EVERY and (
                opening or time.monotonic() - self.keeper.last_save >= SAVE_INDEX_INTERVAL):
            self._save_index()

    def __enter__(self) -> Any:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
