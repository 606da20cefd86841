"""The cache as the nodes, the demo and the CLI use it: extractor + embedder + store behind one object."""
from __future__ import annotations

import logging
import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping, Sequence

from . import arguments as args
from .backend import CacheBackend
from .config import DEFAULT_SERVER_TIMEOUT_S, StoreConfig
from .errors import CacheError, CacheUnavailableError, CacheWriteError, ManifestError
from .lookup import prompt_vector
from .lookup.rule import HitRule
from .lookup.stored_vectors import with_stored
from .naming import cache_dir, encodable_text
from .open_store import open_store
from .postgres.url import ServerURL, resolve
from .prepare import NothingToStoreError
from .types import EmbeddedEntities, InsertResult, LookupResult

if TYPE_CHECKING:  # the extractor (and spaCy) load on first use
    from .entities.extract import EntityExtractor

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
    """Entity extraction, embedding and the store for one named cache: a folder, or a cache on a server."""

    def __init__(self, root: str | os.PathLike, *, budget_bytes: int | None = None, policy: str | None = None,
                 embedder: Any = "minilm", spacy_pipeline: str | None = None,
                 threshold: float | None = None, server: ServerURL | None = None, name: str | None = None,
                 scenes_must_agree: bool = True, server_timeout_s: float | None = DEFAULT_SERVER_TIMEOUT_S) -> None:
        self.settings = StoreConfig(budget_bytes=budget_bytes, policy=policy, server_timeout_s=server_timeout_s)
        self.server = server
        # root: the cache folder, or (with a server) the local folder that keeps this worker's entity index
        self.store: CacheBackend = open_store(root if server is None else server, self.settings,
                                              name=name or "default", local_root=root)
        self.root: Path | str = Path(root) if server is None else self.store.root
        self._embedder_spec = embedder
        self._embedder = None if isinstance(embedder, str) else embedder
        self._spacy_pipeline = spacy_pipeline
        self._extractor: EntityExtractor | None = None
        self._threshold = threshold
        self.scenes_must_agree = scenes_must_agree  # False only for studies that force a donor of another scene
        self._lock = threading.RLock()
        self._closed = False

    @property
    def embedder(self) -> Any:
        """The default embedder (loaded on first use)."""
        with self._lock:
            if self._embedder is None:
                from .entities.embedders import get_embedder

                self._embedder = get_embedder(self._embedder_spec)
            return self._embedder

    @property
    def extractor(self) -> EntityExtractor:
        """The spaCy entity extractor (loaded on first use)."""
        with self._lock:
            if self._extractor is None:
                from .entities.extract import EntityExtractor

                self._extractor = EntityExtractor(self._spacy_pipeline)
            return self._extractor

    @property
    def threshold(self) -> float:
        """Similarity threshold: the configured one, else the embedder's calibrated default."""
        return self._threshold if self._threshold is not None else float(self.embedder.default_threshold)

    def rule(self, threshold: float | None = None) -> HitRule:
        """The hit rule a lookup applies: this cache's threshold (or `threshold`) and scene policy."""
        return HitRule(self.threshold if threshold is None else float(threshold),
                       scenes_must_agree=self.scenes_must_agree)

    def embed_prompt(self, prompt: str, embedder: Any = None) -> EmbeddedEntities:
        """Extract a prompt's entities and embed them (no entities gives an empty result, not an error)."""
        entities = self.extractor.extract(encodable_text(args.check_prompt(prompt)))
        return self.embed_entities(entities, embedder)

    def embed_entities(self, entities: Sequence[Any], embedder: Any = None) -> EmbeddedEntities:
        """Embed already-extracted entities."""
        import numpy as np

        entities = args.check_entity_list(entities)
        emb = embedder or self.embedder
        if not entities:
            return EmbeddedEntities((), np.zeros((0, emb.dim), np.float32), emb.identity)
        # Vectors of what each thing is (its core: "sports car" for "red sports car"), so looks do not count.
        phrases = [e.identity for e in entities]
        vectors = with_stored(phrases, self._stored_vectors(phrases, emb), emb.embed)
        return EmbeddedEntities(tuple(entities), vectors, emb.identity)

    def _stored_vectors(self, phrases: Sequence[str], emb: Any) -> dict[str, Any]:
        """Vectors this cache already holds for these identities (the encoder's forward skipped); none when the
        cache cannot say, since embedding afresh always works."""
        try:
            return self.store.stored_vectors(phrases, emb.identity, int(emb.dim))
        except CacheError as exc:
            log.debug("[CHAI] stored vectors not read, embedding afresh: %s", exc)
            return {}

    def lookup(self, entities: EmbeddedEntities, fingerprint: str, shape: Sequence[int],
               threshold: float | None = None) -> LookupResult:
        """Store lookup that turns a damaged manifest into a miss with a repair hint instead of a traceback."""
        entities, fingerprint = args.check_entities(entities), args.check_fingerprint(fingerprint)
        shape = args.check_shape(shape)
        rule = self.rule(args.check_threshold(threshold))
        try:
            return self.store.lookup(entities, fingerprint, shape, rule)
        except CacheUnavailableError as exc:  # a server restarting: a miss that says so
            log.warning("[CHAI] cache lookup treated as a miss: %s", exc)
            return LookupResult(False, str(exc))
        except CacheError as exc:  # every manifest error arrives here as a CacheError with advice
            log.warning("[CHAI] cache lookup failed, treated as a miss: %s", exc)
            return LookupResult(False, f"cache unreadable: {exc}")

    def write(self, prompt: str, entities: EmbeddedEntities, fingerprint: str, latents: Mapping[str, Any],
              sigmas: Sequence[float], shape: Sequence[int] | None = None,
              meta: Mapping[str, Any] | None = None) -> WriteResult:
        """Insert a full run's donor latents; a prompt without entities is reported, not raised."""
        prompt, entities = args.check_prompt(prompt), args.check_entities(entities)
        fingerprint, latents = args.check_fingerprint(fingerprint), args.check_latents(latents)
        sigmas, shape, meta = args.check_sigmas(sigmas), args.check_optional_shape(shape), args.check_meta(meta)
        t0 = time.perf_counter()
        meta = self._with_prompt_vector(prompt, entities, meta)
        try:
            result = self.store.insert(prompt, entities, fingerprint, latents, sigmas, shape=shape, meta=meta)
        except NothingToStoreError as exc:
            return WriteResult(False, str(exc))
        except (CacheUnavailableError, CacheWriteError, ManifestError) as exc:  # a full disk, a server away: the
            # generation is fine; only the cache could not take it
            log.warning("[CHAI] cache write skipped: %s", exc)
            return WriteResult(False, str(exc))
        evicted = f", evicted {len(result.evicted)}" if result.evicted else ""
        return WriteResult(True, f"stored entry {result.entry_id} ({result.nbytes / 1e6:.2f} MB{evicted})",
                           insert=result, timings={"write": time.perf_counter() - t0})

    def _with_prompt_vector(self, prompt: str, entities: EmbeddedEntities,
                            meta: Mapping[str, Any] | None) -> Mapping[str, Any] | None:
        """`meta` with the whole prompt's vector (`lookup.prompt_vector`, read by the hit decision) when this cache's
        embedder made the entities; without it when the prompt cannot be embedded (the entry is still stored)."""
        if len(entities) == 0 or not prompt.strip() or (meta and prompt_vector.KEY in meta):
            return meta
        try:
            emb = self.embedder
            if emb.identity != entities.embedder:
                return meta
            vector = emb.embed([prompt])[0]
        except (RuntimeError, ValueError, OSError) as exc:  # EmbedError is a RuntimeError
            log.debug("[CHAI] prompt vector not stored: %s", exc)
            return meta
        return prompt_vector.with_prompt_vector(meta, vector, emb.identity)

    def same_settings(self, *, budget_bytes: int | None, policy: str | None, embedder: Any,
                      spacy_pipeline: str | None, server: ServerURL | None = None, **_: Any) -> bool:
        """True when this handle was opened with exactly these settings."""
        return (self.settings == StoreConfig(budget_bytes, policy) and self._embedder_spec == embedder
                and self._spacy_pipeline == spacy_pipeline and self.server == server)

    @property
    def alive(self) -> bool:
        """False once the cache's folder was deleted under this handle (a server cache stays alive)."""
        return self.server is not None or Path(self.root).exists()

    @property
    def closed(self) -> bool:
        """True once close() ran."""
        return self._closed

    def close(self) -> None:
        """Close the store (once)."""
        if not self._closed:
            self._closed = True
            self.store.close()


class _Handles:
    """The caches this process opened, keyed by (owner, folder): an owner replaces only its own handle."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_owner: dict[tuple[str, str], ChaiCache] = {}
        self._opened: list[ChaiCache] = []  # every handle open_cache returned, until close_all
        self._read_by: dict[str, str] = {}  # reader id (a lookup node) -> folder it read last

    def open(self, location: str, folder: Path, owner: str | None, **settings: Any) -> ChaiCache:
        key = (owner or "", location)
        with self._lock:
            cache = self._by_owner.get(key) if owner is not None else None
            if cache is not None and cache.same_settings(**settings) and cache.alive:
                return cache
            fresh = ChaiCache(folder, **settings)
            self._opened = [c for c in self._opened if not c.closed] + [fresh]
            if owner is not None:
                self._by_owner[key] = fresh
            if cache is not None:
                cache.close()  # the owner's own previous handle, never another owner's
            return fresh

    def note_read(self, reader: str, folder: Path | str) -> None:
        with self._lock:
            self._read_by[reader] = str(folder)

    def generation(self, reader: str) -> Any:
        with self._lock:
            folder = self._read_by.get(reader)
        return (folder, self.folder_generation(folder)) if folder is not None else float("nan")

    def folder_generation(self, folder: str) -> Any:
        """The generation of a folder through any open handle, or a fresh NaN."""
        with self._lock:
            caches = [c for c in self._opened if str(c.root) == folder and not c.closed]
        for cache in caches:
            try:
                return cache.store.generation
            except (CacheError, OSError):
                continue
        return float("nan")

    def close_all(self) -> None:
        with self._lock:
            caches = list(self._opened)
            self._opened.clear()
            self._by_owner.clear()
            self._read_by.clear()
        for cache in caches:
            try:
                cache.close()
            except CacheError:
                pass


_HANDLES = _Handles()


def open_cache(root: str | os.PathLike, name: str, *, budget_bytes: int | None = None, policy: str | None = None,
               embedder: Any = "minilm", spacy_pipeline: str | None = None, owner: str | None = None,
               server: str | None = None) -> ChaiCache:
    """A ChaiCache for root/name owned by `owner` (e.g. a node id), or for cache `name` on a PostgreSQL server.

    `server` is the CHAI Cache node's server input: "" or None -> $CHAI_CACHE_URL / $CHAI_CACHE_URL_FILE if set,
    else the folder root/name; "local" -> the folder; "postgresql://..." -> that server (see postgres/url.py). A server
    cache keeps this worker's entity index under root.

    The same owner asking again with the same settings gets its handle back; with other settings its previous
    handle is closed and a new one returned. Handles of other owners are never touched. Without an owner the
    caller owns (and closes) a fresh handle. A given budget or policy becomes the cache's own (logged when it
    changes): the budget belongs to the cache, so every process enforces the same one.
    """
    folder = cache_dir(root, name)
    url = resolve(server)
    if url is None:
        return _HANDLES.open(str(folder), folder, owner, budget_bytes=budget_bytes, policy=policy,
                             embedder=embedder, spacy_pipeline=spacy_pipeline)
    return _HANDLES.open(f"{url.label}/{name}", folder.parent, owner, budget_bytes=budget_bytes, policy=policy,
                         embedder=embedder, spacy_pipeline=spacy_pipeline, server=url, name=name)


def note_lookup(reader: str, cache: ChaiCache) -> None:
    """Record which cache a lookup (by its node id) read, for reader_generation."""
    _HANDLES.note_read(reader, cache.root)


def reader_generation(reader: str) -> Any:
    """(folder, generation) of the cache this reader last read, or a fresh NaN when unknown or unreadable.

    For ComfyUI's fingerprint_inputs, which sees only widget values: a lookup re-runs only when the cache it
    reads changed. A fresh NaN never compares equal, so an unknown reader always re-runs.
    """
    return _HANDLES.generation(reader)


def close_all() -> None:
    """Close every cache handle open_cache returned in this process (tests, shutdown)."""
    _HANDLES.close_all()
