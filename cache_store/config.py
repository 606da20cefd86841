"""Validated settings of one cache store."""
from __future__ import annotations

import math
from dataclasses import dataclass

POLICIES = ("lru", "lfu")
GB = 10**9


def budget_from_gb(gb: float) -> int:
    """Convert a user-facing budget in GB (10^9 bytes) to bytes."""
    if not isinstance(gb, (int, float)) or not math.isfinite(gb) or gb <= 0:
        raise ValueError(f"cache budget must be a positive number of GB, got {gb!r}")
    return int(round(gb * GB))


@dataclass(frozen=True)
class StoreConfig:
    """Budget (bytes of latents) and eviction policy of a store."""

    budget_bytes: int
    policy: str = "lru"

    def __post_init__(self) -> None:
        if not isinstance(self.budget_bytes, int) or self.budget_bytes <= 0:
            raise ValueError(f"budget_bytes must be a positive int, got {self.budget_bytes!r}")
        if self.policy not in POLICIES:
            raise ValueError(f"eviction policy must be one of {POLICIES}, got {self.policy!r}")
