"""The store interface the service, the nodes and the CLI use; a cache folder (CacheStore) is one implementation.

A second backend (PostgreSQL, for many workers on many machines) implements the same protocol. Everything here
is about entries, budgets and reports; nothing names files, SQLite or hnswlib.
"""
from __future__ import annotations

from typing import Any, Mapping, Protocol, Sequence, runtime_checkable

from .types import EmbeddedEntities, EntryInfo, InsertResult, LookupResult, StoreStats, VerifyReport


@runtime_checkable
class CacheBackend(Protocol):
    """Operations on one named cache of donor latents (see DESIGN.md section 4)."""

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

    def lookup(self, entities: EmbeddedEntities, fingerprint: str, shape: Sequence[int], threshold: float,
               touch: bool = True, load: bool = True, scenes_must_agree: bool = True) -> LookupResult:
        """Best compatible entry sharing an entity at similarity >= threshold, or a miss with its reason."""

    def load_latents(self, entry_id: int) -> tuple[dict[str, Any], list[float]]:
        """An entry's verified tensors and the sigmas they were captured at."""

    def stats(self) -> StoreStats:
        """Counts, sizes and settings."""

    def entries(self, limit: int | None = None) -> list[EntryInfo]:
        """Entries, most recently used first."""

    def prune(self, budget_bytes: int | None = None) -> list[int]:
        """Evict by policy until the cache fits its budget (after setting it to `budget_bytes` if given)."""

    def clear(self) -> int:
        """Remove every entry; return how many."""

    def verify(self) -> VerifyReport:
        """Every problem found, changing nothing."""

    def repair(self) -> VerifyReport:
        """Fix what verify finds, reporting each action."""

    def close(self) -> None:
        """Release the backend's resources."""


class StoredSettings:
    """Budget and policy read from where a backend keeps them (`_settings`), and closing on leaving a `with`."""

    def _settings(self) -> tuple[int, str]:
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

    def __enter__(self) -> Any:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
