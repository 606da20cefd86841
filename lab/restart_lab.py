"""The restart lab's conditions: plain N, CHAI N, latent restarts (with and without the noise swap, with and
without Cache Attention after the restart) and the solver control, each run on one request and its donors.

A restart uses the product's own arithmetic (`chai_attention/restart.py`), so the lab measures what a hit does:
the restart schedule is the `steps`-step tail of the host schedule whose first sigma is nearest the target
(`restart_schedule`); the donor's origin is taken at its full-schedule step nearest the target (`capture_index`,
`origin`); the hit starts from `renoise(origin, request noise, start sigma)` and samples the tail with the new
prompt's conditioning. "no swap" re-noises with the donor's own noise instead (the donor's x(s_r) when the start
sigma is the capture sigma: the control that ignores the request's seed). "both" adds Cache Attention at the
tail's steps nearest the sigmas of the pack's default cache steps (5, 6 of 8: sigmas 0.5 and 0.375).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

from torch import Tensor

from comfyui_chai.chai_attention.config import ChaiConfig
from comfyui_chai.chai_attention.restart import RestartSchedule, capture_index, origin, renoise, restart_schedule
from comfyui_chai.toyworld.model import toy_sigmas
from lab.lab import PACK, DonorRun, LabSampler, Request, steps_at_sigmas
from lab.solvers import ab2, comfy_sampler

CellKey = tuple[str, str, int, str]
# The sigmas of the pack's default cache steps on the 8-step schedule (0.5 and 0.375): where "both" borrows.
BOTH_SIGMAS: tuple[float, ...] = tuple(float(toy_sigmas(8)[s - 1]) for s in ChaiConfig().cache_steps)


@dataclass(frozen=True)
class Condition:
    """One sampling condition: kind "gt", "reference", "plain", "chai", "restart" or "solver"."""

    kind: str
    steps: int = 0
    relation: str = "-"
    sigma: float = 0.0  # restart: the target sigma
    swap: bool = True  # restart: re-noise with the request's noise (False: the donor's own)
    both: bool = False  # restart: then Cache Attention at the pack's cache sigmas
    solver: str = "-"  # solver: "ab2" or a ComfyUI sampler name; restart: "dpmpp_2m" samples the tail with it
    history: bool = False  # restart with dpmpp_2m: the donor's origin is the solver's previous denoised estimate

    @property
    def key(self) -> CellKey:
        """The cell key (kind, relation, steps, variant) of the lab's tables."""
        if self.kind == "restart":
            variant = f"{self.sigma:.2f}" + ("" if self.swap else " noswap") + (" both" if self.both else "")
            variant += "" if self.solver == "-" else f" {self.solver}"
            variant += " hist" if self.history else ""
        elif self.kind == "chai":
            variant = PACK.name
        elif self.kind == "solver":
            variant = self.solver
        else:
            variant = "-"
        return (self.kind, self.relation, self.steps, variant)

    @property
    def deterministic_in_seed(self) -> bool:
        """True when the request's seed cannot change the output (a restart without the noise swap)."""
        return self.kind == "restart" and not self.swap


def restart_plan(target: float, steps: int, full_steps: int) -> tuple[RestartSchedule, int, float]:
    """(restart schedule on the toy schedule, donor capture index, capture sigma) of a restart."""
    plan = restart_schedule(toy_sigmas, target, steps)
    full = toy_sigmas(full_steps).tolist()
    index = capture_index(full, target)
    return plan, index, float(full[index])


def restart_start(donor: DonorRun, request_noise: Tensor, target: float, steps: int,
                  swap: bool = True) -> tuple[Tensor, RestartSchedule, tuple[Tensor, float]]:
    """(start latent, restart schedule, history) of a restart hit from `donor` (its trajectory on its own full
    schedule); the history is the origin as a denoised estimate at the donor's sigma before the capture step."""
    plan, index, s_cap = restart_plan(target, steps, len(donor.sigmas))
    if donor.noise is None:
        raise ValueError("the donor run kept no initial noise")
    o = origin(donor.latents[index], donor.noise, s_cap)
    return renoise(o, request_noise if swap else donor.noise, plan.start_sigma), plan, (o, float(donor.sigmas[index - 1]))


def run_condition(sampler: LabSampler, cond: Condition, req: Request,
                  donors: Mapping[str, DonorRun]) -> tuple[Tensor, list[int], int]:
    """(final latent, fired cache steps, model evaluations per CFG branch) of one condition on one request."""
    if cond.kind in ("reference", "plain"):
        return sampler.run(req, cond.steps), [], cond.steps
    if cond.kind == "chai":
        latent, fired = sampler.chai(req, cond.steps, [donors[cond.relation]], PACK)
        return latent, fired, cond.steps
    if cond.kind == "restart":
        start, plan, history = restart_start(donors[cond.relation], sampler.noise(req), cond.sigma, cond.steps,
                                             cond.swap)
        if not cond.both:
            solver = "euler" if cond.solver == "-" else cond.solver
            return sampler.run(req, plan.steps, start=start, sigmas=plan.sigmas, solver=solver,
                               history=history if cond.history else None), [], plan.steps
        cache = steps_at_sigmas(BOTH_SIGMAS, list(plan.sigmas))
        latent, fired = sampler.chai(req, plan.steps, [donors[cond.relation]], PACK, start=start,
                                     sigmas=plan.sigmas, cache_steps=cache)
        return latent, fired, plan.steps
    if cond.kind == "solver":
        sigmas = toy_sigmas(cond.steps).tolist()
        if cond.solver == "dpmpp_2m":  # the reference sampler's own (equal to ComfyUI's: tier 2 checks it)
            return sampler.run(req, cond.steps, solver="dpmpp_2m"), [], cond.steps
        if cond.solver == "ab2":
            return ab2(sampler.velocity(req), sampler.noise(req), sigmas), [], cond.steps
        latent, calls = comfy_sampler(cond.solver, sampler.velocity(req), sampler.noise(req), sigmas)
        return latent, [], calls
    raise ValueError(f"no sampling for condition kind {cond.kind!r}")


__all__ = ["Condition", "CellKey", "BOTH_SIGMAS", "restart_plan", "restart_start", "run_condition"]
