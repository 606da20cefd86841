"""Validated settings of one cache store."""
from __future__ import annotations

import math
from dataclasses import dataclass

POLICIES = ("lru", "lfu")
# The entity index: "auto" searches exactly below a measured size and with hnswlib above it where hnswlib is
# installed (an optional extra), "exact" always searches exactly, "hnsw" needs hnswlib.
INDEX_BACKENDS = ("auto", "exact", "hnsw")
GB = 10**9


def budget_from_gb(gb: float) -> int:
    """Convert a user-facing budget in GB (10^9 bytes) to bytes."""
    if not isinstance(gb, (int, float)) or not math.isfinite(gb) or gb <= 0:
        raise ValueError(f"cache budget must be a positive number of GB, got {gb!r}")
    return int(round(gb * GB))


DEFAULT_BUDGET_BYTES = 2 * GB
DEFAULT_POLICY = "lru"
DEFAULT_SERVER_TIMEOUT_S = 5.0  # a PostgreSQL server that does not answer within this is a miss / "not stored"


@dataclass(frozen=True)
class StoreConfig:
    """Settings an opener asks for: a budget (bytes of latents) and an eviction policy.

    Both belong to the cache (stored in its manifest): a value here is an explicit change applied on open and
    logged; None keeps what the cache has (a new cache starts with 2 GB and LRU).

    `server_timeout_s` is this opener's own (a cache on a PostgreSQL server only): how long one statement, lock
    wait or connection attempt may take before a lookup becomes a miss and a write "not stored" (a frozen or
    partitioned server); None waits as long as the server takes (the CLI's maintenance commands).

    `index_backend` is this opener's own too: how its process searches the entity index (INDEX_BACKENDS). The
    index is derived state, so processes on one cache may differ; a persisted index either can read is reused.
    """

    budget_bytes: int | None = None
    policy: str | None = None
    server_timeout_s: float | None = DEFAULT_SERVER_TIMEOUT_S
    index_backend: str = "auto"

    def __post_init__(self) -> None:
        if self.budget_bytes is not None and (not isinstance(self.budget_bytes, int) or isinstance(
                self.budget_bytes, bool) or self.budget_bytes <= 0):
            raise ValueError(f"budget_bytes must be a positive int, got {self.budget_bytes!r}")
        if self.policy is not None and self.policy not in POLICIES:
            raise ValueError(f"eviction policy must be one of {POLICIES}, got {self.policy!r}")
        timeout = self.server_timeout_s
        if timeout is not None and (not isinstance(timeout, (int, float)) or isinstance(timeout, bool)
                                    or not math.isfinite(timeout) or timeout <= 0):
            raise ValueError(f"server_timeout_s must be a positive number of seconds or None, got {timeout!r}")
        if self.index_backend not in INDEX_BACKENDS:
            raise ValueError(f"index_backend must be one of {INDEX_BACKENDS}, got {self.index_backend!r}")
