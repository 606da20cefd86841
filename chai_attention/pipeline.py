"""The CHAI request path in plain torch (no ComfyUI): entities -> lookup -> sample (full or fast) -> write.

A miss samples the full schedule and keeps the donor latents the fast schedule's cache steps will ask for, then
stores them; a hit samples the fast schedule with Cache Attention at the cache steps, fed by the donor's
latents (the lookup already refreshed the donor's recency; fast runs store nothing). CFG follows the reference
sampler: batched calls carry [cond; uncond] in that order, split calls are told apart by their text tensor.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
from torch import Tensor

from ..opensora import sampler as opensora_sampler
from ..opensora import schedule as opensora_schedule
from .adapters.base import get_adapter
from .config import ChaiConfig
from .donors import DonorCapture, DonorSet
from .fingerprint import model_fingerprint
from .run import BATCHED_CFG, COND, UNCOND, CacheAttentionRun
from .steps import as_sigmas, plan_for_config

TextEncode = Callable[[str], "Tensor | tuple[Tensor, Tensor | None]"]


@dataclass
class ChaiReport:
    """What one request did: mode, steps, what matched, where the time went."""

    prompt: str
    mode: str  # "full" (miss) or "fast" (hit)
    steps: int
    entities: tuple[str, ...] = ()
    lookup: str = ""
    matches: tuple[tuple[str, str, float], ...] = ()  # (query entity, stored entity, similarity)
    donor_prompt: str | None = None
    donor_entry: int | None = None
    reason: str = ""  # the miss reason (or why a hit could not be used); "shared entities" on a hit
    cache_steps: tuple[int, ...] = ()
    fired_steps: tuple[int, ...] = ()
    attention: str = ""
    write: str = ""
    timings: dict[str, float] = field(default_factory=dict)  # seconds per stage

    def text(self) -> str:
        """Multi-line human-readable report."""
        head = "hit" if self.mode == "fast" else "miss"
        lines = [f"CHAI {self.mode} ({head}): {self.steps} steps",
                 f"entities: {', '.join(self.entities) or '(none)'}",
                 f"lookup: {self.lookup}"]
        if self.attention:
            lines.append(self.attention)
        if self.write:
            lines.append(f"write: {self.write}")
        stages = ", ".join(f"{k} {v * 1e3:.1f} ms" for k, v in self.timings.items())
        lines.append(f"time: {stages}")
        return "\n".join(lines)


@dataclass
class ChaiResult:
    """The final latent, the report, the donors (captured on a miss, used on a hit) and the run state."""

    latent: Tensor
    report: ChaiReport
    donors: DonorSet | None = None
    run: CacheAttentionRun | None = None


def _same_tensor(a: Tensor, b: Tensor) -> bool:
    """True when a is b, a view of b's storage with b's shape, or equal in value."""
    if a is b:
        return True
    if a.shape != b.shape:
        return False
    if a.device == b.device and a.data_ptr() == b.data_ptr() and a.stride() == b.stride():
        return True
    return bool(torch.equal(a, b.to(a.dtype)))


class PatchedModel:
    """Model callable for the reference sampler that adds the adapter's Cache Attention to every call."""

    def __init__(self, model: Any, adapter: Any, run: CacheAttentionRun, cond: Tensor, batch: int) -> None:
        if not hasattr(adapter, "attn_replace"):
            raise TypeError(f"the {adapter.family} adapter has no attn_replace hook for the pure-torch pipeline")
        self.model, self.adapter, self.run, self.cond, self.batch = model, adapter, run, cond, batch

    def layout(self, x: Tensor, y: Tensor) -> tuple[int, ...]:
        """cond_or_uncond of a call: [cond; uncond] when batched, else cond or uncond by the text tensor."""
        chunks, rest = divmod(x.shape[0], self.batch)
        if rest or chunks not in (1, 2):
            raise ValueError(f"a call with batch {x.shape[0]} is neither one nor two chunks of {self.batch}")
        if chunks == 2:
            return BATCHED_CFG
        return (COND,) if _same_tensor(y, self.cond) else (UNCOND,)

    def __call__(self, x: Tensor, timestep: Any, y: Tensor, **kwargs: Any) -> Tensor:
        """Forward with block 0's self-attention replaced by the run's Cache Attention."""
        replace = self.adapter.attn_replace(self.run, self.layout(x, y))
        return self.model(x, timestep, y, attn_replace=replace, **kwargs)


class ChaiPipeline:
    """CHAI on a pure-torch model (STDiT3) with the reference rectified-flow sampler and a ChaiCache.

    text_encode(prompt) returns the model's text features y (e.g. T5 [1, 1, L, 4096]) or (y, mask); negative is
    the uncond features (default: the model's null caption). video is an `opensora.presets.VideoSpec`: it fixes
    the latent shape, the schedule's shift and the model's height/width/fps inputs. schedule(steps) -> sigmas
    overrides the exact OpenSora schedule. fingerprint defaults to `model_fingerprint(model)`.
    """

    def __init__(self, model: Any, cache: Any, config: ChaiConfig | None = None, *, text_encode: TextEncode,
                 video: Any, fingerprint: str | None = None, cfg: float = 7.0, negative: Tensor | None = None,
                 threshold: float | None = None, batch_size: int = 1, batched_cfg: bool = True,
                 schedule: Callable[[int], Any] | None = None) -> None:
        self.model = model
        self.adapter = get_adapter(model)
        self.cache = cache
        self.config = config or ChaiConfig()
        self.text_encode = text_encode
        self.video = video
        self.fingerprint = fingerprint or model_fingerprint(model)
        self.cfg = float(cfg)
        self.negative = negative
        self.threshold = threshold
        self.batch_size = int(batch_size)
        self.batched_cfg = batched_cfg
        self._schedule = schedule
        self._sampler = opensora_sampler

    @property
    def shape(self) -> tuple[int, ...]:
        """Latent shape [B, C, T, H, W] of every generation."""
        return tuple(self.video.latent_shape(self.batch_size))

    def sigmas(self, steps: int) -> tuple[float, ...]:
        """The schedule for a step count (exact OpenSora schedule unless overridden)."""
        if self._schedule is not None:
            return as_sigmas(self._schedule(steps))
        v = self.video
        return as_sigmas(opensora_schedule.opensora_sigmas(steps, v.height, v.width, v.num_frames))

    def _device(self) -> torch.device:
        return next(self.adapter.model.parameters()).device

    def _features(self, prompt: str) -> tuple[Tensor, Tensor | None]:
        out = self.text_encode(prompt)
        y, mask = out if isinstance(out, tuple) else (out, None)
        if y.shape[0] == 1 and self.batch_size > 1:
            y = y.expand(self.batch_size, *y.shape[1:])
        return y, mask

    def _encode(self, prompt: str) -> tuple[Tensor, Tensor, Tensor | None]:
        y, mask = self._features(prompt)
        if self.negative is not None:
            uncond = self.negative
        elif hasattr(self.adapter.model, "null_caption"):
            uncond = self.adapter.model.null_caption(self.batch_size)
        else:
            uncond = self._features("")[0]
        return y, uncond, mask

    def _kwargs(self, mask: Tensor | None) -> dict[str, Any]:
        v = self.video
        return self._sampler.opensora_model_kwargs(v.height, v.width, v.num_frames, self.batch_size, v.fps, mask,
                                                   self._device())

    def generate(self, prompt: str, seed: int) -> ChaiResult:
        """One request: look up, sample fast with Cache Attention on a hit or full with capture on a miss, store."""
        timings: dict[str, float] = {}
        start = time.perf_counter()
        entities = self.cache.embed_prompt(prompt)
        timings["entities"] = time.perf_counter() - start
        t = time.perf_counter()
        found = self.cache.lookup(entities, self.fingerprint, self.shape, self.threshold)
        timings["lookup"] = time.perf_counter() - t
        report = ChaiReport(prompt, "full", self.config.full_steps, tuple(entities.texts), found.report(),
                            reason=found.reason)
        donors = None
        if found.hit:
            report.matches = tuple((m.query, m.entity, float(m.similarity)) for m in found.matches)
            report.donor_prompt, report.donor_entry = found.entry.prompt, found.entry.id
            try:
                donors = DonorSet.from_lookup(found)
                if donors.shape != self.shape:
                    raise ValueError(f"donor shape {donors.shape} differs from the latent shape {self.shape}")
            except ValueError as exc:
                donors = None
                report.reason = f"the cached entry could not be used ({exc}); sampling the full schedule"
                report.lookup += f" (unusable: {exc})"
        t = time.perf_counter()
        y, uncond, mask = self._encode(prompt)
        timings["text_encode"] = time.perf_counter() - t
        noise = self._sampler.make_noise(self.shape, seed, device=self._device())
        kwargs = self._kwargs(mask)
        use_uncond = uncond if self.cfg != 1.0 else None
        fast_sigmas = self.sigmas(self.config.fast_steps)
        t = time.perf_counter()
        if donors is not None:
            run = CacheAttentionRun(self.config, fast_sigmas, donors)
            self.adapter.check_run(run)
            patched = PatchedModel(self.model, self.adapter, run, y, self.batch_size)
            try:
                latent = self._sampler.sample(patched, noise, y, use_uncond, fast_sigmas, self.cfg, None, kwargs,
                                              batched_cfg=self.batched_cfg)
            finally:
                run.release()
            timings["sample"] = time.perf_counter() - t
            report.mode, report.steps = "fast", self.config.fast_steps
            report.cache_steps, report.fired_steps = self.config.cache_steps, run.fired_steps
            report.attention = run.summary()
            report.write = "skipped: fast runs store nothing (the lookup refreshed the donor's recency)"
            timings["total"] = time.perf_counter() - start
            report.timings = timings
            return ChaiResult(latent, report, donors, run)
        full_sigmas = self.sigmas(self.config.full_steps)
        capture = DonorCapture(plan_for_config(full_sigmas, fast_sigmas, self.config))
        latent = self._sampler.sample(self.model, noise, y, use_uncond, full_sigmas, self.cfg, capture, kwargs,
                                      batched_cfg=self.batched_cfg)
        capture.observe_final(latent, full_sigmas[-1])
        timings["sample"] = time.perf_counter() - t
        captured = capture.donors()
        t = time.perf_counter()
        tensors, sigmas = captured.to_entry()
        written = self.cache.write(prompt, entities, self.fingerprint, tensors, sigmas, shape=self.shape)
        timings["write"] = time.perf_counter() - t
        sig = ", ".join(f"{s:.4f}" for s in sigmas)
        report.write = f"{written.reason}; donor sigmas {sig}" if written.stored else f"not stored: {written.reason}"
        timings["total"] = time.perf_counter() - start
        report.timings = timings
        return ChaiResult(latent, report, captured, None)
