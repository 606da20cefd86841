"""Between the cache and the CHAI payloads: a lookup that yields a CacheHit, a write that stores a full run's trace.

`cache` is a `cache_store.service.ChaiCache` (used through its methods only, so this module imports nothing of
cache_store), `entities` a `PromptEntities`, `trace` a `SampleTrace`.
"""
from __future__ import annotations

import time
from typing import Any, Sequence

from .donors import DonorSet
from .constants import FAST, FULL
from .payloads import CacheHit, PromptEntities, SampleTrace


def resolve_threshold(cache: Any, entities: PromptEntities, threshold: float | None) -> float:
    """The similarity threshold: the given one when > 0, else the calibrated default of the embedder in use."""
    if threshold is not None and threshold > 0:
        return float(threshold)
    if entities.embedder is None:
        return float(cache.threshold)  # the cache's configured threshold, else its embedder's calibrated one
    return float(entities.embedder.default_threshold)


def threshold_source(cache: Any, entities: PromptEntities, threshold: float | None) -> str:
    """Where the threshold in use comes from, in words for the lookup report (0 on the node means auto)."""
    if threshold is not None and threshold > 0:
        return "set on the node"
    if entities.embedder is not None:
        return "auto (0 on the node): the text encoder's provisional value"
    embedder = getattr(cache, "embedder", None)
    if embedder is not None and float(cache.threshold) != float(embedder.default_threshold):
        return "auto (0 on the node): the threshold configured for this cache"
    return "auto (0 on the node): the embedder's calibrated value"


def lookup_hit(cache: Any, entities: PromptEntities, fingerprint: str, shape: Sequence[int],
               threshold: float | None = None) -> CacheHit:
    """Look the prompt's entities up for this model fingerprint and latent shape; a hit carries CPU donors."""
    t0 = time.perf_counter()
    embedded = entities.embedded(cache)
    t_embed = time.perf_counter() - t0
    thr = resolve_threshold(cache, entities, threshold)
    shape = tuple(int(s) for s in shape)
    result = cache.lookup(embedded, fingerprint, shape, thr)
    timings = {"embed": t_embed, **result.timings, "lookup": time.perf_counter() - t0}
    base = dict(fingerprint=fingerprint, shape=shape, threshold=thr,
                threshold_source=threshold_source(cache, entities, threshold), prompt=entities.prompt,
                entities=tuple(entities.texts), cache_root=str(cache.root), timings=timings)
    if not result.hit:
        return CacheHit(False, result.reason, result.report(), **base)
    matches = tuple((m.query, m.entity, float(m.similarity)) for m in result.matches)
    found = dict(entry_id=result.entry.id, donor_prompt=result.entry.prompt, matches=matches)
    try:
        donors = DonorSet.from_lookup(result)
    except ValueError as exc:
        reason = f"cache entry {result.entry.id} holds no usable donor latents ({exc})"
        return CacheHit(False, reason, f"miss: {reason}", **base, **found)
    if tuple(donors.shape) != shape:
        reason = f"cache entry {result.entry.id} holds latents of shape {list(donors.shape)}, not {list(shape)}"
        return CacheHit(False, reason, f"miss: {reason}", **base, **found)
    return CacheHit(True, result.reason, result.report(), donors=donors, **base, **found)


def write_trace(cache: Any, entities: PromptEntities, trace: SampleTrace) -> tuple[bool, str]:
    """Store a full run's donors under the prompt's entities; a fast run only refreshes its donor's recency.

    Returns (stored, report line).
    """
    if trace.mode == FAST:
        if trace.donor_entry is None:
            return False, "fast run without a donor entry: nothing to do"
        if trace.donor_cache is not None and str(trace.donor_cache) != str(cache.root):
            return False, (f"fast run: its donor came from another cache ({trace.donor_cache}); nothing stored, "
                           "no recency refreshed")
        store = cache.store
        manifest = getattr(store, "manifest", None)
        if manifest is not None and manifest.entry(trace.donor_entry) is None:
            return False, f"fast run: donor entry {trace.donor_entry} has been evicted since; nothing stored"
        store.touch(trace.donor_entry, count_hit=False)
        return False, (f"fast run: nothing stored (only full runs are); refreshed the recency of donor entry "
                       f"{trace.donor_entry}")
    if trace.mode != FULL:
        raise ValueError(f"unknown CHAI trace mode {trace.mode!r}")
    if trace.donors is None:
        return False, f"not stored: {trace.capture_problem or 'the run captured no donor latents'}"
    embedded = entities.embedded(cache)
    tensors, sigmas = trace.donors.to_entry()
    written = cache.write(entities.prompt, embedded, trace.fingerprint, tensors, sigmas, shape=trace.shape,
                          meta=trace.meta())
    if not written.stored:
        return False, f"not stored: {written.reason}"
    sig = ", ".join(f"{s:.4f}" for s in sigmas)
    return True, f"{written.reason}; entities [{entities.listing()}]; donor sigmas {sig}"
