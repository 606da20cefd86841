"""The cache as the nodes, the demo and the CLI use it: extractor + embedder + store behind one object."""
from __future__ import annotations

import logging
import os
import sqlite3
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

from .config import StoreConfig
from .errors import CacheError
from .naming import cache_dir
from .store import CacheStore, NothingToStoreError
from .types import EmbeddedEntities, InsertResult, LookupResult

log = logging.getLogger(__name__)

DEFAULT_ROOT_ENV = "CHAI_CACHE_DIR"


def default_root() -> Path:
    """Cache root outside ComfyUI: $CHAI_CACHE_DIR, else ~/.cache/chai-cache."""
    env = os.environ.get(DEFAULT_ROOT_ENV)
    return Path(env).expanduser() if env else Path.home() / ".cache" / "chai-cache"


@dataclass
class WriteResult:
    """Outcome of a cache write, for reports: stored or not, and why."""

    stored: bool
    reason: str
    insert: InsertResult | None = None
    timings: dict[str, float] = field(default_factory=dict)


class ChaiCache:
    """Entity extraction, embedding and the store for one named cache folder."""

    def __init__(self, root: str | os.PathLike, *, budget_bytes: int, policy: str = "lru",
                 embedder: Any = "minilm", spacy_pipeline: str | None = None,
                 threshold: float | None = None) -> None:
        self.root = Path(root)
        self.store = CacheStore(self.root, StoreConfig(budget_bytes=budget_bytes, policy=policy))
        self._embedder_spec = embedder
        self._embedder = None if isinstance(embedder, str) else embedder
        self._spacy_pipeline = spacy_pipeline
        self._extractor = None
        self._threshold = threshold
        self._lock = threading.RLock()

    @property
    def embedder(self) -> Any:
        """The default embedder (loaded on first use)."""
        with self._lock:
            if self._embedder is None:
                from .embedders import get_embedder

                self._embedder = get_embedder(self._embedder_spec)
            return self._embedder

    @property
    def extractor(self) -> Any:
        """The spaCy entity extractor (loaded on first use)."""
        with self._lock:
            if self._extractor is None:
                from .entities import EntityExtractor

                self._extractor = EntityExtractor(self._spacy_pipeline)
            return self._extractor

    @property
    def threshold(self) -> float:
        """Similarity threshold: the configured one, else the embedder's calibrated default."""
        return self._threshold if self._threshold is not None else float(self.embedder.default_threshold)

    def embed_prompt(self, prompt: str, embedder: Any = None) -> EmbeddedEntities:
        """Extract a prompt's entities and embed them (no entities gives an empty result, not an error)."""
        entities = self.extractor.extract(prompt or "")
        return self.embed_entities(entities, embedder)

    def embed_entities(self, entities: Sequence[Any], embedder: Any = None) -> EmbeddedEntities:
        """Embed already-extracted entities."""
        import numpy as np

        emb = embedder or self.embedder
        vectors = emb.embed([e.text for e in entities]) if entities else np.zeros((0, emb.dim), np.float32)
        return EmbeddedEntities(tuple(entities), vectors, emb.identity)

    def lookup(self, entities: EmbeddedEntities, fingerprint: str, shape: Sequence[int],
               threshold: float | None = None) -> LookupResult:
        """Store lookup that turns a damaged manifest into a miss with a repair hint instead of a traceback."""
        thr = self.threshold if threshold is None else float(threshold)
        try:
            return self.store.lookup(entities, fingerprint, shape, thr)
        except sqlite3.DatabaseError as exc:
            log.warning("[CHAI] cache manifest unreadable during lookup: %s", exc)
            return LookupResult(False, f"cache manifest unreadable ({exc}); run the repair action or "
                                       "`python -m cache_store repair`")

    def write(self, prompt: str, entities: EmbeddedEntities, fingerprint: str, latents: Mapping[str, Any],
              sigmas: Sequence[float], shape: Sequence[int] | None = None,
              meta: Mapping[str, Any] | None = None) -> WriteResult:
        """Insert a full run's donor latents; a prompt without entities is reported, not raised."""
        t0 = time.perf_counter()
        try:
            result = self.store.insert(prompt, entities, fingerprint, latents, sigmas, shape=shape, meta=meta)
        except NothingToStoreError as exc:
            return WriteResult(False, str(exc))
        evicted = f", evicted {len(result.evicted)}" if result.evicted else ""
        return WriteResult(True, f"stored entry {result.entry_id} ({result.nbytes / 1e6:.2f} MB{evicted})",
                           insert=result, timings={"write": time.perf_counter() - t0})

    def close(self) -> None:
        """Close the store."""
        self.store.close()


_OPEN: dict[str, ChaiCache] = {}  # cache folder -> its one ChaiCache in this process
_OPEN_LOCK = threading.Lock()


def open_cache(root: str | os.PathLike, name: str, *, budget_bytes: int, policy: str = "lru",
               embedder: Any = "minilm", spacy_pipeline: str | None = None) -> ChaiCache:
    """The process-wide ChaiCache for root/name, reopened when settings change."""
    folder = cache_dir(root, name)
    key = str(folder)
    with _OPEN_LOCK:
        cache = _OPEN.get(key)
        if cache is not None:
            same = (cache.store.config == StoreConfig(budget_bytes, policy) and cache._embedder_spec == embedder
                    and cache._spacy_pipeline == spacy_pipeline and folder.exists())
            if same:
                return cache
            cache.close()
            del _OPEN[key]
        cache = ChaiCache(folder, budget_bytes=budget_bytes, policy=policy, embedder=embedder,
                          spacy_pipeline=spacy_pipeline)
        _OPEN[key] = cache
        return cache


def store_generations() -> tuple[tuple[str, Any], ...]:
    """(cache folder, generation) of every cache this process has open, sorted by folder.

    For ComfyUI's fingerprint_inputs, which sees only widget values: the tuple changes whenever any open
    cache gains, loses or clears entries (in this or another process). A cache whose manifest cannot be read
    gives a fresh NaN, which never compares equal, so a node fingerprinted with it re-runs.
    """
    with _OPEN_LOCK:
        caches = sorted(_OPEN.items())
    out = []
    for folder, cache in caches:
        try:
            generation: Any = cache.store.generation
        except (CacheError, sqlite3.Error, OSError, AttributeError):
            generation = float("nan")
        out.append((folder, generation))
    return tuple(out)


def close_all() -> None:
    """Close every cache this process opened (tests, shutdown)."""
    with _OPEN_LOCK:
        for cache in _OPEN.values():
            try:
                cache.close()
            except CacheError:
                pass
        _OPEN.clear()
