"""The toy-world quality experiment (`bench/bench_toy_quality.py`): held-out prompts with one-entity donors, and
every condition of one prompt on one model and one cache: the 30-step reference, plain N steps, CHAI N steps (a
real cache holding only the donor, written by the pipeline's own miss) and NIRVANA N steps (the donor's latent at
sigma 0.8 of its 30-step run, denoised with the new prompt), each decoded, read back by the detectors and scored
against the reference clip (PSNR / SSIM, `quality`).
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import numpy as np
import torch

from comfyui_chai.chai_attention.config import ChaiConfig
from comfyui_chai.chai_attention.donors import DonorCapture
from comfyui_chai.chai_attention.identity import model_fingerprint
from comfyui_chai.chai_attention.torch_pipeline import ChaiPipeline
from comfyui_chai.chai_attention.steps import plan_for_config
from comfyui_chai.opensora.sampler import make_noise, opensora_model_kwargs, sample
from comfyui_chai.toyworld.detect import detect
from comfyui_chai.toyworld.latent import decode
from comfyui_chai.toyworld.model import DEFAULT_CFG
from comfyui_chai.toyworld.prompts import Combo, caption, seeded_prefix
from lab.quality import (DONOR_KINDS, NIRVANA_START_SIGMA, cache_steps_for, nearest_by_cosine, nirvana_plan,
                      one_entity_donor, psnr, ssim)

FULL_STEPS = 30
FAST_STEPS = (8, 6, 4)  # the first is the headline budget
PAPER_FAST_STEPS = 8  # the paper's fast schedule, Cache Attention at its steps 2, 3, 4


@dataclass(frozen=True)
class DonorSpec:
    """A donor request: its caption, its attributes and its noise seed."""

    prompt: str
    combo: Combo
    seed: int


@dataclass
class Item:
    """One held-out prompt with its seed and its one-entity donors (kind -> donor)."""

    prompt: str
    combo: Combo
    seed: int
    donors: dict[str, DonorSpec]
    pick: str = ""  # the donor kind NIRVANA's whole-prompt match chose
    redrawn: int = 0  # donor captions drawn again because the lookup would not have found them
    pick_seconds: float = 0.0


@dataclass
class Record:
    """One generated clip: which condition made it, how long it took, what the detectors and metrics say."""

    item: int
    condition: str  # "reference", "plain", "chai", "nirvana" or "donor"
    steps: int
    kind: str | None  # donor kind (scene / object) for chai, nirvana and donor clips
    video: np.ndarray
    seconds: float
    info: dict[str, Any] = field(default_factory=dict)
    detected: tuple[str, ...] = ()
    psnr: float = math.nan
    ssim: float = math.nan


def make_items(held_out: Sequence[Combo], pool: Sequence[Combo], n: int | None, seed: int = 0,
               accept: Callable[[str, str], bool] | None = None, tries: int = 20) -> list[Item]:
    """n held-out prompts (seeded order, so a prefix of the full run), captioned, with a scene and an object donor."""
    # Prompt seeds 1000 + i, donor seeds 5000 + 2 i + kind; donors come from `pool`. A donor caption that
    # accept(prompt, donor_prompt) rejects is drawn again (another phrasing of the same donor), up to `tries` times.
    rng = np.random.default_rng(seed)
    items = []
    for i, combo in enumerate(seeded_prefix(held_out, n, rng)):
        prompt = caption(combo, rng)
        donors, redrawn = {}, 0
        for k, kind in enumerate(DONOR_KINDS):
            d = one_entity_donor(combo, kind, rng, pool)
            text = caption(d, rng)
            for _ in range(tries):
                if accept is None or accept(prompt, text):
                    break
                text, redrawn = caption(d, rng), redrawn + 1
            donors[kind] = DonorSpec(text, d, 5000 + 2 * i + k)
        items.append(Item(prompt, combo, 1000 + i, donors, redrawn=redrawn))
    return items


def lookup_finds(cache: Any, margin: float = 0.01) -> Callable[[str, str], bool]:
    """accept(prompt, donor_prompt): the cache's hit rule accepts some entity pair of the two prompts with
    `margin` to spare (pairs at the threshold are drawn again rather than left to float rounding)."""
    from comfyui_chai.cache_store.lookup.rule import HitRule

    rule = HitRule(min(cache.threshold + margin, 1.0))

    def accept(prompt: str, donor_prompt: str) -> bool:
        q, d = cache.embed_prompt(prompt), cache.embed_prompt(donor_prompt)
        return any(rule.accepts(a, b, float(va @ vb))
                   for a, va in zip(q.entities, q.vectors) for b, vb in zip(d.entities, d.vectors))
    return accept


class TrajectoryTap:
    """Forward pre-hook keeping the latent that enters each model call (the first batch row), in call order."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.latents: list[torch.Tensor] = []
        self.timesteps: list[float] = []
        self._handle = model.register_forward_pre_hook(self._hook)

    def _hook(self, module: Any, args: tuple[Any, ...]) -> None:
        x, t = args[0], args[1]
        self.latents.append(x[:1].detach().to(torch.float32, copy=True))
        self.timesteps.append(float(t.reshape(-1)[0]))

    def close(self) -> None:
        """Remove the hook."""
        self._handle.remove()


class QualityBench:
    """Runs every condition of one prompt on one model and one cache (kept to the donor under test)."""

    def __init__(self, model: Any, cache: Any, *, text_encode: Callable[[str], Any], video: Any,
                 schedule: Callable[[int], Any], cfg: float = DEFAULT_CFG, full_steps: int = FULL_STEPS,
                 fast_steps: Sequence[int] = FAST_STEPS, nirvana_start: float = NIRVANA_START_SIGMA) -> None:
        self.model, self.cache, self.text_encode, self.video = model, cache, text_encode, video
        self.schedule, self.cfg, self.full_steps = schedule, float(cfg), int(full_steps)
        self.fast_steps = tuple(int(n) for n in fast_steps)
        self.nirvana_start = float(nirvana_start)
        self.full_sigmas = schedule(self.full_steps)
        paper = schedule(PAPER_FAST_STEPS)  # cache steps 2,3,4 of 8; other budgets cover the same sigma range
        self.cache_steps = {n: cache_steps_for(schedule(n), paper) for n in self.fast_steps}
        self.fingerprint = model_fingerprint(model)
        self.pipes = {n: ChaiPipeline(model, cache, ChaiConfig(self.full_steps, n, self.cache_steps[n]),
                                      text_encode=text_encode, video=video, fingerprint=self.fingerprint, cfg=cfg,
                                      schedule=schedule) for n in self.fast_steps}
        self.nirvana = {n: nirvana_plan(self.full_sigmas, schedule(n), self.nirvana_start) for n in self.fast_steps}
        self.device = next(model.parameters()).device

    def sample(self, prompt: str, sigmas: Any, *, seed: int | None = None,
               start: torch.Tensor | None = None) -> tuple[torch.Tensor, float]:
        """(latent, seconds) of the reference sampler from seeded noise, or from `start` at sigmas[0]."""
        # The same calls as ChaiPipeline's miss (text features, null caption, model kwargs, batched CFG).
        t0 = time.perf_counter()
        out = self.text_encode(prompt)
        y, mask = out if isinstance(out, tuple) else (out, None)
        uncond = self.model.null_caption(1) if self.cfg != 1.0 else None
        v = self.video
        kwargs = opensora_model_kwargs(v.height, v.width, v.num_frames, 1, v.fps, mask, self.device)
        x = make_noise(v.latent_shape(1), seed, device=self.device) if start is None else start.to(self.device)
        latent = sample(self.model, x, y.to(self.device), uncond, sigmas, self.cfg, None, kwargs)
        return latent, time.perf_counter() - t0

    def donor_run(self, donor: DonorSpec) -> tuple[Any, list[torch.Tensor]]:
        """The donor's miss through the pipeline (30 steps, capture, write) with its recorded trajectory."""
        self.cache.store.clear()
        tap = TrajectoryTap(self.model)
        try:
            miss = self.pipes[self.fast_steps[0]].generate(donor.prompt, donor.seed)
        finally:
            tap.close()
        if miss.report.mode != "full" or not miss.report.write.startswith("stored"):
            raise RuntimeError(f"the donor {donor.prompt!r} was not stored by a miss: {miss.report.text()}")
        if len(tap.latents) != self.full_steps:
            raise RuntimeError(f"expected one batched call per step ({self.full_steps}), saw {len(tap.latents)}")
        plan = plan_for_config(self.full_sigmas, self.schedule(self.fast_steps[0]),
                               self.pipes[self.fast_steps[0]].config)
        for index, kept in zip(plan.indices, miss.donors.donors):
            if not torch.equal(tap.latents[index].to(kept.latent.device), kept.latent):
                raise RuntimeError(f"the recorded trajectory differs from the miss's capture at step {index}")
        return miss, tap.latents

    def write_entry(self, donor: DonorSpec, steps: int, trajectory: list[torch.Tensor], final: torch.Tensor) -> None:
        """Replace the cache's content by the entry a miss under the `steps`-step configuration would store."""
        config = self.pipes[steps].config
        capture = DonorCapture(plan_for_config(self.full_sigmas, self.schedule(steps), config))
        for i, (x, s) in enumerate(zip(trajectory, self.full_sigmas[:-1].tolist())):
            capture.observe(i, x, s)
        capture.observe_final(final, float(self.full_sigmas[-1]))
        tensors, sigmas = capture.donors().to_entry()
        self.cache.store.clear()
        written = self.cache.write(donor.prompt, self.cache.embed_prompt(donor.prompt), self.fingerprint, tensors,
                                   sigmas, shape=self.pipes[steps].shape)
        if not written.stored:
            raise RuntimeError(f"could not write the donor entry for {steps} steps: {written.reason}")

    def run_item(self, index: int, item: Item) -> list[Record]:
        """Every condition of one prompt, scored against its reference clip."""
        recs: list[Record] = []

        def add(condition: str, steps: int, kind: str | None, latent: torch.Tensor, seconds: float,
                **info: Any) -> None:
            recs.append(Record(index, condition, steps, kind, decode(latent)[0].cpu().numpy(), seconds, info))

        ref, sec = self.sample(item.prompt, self.full_sigmas, seed=item.seed)
        add("reference", self.full_steps, None, ref, sec)
        for n in self.fast_steps:
            add("plain", n, None, *self.sample(item.prompt, self.schedule(n), seed=item.seed))
        for kind, donor in item.donors.items():
            miss, trajectory = self.donor_run(donor)
            add("donor", self.full_steps, kind, miss.latent, miss.report.timings["total"])
            for n in self.fast_steps:
                if n != self.fast_steps[0]:
                    self.write_entry(donor, n, trajectory, miss.latent)
                hit = self.pipes[n].generate(item.prompt, item.seed)
                r = hit.report
                ok = (r.mode == "fast" and r.donor_prompt == donor.prompt
                      and tuple(r.fired_steps) == tuple(self.cache_steps[n]))
                add("chai", n, kind, hit.latent, r.timings["total"], hit=ok, mode=r.mode, donor=r.donor_prompt,
                    fired=list(r.fired_steps), matches=[list(m) for m in r.matches])
            for n in self.fast_steps:
                plan = self.nirvana[n]
                latent, sec = self.sample(item.prompt, plan.sigmas, start=trajectory[plan.start_index])
                add("nirvana", n, kind, latent, sec, start_sigma=plan.start_sigma, evaluations=plan.evaluations)
        t0 = time.perf_counter()
        kinds = list(item.donors)
        vecs = self.cache.embedder.embed([item.prompt] + [item.donors[k].prompt for k in kinds])
        item.pick = kinds[nearest_by_cosine(vecs[0], vecs[1:])]
        item.pick_seconds = time.perf_counter() - t0
        reference = recs[0].video
        for rec in recs:
            rec.detected = detect(rec.video).as_tuple()
            if rec.condition != "donor":
                rec.psnr, rec.ssim = psnr(rec.video, reference), ssim(rec.video, reference)
        return recs


def run(bench: QualityBench, items: Sequence[Item],
        progress: Callable[[int, Item, float], None] | None = None) -> list[Record]:
    """All items, in order; progress(done, item, seconds since the start) after each."""
    records: list[Record] = []
    t0 = time.perf_counter()
    for i, item in enumerate(items):
        records += bench.run_item(i, item)
        if progress is not None:
            progress(i + 1, item, time.perf_counter() - t0)
    return records
