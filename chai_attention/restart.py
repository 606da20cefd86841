"""Latent restart: a hit starts from its donor's latent at an intermediate noise level instead of pure noise.

A miss keeps, beside the Cache Attention donors, its latent at the full-schedule step nearest the restart sigma
s_r with its own initial noise taken out: the restart origin o = (x_donor(s_r) - s_r * eps_donor) / (1 - s_r)
(the donor's straight-line estimate of its clean latent). A hit re-noises it with the request's own noise at the
first sigma s of its restart schedule, x = s * eps_request + (1 - s) * o, which is
x_donor(s_r) + s_r * (eps_request - eps_donor) when s = s_r: the donor's layout, the request's seed (two seeds give
two videos). That is exactly how ComfyUI's flow samplers add noise to a LATENT at sigmas[0] (CONST.noise_scaling),
so CHAI Sampler and CHAI Apply hand the sampler the origin as the LATENT and let it add the seed's noise.

The restart schedule of n steps is the host's own schedule at some T >= n steps from its step k = T - n on,
choosing T so that its sigma there is nearest s_r: KSamplerAdvanced (steps T, start_at_step k) and
SamplerCustomAdvanced (these SIGMAS) sample the same sigmas, and the restart point is a noise level, so it
transfers between schedules (a shift-8 Wan schedule, OpenSora's, LTXV's). The noise must be the flow-matching
kind: x(s) = s * eps + (1 - s) * x0 (every family the pack supports); the origin needs a donor run that started
from pure noise (sigma 1).

A few-step (distilled) model is sampled only at its own schedule's sigmas, so there a restart is the tail of the
full schedule itself, from the step where the origin was stored (`few_step_tail`), and it resumes the donor's
solver: DPM-Solver++(2M) with the origin as the previous denoised estimate, at the schedule's sigma before the
restart (for a donor one Euler or 2M step in, the origin is exactly that estimate). In the quality lab the
resumed restart from a donor of the same prompt beat the student's own 4 Euler steps at 3 and at 2 evaluations;
without the history, or from a donor of the same scene, or of the same subject and scene in another colour, it
did not (docs/quality-lab.md), so the product restarts a few-step model only from the same prompt's entry.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from torch import Tensor

from .steps import as_sigmas, nearest_index

# In the quality lab a same-scene restart beat the 30-step run of the 30-step model, while on the distilled 4-step
# student only the resumed restart from a same-prompt donor kept quality (docs/quality-lab.md): below
# this many full steps a hit restarts the few-step way. Between 4 and 30 nothing was measured; 16 keeps the
# measured 30-step case on the many-step side.
MIN_RESTART_FULL_STEPS = 16
ON_SCHEDULE = 1e-3  # a few-step origin must sit on the run's own schedule (within this)
MAX_TOTAL_FACTOR = 20  # T is searched in n + 1 .. 20 n (a restart at sigma 0.05 would need about 20 n)
START_TOLERANCE = 0.05  # a stored origin serves a restart whose sigma is within this of the origin's
PURE_NOISE = 0.999  # a run whose first sigma is at least this started from pure noise


@dataclass(frozen=True)
class RestartSchedule:
    """The n sigmas a restart samples, and where they sit on the host's schedule of `total` steps."""

    sigmas: tuple[float, ...]  # n + 1 values from the start sigma down to the end
    total: int  # T: KSamplerAdvanced's steps
    start_step: int  # k = T - n: KSamplerAdvanced's start_at_step (0-based)

    @property
    def steps(self) -> int:
        """Model-evaluation steps the restart samples."""
        return len(self.sigmas) - 1

    @property
    def start_sigma(self) -> float:
        """The noise level the restart starts at."""
        return self.sigmas[0]


def restart_schedule(schedule: Callable[[int], Any], target: float, steps: int) -> RestartSchedule:
    """The `steps`-step tail of schedule(T) whose first sigma is nearest `target` (the smallest such T on a tie)."""
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ValueError(f"restart steps must be a positive whole number, got {steps!r}")
    if not 0.0 < float(target) < 1.0:
        raise ValueError(f"the restart sigma must lie in (0, 1), got {target!r}")
    best: RestartSchedule | None = None
    best_gap = math.inf
    for total in range(steps + 1, MAX_TOTAL_FACTOR * steps + 1):
        sigmas = as_sigmas(schedule(total))
        if len(sigmas) != total + 1:
            continue  # a sampler that changes the schedule's length (dpm_2 ...) has no tail to start from
        tail = sigmas[total - steps:]
        gap = abs(tail[0] - float(target))
        if gap < best_gap - 1e-12:
            best, best_gap = RestartSchedule(tail, total, total - steps), gap
        elif tail[0] < float(target):
            break  # the tail's start falls as T grows (a monotone schedule): the gap only widens from here
    if best is None:
        raise ValueError(f"no schedule of {steps + 1} to {MAX_TOTAL_FACTOR * steps} steps has a {steps}-step tail")
    return best


def few_step(full_steps: int) -> bool:
    """Whether a run of this many full steps restarts the few-step (distilled) way."""
    return full_steps < MIN_RESTART_FULL_STEPS


def few_step_tail(full_sigmas: Sequence[float], origin_sigma: float) -> tuple[RestartSchedule, float]:
    """(the full schedule's own tail from the origin's step, the sigma before it: the history's) of a few-step
    restart; ValueError when the origin does not sit on this schedule after its first step."""
    values = [float(s) for s in full_sigmas]
    k = nearest_index(values[:-1], float(origin_sigma))
    if k < 1 or abs(values[k] - float(origin_sigma)) > ON_SCHEDULE:
        raise ValueError(f"the cached restart latent at sigma {float(origin_sigma):.4f} is not on this "
                         f"{len(values) - 1}-step schedule ({', '.join(f'{v:.4f}' for v in values[:-1])})")
    return RestartSchedule(tuple(values[k:]), len(values) - 1, k), values[k - 1]


def capture_index(full_sigmas: Sequence[float], target: float) -> int:
    """The full-schedule step (0-based, never the last point) whose starting sigma is nearest `target`."""
    return nearest_index(list(full_sigmas[:-1]), target)


def started_from_noise(full_sigmas: Sequence[float]) -> bool:
    """Whether a run on this schedule started from pure noise (its latent entering step 0 is the noise)."""
    return float(full_sigmas[0]) >= PURE_NOISE


def origin(x_at_sigma: Tensor, noise: Tensor, sigma: float) -> Tensor:
    """The restart origin of a donor: its latent at `sigma` with its initial noise taken out."""
    if not 0.0 < float(sigma) < 1.0:
        raise ValueError(f"a restart origin needs a sigma in (0, 1), got {sigma!r}")
    return (x_at_sigma - float(sigma) * noise.to(x_at_sigma.dtype)) / (1.0 - float(sigma))


def renoise(origin_latent: Tensor, noise: Tensor, sigma: float) -> Tensor:
    """The restart's start latent: the origin noised to `sigma` with the request's noise (flow-matching)."""
    s = float(sigma)
    return s * noise.to(origin_latent.dtype) + (1.0 - s) * origin_latent


def serves(origin_sigma: float, target: float, tolerance: float = START_TOLERANCE) -> bool:
    """Whether an origin stored at `origin_sigma` can serve a restart aimed at `target`."""
    return abs(float(origin_sigma) - float(target)) <= tolerance + 1e-9


__all__ = ["MIN_RESTART_FULL_STEPS", "few_step", "few_step_tail", "RestartSchedule", "restart_schedule", "capture_index", "started_from_noise", "origin", "renoise",
           "serves", "START_TOLERANCE", "PURE_NOISE"]
