"""Exceptions the cache store raises; every message says what to do next."""
from __future__ import annotations


class CacheError(RuntimeError):
    """Base class for cache-store errors shown to users."""


class CacheNameError(CacheError, ValueError):
    """A cache name that is empty, too long or would leave the cache root."""


class FormatVersionError(CacheError):
    """The cache folder was written by an on-disk format this code cannot read."""


class EmbedderMismatchError(CacheError):
    """Vectors from one embedder offered to a cache built with another."""


class EntryTooLargeError(CacheError):
    """An entry larger than the whole byte budget."""


class CacheWriteError(CacheError):
    """Writing an entry failed (disk full, permissions); the cache is unchanged."""


class CacheEntryError(CacheError):
    """An entry's latent file is missing, truncated or fails its checksum."""


class ManifestError(CacheError):
    """The manifest could not be read or written (damaged, disk full, read-only); the message says what to do."""


class ManifestDamagedError(ManifestError):
    """The manifest is not a usable CHAI manifest (unreadable, foreign, broken schema): open rebuilds it."""


class InvalidEntryError(CacheError, ValueError):
    """An entry that must not be committed: non-finite or zero vectors, NaN latents, inconsistent shapes."""


class CacheArgumentError(CacheError, TypeError):
    """A public call given an argument of the wrong type; the message names the argument and what it takes."""


class CacheUnavailableError(CacheError):
    """The cache server cannot be reached (down, restarting, refusing the credentials): lookups are misses.

    `transient` is False when waiting will not help (credentials, TLS settings, a missing database)."""

    def __init__(self, message: str, transient: bool = True) -> None:
        super().__init__(message)
        self.transient = transient


class MissingCacheError(CacheError):
    """A read-only command named a cache that does not exist (checked before opening, which would create it)."""

    @classmethod
    def naming(cls, missing: str, caches: list[str], where: str) -> MissingCacheError:
        """The error for `missing` (what does not exist), naming the caches that do exist `where`."""
        there = f"caches there: {', '.join(caches)}" if caches else f"there is no cache {where} yet"
        return cls(f"{missing}; {there} (check --name; nothing was created)")
