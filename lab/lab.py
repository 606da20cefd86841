"""The quality lab's generator: held-out prompts, donors of four relations, and every sampling condition of the grid.

Donor relations to a prompt (scene, obj, colour, motion): "scene" shares only the scene, "object" only the coloured
object, "none" nothing (the control for "any donor at all"), "same" the whole combination (another caption and
seed: the control for a perfect match). Donors come from the training combinations except "same".

A condition is plain N-step sampling or CHAI at N steps under a `Variant`: which fast steps borrow (the paper's
sigma range, the pack's default steps, or a set of steps of 8 mapped to N by sigma), `replace` or `concat` K/V,
how strongly (the borrowed attention output blended with the block's own), which spatial blocks (0, or 0 and 1),
K/V from the donor's latent at the matched sigma or from its clean result, and multi-entry fusion (the K/V of a
scene donor and of an object donor, concatenated along the tokens). The lab drives STDiT3's own `attn_replace`
hook: at a cache step the donor latent goes through the model once (its own caption, the live step's timestep;
the hook keeps each patched block's k/v), then the live [cond; uncond] batch runs with the cond rows attending to
those K/V (`borrowed_attention`: the product's `kv.combine_kv`, then the lab's strength blend). `PACK` (block 0,
replace, matched sigma, the default cache steps) is exactly the product's hit (`tests/test_quality_lab.py` checks
it against `ChaiPipeline`).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import numpy as np
import torch
from torch import Tensor

from comfyui_chai.chai_attention.config import ChaiConfig
from comfyui_chai.chai_attention.kv import chunk_row_mask, combine_kv
from comfyui_chai.opensora.sampler import make_noise, opensora_model_kwargs, sample
from comfyui_chai.toyworld.model import DEFAULT_CFG, ToyVideoSpec, toy_sigmas
from comfyui_chai.toyworld.prompts import Combo, caption, seeded_prefix
from lab.quality import cache_steps_for, is_one_entity_donor

RELATIONS: tuple[str, ...] = ("scene", "object", "none", "same")
# Drawn after the others from a second generator, so adding it changed no earlier donor: the same object and scene
# in another colour (what the product's "main subject and scene matched" also accepts).
EXTRA_RELATIONS: tuple[str, ...] = ("subject_scene",)
FULL_STEPS = 30


def differs_everywhere(a: Combo, b: Combo) -> bool:
    """True when two combinations share no attribute."""
    return all(x != y for x, y in zip(a, b))


def pick_donor(combo: Combo, relation: str, pool: Sequence[Combo], rng: np.random.Generator) -> Combo:
    """A donor combination of the given relation to `combo` (from `pool`, except "same")."""
    if relation == "same":
        return combo
    if relation == "subject_scene":
        candidates = sorted(c for c in pool if c[0] == combo[0] and c[1] == combo[1] and c[2] != combo[2])
    elif relation == "none":
        candidates = sorted(c for c in pool if differs_everywhere(combo, c))
    elif relation in ("scene", "object"):
        candidates = sorted(c for c in pool if is_one_entity_donor(combo, c, relation))
    else:
        raise ValueError(f"relation must be one of {RELATIONS + EXTRA_RELATIONS}, got {relation!r}")
    if not candidates:
        raise ValueError(f"no {relation} donor for {combo} in the pool")
    return tuple(candidates[int(rng.integers(len(candidates)))])  # type: ignore[return-value]


@dataclass(frozen=True)
class Request:
    """A caption, its combination and its noise seed."""

    prompt: str
    combo: Combo
    seed: int


@dataclass
class LabItem:
    """One held-out prompt and its donors by relation."""

    request: Request
    donors: dict[str, Request]


def make_lab_items(held_out: Sequence[Combo], pool: Sequence[Combo], n: int | None = None,
                   seed: int = 0) -> list[LabItem]:
    """n held-out prompts (seeded order) with one donor per relation; prompt seeds 1000 + i, donors 5000 + 4 i + k."""
    rng, extra = np.random.default_rng(seed), np.random.default_rng(seed + 7919)
    items = []
    for i, combo in enumerate(seeded_prefix(held_out, n, rng)):
        req = Request(caption(combo, rng), combo, 1000 + i)  # type: ignore[arg-type]
        donors = {}
        for k, rel in enumerate(RELATIONS):
            d = pick_donor(combo, rel, pool, rng)  # type: ignore[arg-type]
            donors[rel] = Request(caption(d, rng), d, 5000 + 4 * i + k)
        for k, rel in enumerate(EXTRA_RELATIONS):
            d = pick_donor(combo, rel, pool, extra)  # type: ignore[arg-type]
            donors[rel] = Request(caption(d, extra), d, 9000 + len(EXTRA_RELATIONS) * i + k)
        items.append(LabItem(req, donors))
    return items


@dataclass(frozen=True)
class Variant:
    """How a CHAI condition borrows (see the module docstring); cache_steps None: the default for N."""

    name: str
    cache_steps: tuple[int, ...] | None = None
    kv_mode: str = "replace"
    blocks: tuple[int, ...] = (0,)
    source: str = "matched"  # "matched": donor latent at the nearest sigma; "clean": the donor's final latent
    fusion: bool = False  # scene donor + object donor K/V concatenated (the relation is then "fusion")
    strength: float = 1.0  # blend of the borrowed attention output with the block's own (1: the paper's)
    of_eight: bool = False  # cache_steps are steps of the 8-step schedule, mapped to N by their sigmas

    def steps_for(self, n: int) -> tuple[int, ...]:
        """Cache steps at N fast steps: the variant's (those within N, or mapped from 8 steps by sigma) or the
        paper's sigma range (2,3,4 of 8)."""
        if self.cache_steps is None:
            return cache_steps_for(toy_sigmas(n), toy_sigmas(8))
        if self.of_eight:
            if any(not 1 <= s <= 8 for s in self.cache_steps):
                raise ValueError(f"steps of 8 must lie in 1..8, got {self.cache_steps}")
            return steps_at_sigmas([float(toy_sigmas(8)[s - 1]) for s in self.cache_steps], toy_sigmas(n).tolist())
        return tuple(s for s in self.cache_steps if s <= n)


def steps_at_sigmas(targets: Sequence[float], sigmas: Sequence[float]) -> tuple[int, ...]:
    """1-based steps (never the first) of a schedule whose sigma is nearest each target; ties go to the later step."""
    if len(sigmas) <= 2:  # one step: only the first, which never borrows
        return ()
    steps = set()
    for target in targets:
        dist = [abs(sigmas[i] - target) - 1e-9 * i for i in range(1, len(sigmas) - 1)]
        steps.add(int(np.argmin(dist)) + 2)
    return tuple(sorted(steps))


DEFAULT = Variant("default")  # the paper's setting: cache steps over the sigmas of steps 2-4 of 8
PACK = Variant("pack", ChaiConfig().cache_steps, of_eight=True)  # the pack's default cache steps, mapped by sigma


@dataclass
class DonorRun:
    """A donor's full run: the latent entering each step, the step sigmas, the final latent and its caption."""

    latents: list[Tensor]
    sigmas: list[float]
    final: Tensor
    y: Tensor
    mask: Tensor | None
    noise: Tensor | None = None  # the initial noise the run started from (sigma 1)

    def latent_for(self, sigma: float, source: str) -> tuple[Tensor, float]:
        """(donor latent, its timestep sigma) serving a live step at `sigma`."""
        if source == "clean":
            return self.final, 0.0
        i = int(np.argmin([abs(s - sigma) for s in self.sigmas]))
        return self.latents[i], sigma


@dataclass
class LabSampler:
    """Plain and CHAI sampling of the toy model with the reference Euler sampler and batched CFG."""

    model: Any
    text_encode: Callable[[str], Any]
    cfg: float = DEFAULT_CFG
    video: ToyVideoSpec = field(default_factory=ToyVideoSpec)
    full_steps: int = FULL_STEPS  # the donors' (the miss's) step count

    def _kwargs(self, mask: Tensor | None) -> dict[str, Any]:
        v = self.video
        return opensora_model_kwargs(v.height, v.width, v.num_frames, 1, v.fps, mask, "cpu")

    def _text(self, prompt: str) -> tuple[Tensor, Tensor | None]:
        out = self.text_encode(prompt)
        return out if isinstance(out, tuple) else (out, None)

    def noise(self, req: Request) -> Tensor:
        """The request's initial noise (from its seed)."""
        return make_noise(self.video.latent_shape(1), req.seed)

    @torch.no_grad()
    def run(self, req: Request, steps: int, wrap: Callable[[Any], Any] | None = None,
            record: list[Tensor] | None = None, start: Tensor | None = None,
            sigmas: Sequence[float] | None = None, solver: str = "euler",
            history: tuple[Tensor, float] | None = None) -> Tensor:
        """The final latent of `req` at `steps` steps (or on `sigmas` from `start`); `wrap` may replace the model
        function (for CHAI), `record` keeps the latent entering each step."""
        y, mask = self._text(req.prompt)
        x = self.noise(req) if start is None else start
        fn = wrap(self.model) if wrap else self.model
        callback = (lambda i, x, s, v: record.append(x.clone())) if record is not None else None
        uncond = self.model.null_caption(1) if self.cfg != 1.0 else None
        schedule = toy_sigmas(steps) if sigmas is None else torch.as_tensor(list(sigmas), dtype=torch.float64)
        return sample(fn, x, y, uncond, schedule, self.cfg, callback, self._kwargs(mask), solver=solver,
                      history=history)

    def velocity(self, req: Request) -> Callable[[Tensor, float], Tensor]:
        """v(x, sigma): the guided velocity of `req` at one point (one batched model evaluation through the
        sampler's own CFG path: one Euler step whose callback keeps v)."""
        y, mask = self._text(req.prompt)
        uncond = self.model.null_caption(1) if self.cfg != 1.0 else None

        def v(x: Tensor, sigma: float) -> Tensor:
            kept: list[Tensor] = []
            with torch.no_grad():
                sample(self.model, x, y, uncond, [float(sigma), 0.0], self.cfg,
                       lambda i, xx, s, vv: kept.append(vv), self._kwargs(mask))
            return kept[0]
        return v

    def donor(self, req: Request) -> DonorRun:
        """The donor's full run (`full_steps` steps) with its trajectory."""
        latents: list[Tensor] = []
        final = self.run(req, self.full_steps, record=latents)
        y, mask = self._text(req.prompt)
        return DonorRun(latents, toy_sigmas(self.full_steps)[:-1].tolist(), final, y, mask, self.noise(req))

    @torch.no_grad()
    def donor_kv(self, donor: DonorRun, sigma: float, variant: Variant) -> dict[int, tuple[Tensor, Tensor]]:
        """K/V of each patched block for the donor at a live step's sigma (one forward of the donor latent)."""
        latent, t_sigma = donor.latent_for(sigma, variant.source)
        kept: dict[int, tuple[Tensor, Tensor]] = {}

        def keep(block: int) -> Callable[[Any], Tensor]:
            def fn(call: Any) -> Tensor:
                kept[block] = (call.k, call.v)
                return call.block.attn.attend(call.q, call.k, call.v)
            return fn

        t = torch.full((1,), t_sigma * 1000.0)
        self.model(latent, t, donor.y, attn_replace={("spatial_attn", b): keep(b) for b in variant.blocks},
                   **self._kwargs(donor.mask))
        return kept

    def chai(self, req: Request, steps: int, donors: Sequence[DonorRun], variant: Variant,
             start: Tensor | None = None, sigmas: Sequence[float] | None = None,
             cache_steps: Sequence[int] | None = None) -> tuple[Tensor, list[int]]:
        """CHAI at `steps` fast steps borrowing from `donors` (two for fusion); returns (latent, fired steps).
        With `sigmas` (and `start`): on that schedule at its 1-based `cache_steps` (a restart's tail)."""
        schedule = toy_sigmas(steps).tolist() if sigmas is None else [float(s) for s in sigmas]
        chosen = variant.steps_for(steps) if cache_steps is None else tuple(cache_steps)
        cache = {schedule[s - 1]: s for s in chosen}
        fired: list[int] = []

        def wrap(model: Any) -> Callable[..., Tensor]:
            def fn(x: Tensor, t: Tensor, y: Tensor, **kw: Any) -> Tensor:
                sigma = float(t.reshape(-1)[0]) / 1000.0
                step = next((s for sig, s in cache.items() if abs(sig - sigma) < 1e-4), None)
                if step is None:
                    return model(x, t, y, **kw)
                kvs = [self.donor_kv(d, sigma, variant) for d in donors]
                fired.append(step)
                replace = {("spatial_attn", b): _borrow([kv[b] for kv in kvs], variant.kv_mode, variant.strength)
                           for b in variant.blocks}
                return model(x, t, y, attn_replace=replace, **kw)
            return fn

        return self.run(req, steps, wrap, start=start, sigmas=sigmas), fired


def borrowed_attention(q: Tensor, k: Tensor, v: Tensor, k_donor: Tensor, v_donor: Tensor,
                       attend: Callable[[Tensor, Tensor, Tensor], Tensor], mode: str, rows: Tensor,
                       strength: float = 1.0) -> Tensor:
    """attend(q, K, V) with the rows marked in `rows` (bool [R]) on the donor's K/V per `mode`.

    Marked rows' outputs are blended with the block's own: own + strength * (borrowed - own), strength in [0, 1]
    (1 is the paper's and the product's); unmarked rows attend to their own k/v as the unpatched block would.
    """
    if not 0.0 <= float(strength) <= 1.0:
        raise ValueError(f"Cache Attention strength must lie in [0, 1], got {strength!r}")
    rows = rows.to(q.device)
    if not bool(rows.any()) or strength == 0.0:
        return attend(q, k, v)
    patched = attend(q[rows], *combine_kv(k[rows], v[rows], k_donor, v_donor, mode))
    if strength != 1.0:
        own_marked = attend(q[rows], k[rows], v[rows]).to(patched.dtype)
        patched = own_marked + float(strength) * (patched - own_marked)
    if bool(rows.all()):
        return patched
    live = ~rows
    own = attend(q[live], k[live], v[live])
    out = patched.new_empty((q.shape[0], *patched.shape[1:]))
    out[rows] = patched
    out[live] = own.to(patched.dtype)
    return out


def _borrow(kvs: Sequence[tuple[Tensor, Tensor]], mode: str, strength: float = 1.0) -> Callable[[Any], Tensor]:
    """attn_replace callable: the cond half (first chunk of the batched CFG; all of it at cfg 1) attends to the
    donors' K/V."""
    k_d = torch.cat([k for k, _ in kvs], dim=-2)
    v_d = torch.cat([v for _, v in kvs], dim=-2)

    def fn(call: Any) -> Tensor:
        chunks = max(1, call.q.shape[0] // k_d.shape[0])  # 2 with CFG (cond, uncond), 1 at cfg 1
        rows = chunk_row_mask([True] + [False] * (chunks - 1), call.q.shape[0], call.q.device)
        return borrowed_attention(call.q, call.k, call.v, k_d, v_d, call.block.attn.attend, mode, rows, strength)
    return fn


__all__ = ["RELATIONS", "EXTRA_RELATIONS", "FULL_STEPS", "Request", "LabItem", "Variant", "DEFAULT", "PACK", "DonorRun", "LabSampler",
           "make_lab_items", "pick_donor", "differs_everywhere", "steps_at_sigmas", "borrowed_attention"]
