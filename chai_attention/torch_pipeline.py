"""The CHAI request path in plain torch (no ComfyUI): entities -> lookup -> sample (full or fast) -> write.

A miss samples the full schedule and keeps the donor latents the fast schedule's cache steps will ask for and the
restart origin, then stores them; a hit samples the fast schedule in its reuse mode (request.py): from the donor's
origin re-noised with the request's noise (a restart), and/or with Cache Attention at the cache steps, fed by the
donor's latents (the lookup already refreshed the donor's recency; fast runs store nothing). CFG follows the reference
sampler: batched calls carry [cond; uncond] in that order, split calls are told apart by their text tensor.

Cache Attention runs through the one mechanism every family uses (chai_attention.hooks): each model call goes
through `CacheAttentionWrapper` with a trivial executor that calls the model with transformer_options carrying
the run and the adapter's block patch, as ComfyUI would.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable

import torch
from torch import Tensor

from ..opensora import sampler as opensora_sampler
from ..opensora import schedule as opensora_schedule
from .adapters import get_adapter
from .cache_io import lookup_hit, write_trace
from .config import ChaiConfig
from .constants import RUN_KEY, TIMESTEP_SCALE
from .donors import DonorCapture, DonorSet
from .hooks import CacheAttentionWrapper, HookAdapter, with_block_patch
from .identity import model_fingerprint
from .payloads import ChaiReport, PromptEntities
from .request import finish_fast, finish_full, plan_request, trace_for
from .restart import renoise
from .run import BATCHED_CFG, COND, UNCOND, CacheAttentionRun
from .steps import as_sigmas

TextEncode = Callable[[str], "Tensor | tuple[Tensor, Tensor | None]"]


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
    """Model callable for the reference sampler that runs every call through the Cache Attention wrapper.

    The model must take `transformer_options` and honour the block patch and the attention override there (see
    chai_attention.hooks; the pack's STDiT3 does). The wrapper gets ComfyUI's APPLY_MODEL call shape: (x, sigma,
    c_concat, c_crossattn = the text, control, transformer_options, **the model's other inputs).
    """

    def __init__(self, model: Any, adapter: HookAdapter, run: CacheAttentionRun, cond: Tensor, batch: int) -> None:
        self.model, self.adapter, self.run, self.cond, self.batch = model, adapter, run, cond, batch
        self.wrapper = CacheAttentionWrapper(adapter, RUN_KEY)
        self.options = with_block_patch({}, adapter)

    def layout(self, x: Tensor, y: Tensor) -> tuple[int, ...]:
        """cond_or_uncond of a call: [cond; uncond] when batched, else cond or uncond by the text tensor."""
        chunks, rest = divmod(x.shape[0], self.batch)
        if rest or chunks not in (1, 2):
            raise ValueError(f"a call with batch {x.shape[0]} is neither one nor two chunks of {self.batch}")
        if chunks == 2:
            return BATCHED_CFG
        return (COND,) if _same_tensor(y, self.cond) else (UNCOND,)

    def _apply_model(self, x: Tensor, sigma: Tensor, c_concat: Any, c_crossattn: Tensor, control: Any,
                     transformer_options: dict, **kwargs: Any) -> Tensor:
        """The trivial executor: the model called with timestep = 1000 * sigma and the text as y."""
        # sigma is float64 (timestep / 1000): back to the float32 timestep bit for bit.
        timestep = (sigma * TIMESTEP_SCALE).to(torch.float32)
        return self.model(x, timestep, c_crossattn, transformer_options=transformer_options, **kwargs)

    def __call__(self, x: Tensor, timestep: Any, y: Tensor, **kwargs: Any) -> Tensor:
        """Forward with the run's Cache Attention at its cache steps."""
        options = {**self.options, RUN_KEY: self.run, "cond_or_uncond": list(self.layout(x, y))}
        sigma = torch.as_tensor(timestep, device=x.device).to(torch.float64) / TIMESTEP_SCALE
        return self.wrapper(self._apply_model, x, sigma, None, y, None, options, **kwargs)


class ChaiPipeline:
    """CHAI on a pure-torch model (STDiT3) with the reference rectified-flow sampler and a ChaiCache.

    text_encode(prompt) returns the model's text features y (e.g. T5 [1, 1, L, 4096]) or (y, mask); negative is
    the uncond features (default: the model's null caption). video is an `opensora.presets.VideoSpec`: it fixes
    the latent shape, the schedule's shift and the model's height/width/fps inputs. schedule(steps) -> sigmas
    overrides the exact OpenSora schedule. fingerprint defaults to `model_fingerprint(model)`. fast_solver
    samples a hit's steps ("euler" or "dpmpp_2m", `opensora.sampler.SOLVERS`); a miss is the full Euler run.
    """

    def __init__(self, model: Any, cache: Any, config: ChaiConfig | None = None, *, text_encode: TextEncode,
                 video: Any, fingerprint: str | None = None, cfg: float = 7.0, negative: Tensor | None = None,
                 threshold: float | None = None, batch_size: int = 1, batched_cfg: bool = True,
                 schedule: Callable[[int], Any] | None = None, fast_solver: str = "euler") -> None:
        if fast_solver not in opensora_sampler.SOLVERS:
            raise ValueError(f"fast_solver must be one of {opensora_sampler.SOLVERS}, got {fast_solver!r}")
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
        self.fast_solver = fast_solver

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
        return opensora_sampler.opensora_model_kwargs(v.height, v.width, v.num_frames, self.batch_size, v.fps, mask,
                                                   self._device())

    def generate(self, prompt: str, seed: int) -> ChaiResult:
        """One request: look up, sample fast with Cache Attention on a hit or full with capture on a miss, store."""
        timings: dict[str, float] = {}
        start = time.perf_counter()
        entities = PromptEntities(prompt, tuple(self.cache.extractor.extract(prompt or "")))
        timings["entities"] = time.perf_counter() - start
        t = time.perf_counter()
        hit = lookup_hit(self.cache, entities, self.fingerprint, self.shape, self.threshold)
        timings["lookup"] = time.perf_counter() - t
        plan = plan_request(hit, fingerprint=self.fingerprint, shape=self.shape, config=self.config,
                            adapter=self.adapter, schedule=self.sigmas)
        t = time.perf_counter()
        y, uncond, mask = self._encode(prompt)
        timings["text_encode"] = time.perf_counter() - t
        noise = opensora_sampler.make_noise(self.shape, seed, device=self._device())
        kwargs = self._kwargs(mask)
        use_uncond = uncond if self.cfg != 1.0 else None
        t = time.perf_counter()
        donors, problem = None, ""
        if plan.hit:
            x_start = noise if plan.restart is None else renoise(plan.restart.origin.to(noise.device), noise,
                                                                 plan.restart.sigma)
            model: Any = self.model
            if plan.run is not None:
                model = PatchedModel(self.model, self.adapter, plan.run, y, self.batch_size)
            try:
                history = plan.restart.history if plan.restart is not None else None
                if history is not None:  # a few-step restart resumes the donor's solver (restart.py)
                    history = (history[0].to(noise.device), history[1])
                latent = opensora_sampler.sample(model, x_start, y, use_uncond, plan.sigmas, self.cfg, None, kwargs,
                                                 batched_cfg=self.batched_cfg,
                                                 solver="dpmpp_2m" if history is not None else self.fast_solver,
                                                 history=history)
            finally:
                if plan.run is not None:
                    plan.run.release()
            finish_fast(plan)
        else:
            capture = DonorCapture(plan.full_capture())
            latent = opensora_sampler.sample(self.model, noise, y, use_uncond, plan.sigmas, self.cfg, capture, kwargs,
                                             batched_cfg=self.batched_cfg)
            capture.observe_final(latent, plan.sigmas[-1])
            donors, problem = finish_full(plan, capture)
        timings["sample"] = time.perf_counter() - t
        trace = trace_for(plan, hit, fingerprint=self.fingerprint, shape=self.shape, config=self.config,
                          sampler_name="euler",
                          scheduler="opensora" if self._schedule is None else "custom", donors=donors, capture_problem=problem)
        t = time.perf_counter()
        _, plan.report.write = write_trace(self.cache, entities, trace)
        timings["write"] = time.perf_counter() - t
        timings["total"] = time.perf_counter() - start
        plan.report.timings = timings
        return ChaiResult(latent, plan.report, hit.donors if plan.hit and hit is not None else donors, plan.run)
