"""Between the cache and the CHAI payloads: a lookup that yields a CacheHit, a write that stores a full run's trace.

`cache` is anything shaped like `CacheLike` (in the pack a `cache_store.service.ChaiCache`; this module imports
nothing of cache_store), `entities` a `PromptEntities`, `trace` a `SampleTrace`.
"""
from __future__ import annotations

import enum
import time
from dataclasses import replace
from pathlib import Path
from typing import Any, Mapping, NamedTuple, Protocol, Sequence

from .constants import FAST, FULL
from .donors import DonorSet
from .payloads import CacheHit, PromptEntities, SampleTrace


class EmbedderLike(Protocol):
    """What the glue reads of an embedder (cache_store.entities.embedders.Embedder)."""

    @property
    def identity(self) -> str: ...

    @property
    def default_threshold(self) -> float: ...


class EntryLike(Protocol):
    """What the glue reads of a cache entry (cache_store.types.EntryInfo)."""

    @property
    def id(self) -> int: ...

    @property
    def prompt(self) -> str: ...

    @property
    def sigmas(self) -> Sequence[float]: ...


class MatchLike(Protocol):
    """A matched entity pair of a hit (cache_store.types.Match)."""

    @property
    def query(self) -> str: ...

    @property
    def entity(self) -> str: ...

    @property
    def similarity(self) -> float: ...
    @property
    def role(self) -> str: ...


class FoundLike(Protocol):
    """A lookup's outcome (cache_store.types.LookupResult): a hit with its entry and latents, or a miss."""

    @property
    def hit(self) -> bool: ...

    @property
    def reason(self) -> str: ...

    @property
    def entry(self) -> EntryLike | None: ...

    @property
    def matches(self) -> Sequence[MatchLike]: ...

    @property
    def latents(self) -> Mapping[str, Any] | None: ...

    @property
    def timings(self) -> Mapping[str, float]: ...

    def report(self) -> str:
        """A short summary of the hit or miss."""


class StoreLike(Protocol):
    """What the glue calls on a cache's store (either backend)."""

    def entry(self, entry_id: int) -> EntryLike | None:
        """The entry, or None once it is gone."""

    def touch(self, entry_id: int, count_hit: bool = True) -> None:
        """Refresh an entry's recency."""


class WrittenLike(Protocol):
    """A cache write's outcome (cache_store.service.WriteResult)."""

    @property
    def stored(self) -> bool: ...

    @property
    def reason(self) -> str: ...


class CacheLike(Protocol):
    """What the CHAI glue needs from a cache (cache_store.service.ChaiCache): lookup, write, embed, the store."""

    @property
    def root(self) -> Path | str: ...

    @property
    def threshold(self) -> float: ...

    @property
    def embedder(self) -> EmbedderLike: ...

    @property
    def store(self) -> StoreLike: ...

    def embed_entities(self, entities: Sequence[Any], embedder: Any = None) -> Any:
        """The entities embedded (EmbeddedEntities)."""

    def lookup(self, entities: Any, fingerprint: str, shape: Sequence[int],
               threshold: float | None = None) -> FoundLike:
        """A hit (entry, matches, loaded latents) or a miss (reason)."""

    def write(self, prompt: str, entities: Any, fingerprint: str, latents: Mapping[str, Any],
              sigmas: Sequence[float], shape: Sequence[int] | None = None,
              meta: Mapping[str, Any] | None = None) -> WrittenLike:
        """Insert a full run's donor latents."""


class WriteOutcome(enum.Enum):
    """What `write_trace` did with a run's trace."""

    STORED = "stored"  # a full run's donors became a new entry
    NOT_STORED = "not stored"  # a full run whose donors were incomplete, or that the cache refused
    REFRESHED = "refreshed"  # a fast run: its donor's recency was refreshed
    DONOR_EVICTED = "donor evicted"  # a fast run whose donor entry is gone
    OTHER_CACHE = "other cache"  # a fast run whose donor came from another cache
    NO_DONOR = "no donor"  # a fast run without a donor entry

    @property
    def fast(self) -> bool:
        """The trace was a fast run (which never stores)."""
        return self not in (WriteOutcome.STORED, WriteOutcome.NOT_STORED)


class WriteReport(NamedTuple):
    """`write_trace`'s result: the outcome and the report line."""

    outcome: WriteOutcome
    line: str

    @property
    def stored(self) -> bool:
        """A new entry was stored."""
        return self.outcome is WriteOutcome.STORED


def resolve_threshold(cache: CacheLike, entities: PromptEntities, threshold: float | None) -> float:
    """The similarity threshold: the given one when > 0, else the calibrated default of the embedder in use."""
    if threshold is not None and threshold > 0:
        return float(threshold)
    if entities.embedder is None:
        return float(cache.threshold)  # the cache's configured threshold, else its embedder's calibrated one
    return float(entities.embedder.default_threshold)


def threshold_source(cache: CacheLike, entities: PromptEntities, threshold: float | None) -> str:
    """Where the threshold in use comes from, in words for the lookup report (0 on the node means auto)."""
    if threshold is not None and threshold > 0:
        return "set on the node"
    if entities.embedder is not None:
        return "auto (0 on the node): the text encoder's provisional value"
    embedder = getattr(cache, "embedder", None)
    if embedder is not None and float(cache.threshold) != float(embedder.default_threshold):
        return "auto (0 on the node): the threshold configured for this cache"
    return "auto (0 on the node): the embedder's calibrated value"


def _same_prompt(a: str, b: str | None) -> bool:
    """Whether two prompts are the same text up to case and spacing (as the store's `ranking.same_prompt`)."""
    return b is not None and " ".join(a.lower().split()) == " ".join(b.lower().split()) != ""


def lookup_hit(cache: CacheLike, entities: PromptEntities, fingerprint: str, shape: Sequence[int],
               threshold: float | None = None) -> CacheHit:
    """Look the prompt's entities up for this model fingerprint and latent shape; a hit carries CPU donors."""
    t0 = time.perf_counter()
    embedded = entities.embedded(cache)
    if hasattr(embedded, "prompt") and embedded.prompt != entities.prompt:  # a cache double may embed its own way
        embedded = replace(embedded, prompt=entities.prompt)
    t_embed = time.perf_counter() - t0
    thr = resolve_threshold(cache, entities, threshold)
    shape = tuple(int(s) for s in shape)
    result = cache.lookup(embedded, fingerprint, shape, thr)
    timings = {"embed": t_embed, **result.timings, "lookup": time.perf_counter() - t0}
    miss = CacheHit(False, result.reason, result.report(), fingerprint=fingerprint, shape=shape, threshold=thr,
                    threshold_source=threshold_source(cache, entities, threshold), prompt=entities.prompt,
                    entities=tuple(entities.texts), cache_root=str(cache.root), timings=timings)
    if not result.hit:
        return miss
    if result.entry is None:
        raise ValueError(f"the cache at {cache.root} reported a hit without its entry")
    matches = tuple((m.query, m.entity, float(m.similarity)) for m in result.matches)
    scene = any(getattr(m, "role", "") == "scene" for m in result.matches)
    found = replace(miss, entry_id=result.entry.id, donor_prompt=result.entry.prompt, matches=matches,
                    scene_match=scene, same_prompt=_same_prompt(entities.prompt, result.entry.prompt))
    try:
        donors = DonorSet.from_lookup(result)
    except ValueError as exc:
        reason = f"cache entry {result.entry.id} holds no usable donor latents ({exc})"
        return replace(found, reason=reason, report=f"miss: {reason}")
    if tuple(donors.shape) != shape:
        reason = f"cache entry {result.entry.id} holds latents of shape {list(donors.shape)}, not {list(shape)}"
        return replace(found, reason=reason, report=f"miss: {reason}")
    return replace(found, hit=True, donors=donors)


def write_trace(cache: CacheLike, entities: PromptEntities, trace: SampleTrace) -> WriteReport:
    """Store a full run's donors under the prompt's entities; a fast run only refreshes its donor's recency."""
    if trace.mode == FAST:
        if trace.donor_entry is None:
            return WriteReport(WriteOutcome.NO_DONOR, "fast run without a donor entry: nothing to do")
        if trace.donor_cache is not None and str(trace.donor_cache) != str(cache.root):
            return WriteReport(WriteOutcome.OTHER_CACHE, f"fast run: its donor came from another cache "
                               f"({trace.donor_cache}); nothing stored, no recency refreshed")
        store = cache.store
        if store.entry(trace.donor_entry) is None:  # both backends: a touch of a gone entry updates no row
            return WriteReport(WriteOutcome.DONOR_EVICTED, f"fast run: donor entry {trace.donor_entry} has been "
                               "evicted since; nothing stored")
        store.touch(trace.donor_entry, count_hit=False)
        return WriteReport(WriteOutcome.REFRESHED, f"fast run: nothing stored (only full runs are); refreshed the "
                           f"recency of donor entry {trace.donor_entry}")
    if trace.mode != FULL:
        raise ValueError(f"unknown CHAI trace mode {trace.mode!r}")
    if trace.donors is None:
        return WriteReport(WriteOutcome.NOT_STORED,
                           f"not stored: {trace.capture_problem or 'the run captured no donor latents'}")
    embedded = entities.embedded(cache)
    tensors, sigmas = trace.donors.to_entry()
    written = cache.write(entities.prompt, embedded, trace.fingerprint, tensors, sigmas, shape=trace.shape,
                          meta=trace.meta())
    if not written.stored:
        return WriteReport(WriteOutcome.NOT_STORED, f"not stored: {written.reason}")
    sig = ", ".join(f"{s:.4f}" for s in sigmas)
    return WriteReport(WriteOutcome.STORED, f"{written.reason}; entities [{entities.listing()}]; donor sigmas {sig}")


__all__ = ["CacheLike", "StoreLike", "EmbedderLike", "EntryLike", "MatchLike", "FoundLike", "WrittenLike",
           "WriteOutcome", "WriteReport", "resolve_threshold", "threshold_source", "lookup_hit", "write_trace"]
