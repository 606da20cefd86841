"""CHAI's cross-request cache: entities, embedders, vector index, latent files, manifest, budget.

Importing this package is cheap: spaCy, torch and hnswlib load only when a feature needs them.
"""
from .config import StoreConfig, budget_from_gb
from .errors import (CacheEntryError, CacheError, CacheNameError, CacheUnavailableError, CacheWriteError,
                     EmbedderMismatchError, EntryTooLargeError, FormatVersionError)
from .types import EmbeddedEntities, EntryInfo, InsertResult, LookupResult, Match, StoreStats, VerifyReport

__all__ = [
    "StoreConfig", "budget_from_gb", "CacheEntryError", "CacheError", "CacheNameError", "CacheUnavailableError",
    "CacheWriteError", "EmbedderMismatchError", "EntryTooLargeError", "FormatVersionError", "EmbeddedEntities",
    "EntryInfo", "InsertResult", "LookupResult", "Match", "StoreStats", "VerifyReport",
]
