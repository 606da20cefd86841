"""What the CHAI nodes hand each other (CHAI_ENTITIES, CHAI_HIT, CHAI_TRACE): plain, immutable-once-built data.

ComfyUI caches node outputs and passes them by reference to every consumer, so nothing here is mutated after
it is built, except the embedding memo of `PromptEntities` (a pure function of its inputs). Latents in these
objects always live on the CPU: a cached output must never pin accelerator memory between runs.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

from .config import ChaiConfig
from .constants import FAST
from .donors import DonorSet


@dataclass
class ChaiReport:
    """What one request did: mode, steps, what matched, where the time went."""

    prompt: str
    mode: str  # FULL (miss) or FAST (hit)
    steps: int
    entities: tuple[str, ...] = ()
    lookup: str = ""
    matches: tuple[tuple[str, str, float], ...] = ()  # (query entity, stored entity, similarity)
    donor_prompt: str | None = None
    donor_entry: int | None = None
    reason: str = ""  # the miss reason (or why a hit could not be used); "shared entities" on a hit
    hit_unusable: bool = False  # the lookup hit, but the hit could not serve this run: it ran the full schedule
    reuse: str = ""  # a hit: how it reused its donor ("restart", "cache_attention" or "both")
    reuse_note: str = ""  # a hit: the restart point and why this mode, and the model evaluations it saved
    cache_steps: tuple[int, ...] = ()
    fired_steps: tuple[int, ...] = ()
    attention: str = ""
    write: str = ""
    timings: dict[str, float] = field(default_factory=dict)  # seconds per stage

    def text(self) -> str:
        """Multi-line human-readable report."""
        head = "hit" if self.mode == FAST else "miss"
        lines = [f"CHAI {self.mode} ({head}): {self.steps} steps",
                 f"entities: {', '.join(self.entities) or '(none)'}",
                 f"lookup: {self.lookup}"]
        if self.reuse_note:
            lines.append(f"reuse: {self.reuse_note}")
        if self.attention:
            lines.append(self.attention)
        if self.write:
            lines.append(f"write: {self.write}")
        stages = ", ".join(f"{k} {v * 1e3:.1f} ms" for k, v in self.timings.items())
        lines.append(f"time: {stages}")
        return "\n".join(lines)


@dataclass(eq=False)
class PromptEntities:
    """CHAI_ENTITIES: a prompt and its extracted entities; embedded on demand, once per embedder.

    `embedder` (optional) is the embedder the workflow chose, e.g. its own text encoder; without one the
    cache's embedder is used, so the vectors always come from the embedder the lookup or write is made with.
    """

    prompt: str
    entities: tuple[Any, ...]  # cache_store.entities.extract.Entity
    embedder: Any = None  # cache_store.entities.embedders.Embedder or None (= the cache's)
    language: str | None = None  # the code of the other language the prompt is in ('de'), None for English
    _memo: dict[str, Any] = field(default_factory=dict, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @property
    def texts(self) -> list[str]:
        """The entity phrases."""
        return [e.text for e in self.entities]

    def listing(self) -> str:
        """Comma-separated entity phrases, or '(none)'."""
        return ", ".join(self.texts) or "(none)"

    def embedded(self, cache: Any) -> Any:
        """The entities as `EmbeddedEntities`, with this object's embedder or else the cache's."""
        embedder = self.embedder if self.embedder is not None else cache.embedder
        key = embedder.identity
        with self._lock:
            found = self._memo.get(key)
        if found is None:
            found = cache.embed_entities(list(self.entities), embedder)
            with self._lock:
                self._memo[key] = found
        return found


@dataclass(frozen=True, eq=False)
class CacheHit:
    """CHAI_HIT: a lookup's outcome for one model fingerprint and latent shape; donors only on a hit."""

    hit: bool
    reason: str
    report: str
    fingerprint: str
    shape: tuple[int, ...]
    threshold: float
    threshold_source: str = ""  # e.g. "auto (0 on the node): the embedder's calibrated value"
    prompt: str = ""
    entities: tuple[str, ...] = ()
    cache_root: str | None = None
    entry_id: int | None = None
    donor_prompt: str | None = None
    matches: tuple[tuple[str, str, float], ...] = ()  # (query entity, stored entity, similarity)
    scene_match: bool = False  # one of the hit-carrying matches is the request's scene (a restart needs it)
    same_prompt: bool = False  # the donor's prompt is the request's (up to case and spacing): a few-step restart
    donors: DonorSet | None = None
    timings: dict[str, float] = field(default_factory=dict)

    def unusable_reason(self, fingerprint: str, shape: tuple[int, ...]) -> str | None:
        """Why this hit cannot serve a run of `fingerprint` on a latent of `shape` (None when it can)."""
        if not self.hit or self.donors is None:
            return self.reason or "no hit"
        if fingerprint != self.fingerprint:
            return (f"the hit was looked up for another model (fingerprint {self.fingerprint}, this sampler's "
                    f"model {fingerprint}); connect the same MODEL to the lookup and the sampler (and the same "
                    "model_2 for Wan 2.2 A14B, the same positive conditioning for image-to-video)")
        if tuple(shape) != tuple(self.shape):
            return (f"the hit was looked up for a latent of shape {list(self.shape)}, this sampler's latent is "
                    f"{list(shape)}; connect the same LATENT to the lookup and the sampler")
        if tuple(self.donors.shape) != tuple(shape):
            return f"the donor latents have shape {list(self.donors.shape)}, the latent {list(shape)}"
        return None


@dataclass(frozen=True, eq=False)
class SampleTrace:
    """CHAI_TRACE: what a CHAI sampler run did; a full run carries its captured donors for the cache write."""

    mode: str  # FULL or FAST
    fingerprint: str
    shape: tuple[int, ...]
    config: ChaiConfig
    sampler_name: str
    scheduler: str
    sigmas: tuple[float, ...]
    report: ChaiReport
    donors: DonorSet | None = None  # FULL: the captured donor latents (None when the capture was incomplete)
    capture_problem: str = ""  # FULL: why no donors were captured
    donor_entry: int | None = None  # FAST: the cache entry whose latents served as donors
    donor_cache: str | None = None  # FAST: the folder of that cache
    fired_steps: tuple[int, ...] = ()
    firings: tuple[Any, ...] = ()  # FAST: every Cache Attention call (run.Firing: step, sigma, block, rows)

    def meta(self) -> dict[str, Any]:
        """JSON-ready settings stored with a cache entry."""
        return {"sampler": self.sampler_name, "scheduler": self.scheduler, "steps": len(self.sigmas) - 1,
                "chai": self.config.to_dict()}
