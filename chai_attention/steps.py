"""Step selection: which sampler evaluation is a cache step, which sigmas a full run captures, which donor serves.

Schedules are the sampler's sigma list: N + 1 strictly decreasing values, step i (0-based) starting at sigmas[i]
and the last entry (usually 0) the end point, never evaluated. The cache steps of `ChaiConfig` are 1-based.

Matching a sampler's sigma to a step. A model evaluation belongs to step i when its sigma is within
`SIGMA_ATOL + SIGMA_RTOL * sigmas[i]` of sigmas[i] (the nearest step wins). Float32 rounding of a sigma, or of
the timestep 1000 * sigma and back, moves it by about 1e-7 relative, far inside the 1e-4 tolerance, while
neighbouring steps of practical schedules (up to about a thousand steps) lie more than twice the tolerance apart;
an evaluation at a step's own sigma always maps to that step, since the nearest step wins. A sigma that matches no
step is never a cache step. That makes the supported samplers:

* one evaluation per step, at the step's sigma: the reference Euler sampler (`opensora.sampler.sample`) and
  ComfyUI's euler, euler_ancestral, dpmpp_2m, dpmpp_2m_sde, dpmpp_3m_sde, lms, ipndm, deis, ddim and lcm:
  cache attention runs exactly at the cache steps;
* two evaluations per step: the midpoint evaluation of dpm2, dpm2_ancestral, dpmpp_2s_ancestral and dpmpp_sde
  sits between two schedule sigmas and never uses cache attention; heun's corrector is evaluated at
  sigma[i + 1], the next step's own noise level, so it counts as that step (cache attention runs there when
  step i + 2, 1-based, is a cache step). Matching is by noise level, never by call count.

Any other sampler follows the same rule: cache attention runs wherever the model is evaluated at a cache step's
sigma, and nowhere else.

A bf16-rounded sigma (about 4e-3 relative) would match nothing: such a run would simply never fire, which the run
state reports (see `CacheAttentionRun.summary`).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Sequence

from .config import ChaiConfig
from .constants import DONOR_MAPPINGS

SIGMA_RTOL = 1e-4
SIGMA_ATOL = 1e-6


def as_sigmas(sigmas: Any) -> tuple[float, ...]:
    """A validated schedule (python floats): at least two entries, finite, strictly decreasing."""
    values = tuple(float(s) for s in (sigmas.reshape(-1).tolist() if hasattr(sigmas, "tolist") else sigmas))
    if len(values) < 2:
        raise ValueError("a schedule needs at least two sigmas (start and end)")
    if not all(math.isfinite(v) for v in values):
        raise ValueError("schedule sigmas must be finite")
    if any(b >= a for a, b in zip(values, values[1:])):
        raise ValueError("schedule sigmas must be strictly decreasing")
    return values


def first_value(value: Any) -> float | None:
    """The first element of a sigma tensor or sequence (ComfyUI's transformer_options["sigmas"]), None if empty."""
    if value is None:
        return None
    if hasattr(value, "reshape"):
        return float(value.reshape(-1)[0].item()) if value.numel() else None
    if isinstance(value, (int, float)):
        return float(value)
    return float(value[0]) if len(value) else None


def options_sigma(options: Any) -> float | None:
    """The sigma of the model evaluation that carries these transformer_options (None when absent)."""
    return first_value((options or {}).get("sigmas"))


def match_step(sigma: float, sigmas: Sequence[float], rtol: float = SIGMA_RTOL,
               atol: float = SIGMA_ATOL) -> int | None:
    """0-based step whose starting sigma equals `sigma` within tolerance (nearest wins), else None."""
    sigma = float(sigma)
    if not math.isfinite(sigma):
        return None
    starts = sigmas[:-1]
    best = min(range(len(starts)), key=lambda i: abs(float(starts[i]) - sigma), default=None)
    if best is None:
        return None
    ref = float(starts[best])
    return best if abs(ref - sigma) <= atol + rtol * abs(ref) else None


def nearest_index(values: Sequence[float], target: float) -> int:
    """Index of the value closest to target (the first one on a tie)."""
    if not values:
        raise ValueError("no values to choose from")
    return min(range(len(values)), key=lambda i: abs(float(values[i]) - float(target)))


class CacheStepSelector:
    """Tells, for a sampler sigma, which step of a schedule it is and whether that step is a cache step."""

    def __init__(self, sigmas: Any, cache_steps: Sequence[int], rtol: float = SIGMA_RTOL,
                 atol: float = SIGMA_ATOL) -> None:
        self.sigmas = as_sigmas(sigmas)
        self.rtol, self.atol = rtol, atol
        self.cache_steps = tuple(sorted(set(int(s) for s in cache_steps)))
        bad = [s for s in self.cache_steps if not 1 <= s <= self.n_steps]
        if bad:
            raise ValueError(f"cache steps {bad} are outside the schedule's 1..{self.n_steps} steps")

    @property
    def n_steps(self) -> int:
        """Number of steps (sigmas minus the end point)."""
        return len(self.sigmas) - 1

    def step_of(self, sigma: float) -> int | None:
        """0-based step index of an evaluation at `sigma`, or None when it is on no step."""
        return match_step(sigma, self.sigmas, self.rtol, self.atol)

    def cache_step_of(self, sigma: float) -> int | None:
        """1-based cache step number when `sigma` is a cache step's sigma, else None."""
        step = self.step_of(sigma)
        return step + 1 if step is not None and step + 1 in self.cache_steps else None

    def cache_sigmas(self) -> tuple[float, ...]:
        """Starting sigma of each cache step, in cache-step order."""
        return tuple(self.sigmas[s - 1] for s in self.cache_steps)


@dataclass(frozen=True)
class CapturePlan:
    """What a full run records for later fast runs: latents entering `indices` (0-based) and/or the final one."""

    mapping: str
    indices: tuple[int, ...]  # steps of the full schedule whose input latent is kept, ascending
    sigmas: tuple[float, ...]  # their sigmas (the schedule's values)
    final: bool = False  # also keep the sampler's output latent (sigma = the schedule's last value)
    final_sigma: float = 0.0
    # A restart's origin (restart.py): the latent entering this step, less the noise entering step 0 (None: none)
    origin_index: int | None = None
    origin_sigma: float = 0.0

    def wants(self, step: int) -> bool:
        """Whether the latent entering 0-based `step` is kept (a donor, the origin's step, or the first step's noise)."""
        return step in self.indices or (self.origin_index is not None and step in (0, self.origin_index))

    @property
    def count(self) -> int:
        """Number of latents the plan keeps."""
        return len(self.indices) + int(self.final)


def capture_plan(full_sigmas: Any, fast_sigmas: Any, cache_steps: Sequence[int],
                 mapping: str = "matched_sigma") -> CapturePlan:
    """Which latents a full run keeps so that a fast run's cache steps find a donor (see the module docstring).

    matched_sigma: for each cache step of the fast schedule, the full step whose sigma is nearest to it;
    same_index: the full run's own steps with the cache steps' numbers; final_clean: the finished latent.
    """
    if mapping not in DONOR_MAPPINGS:
        raise ValueError(f"donor mapping must be one of {', '.join(DONOR_MAPPINGS)}; got {mapping!r}")
    full = as_sigmas(full_sigmas)
    fast = CacheStepSelector(fast_sigmas, cache_steps)
    starts = full[:-1]
    if mapping == "final_clean":
        return CapturePlan(mapping, (), (), final=True, final_sigma=full[-1])
    if mapping == "same_index":
        indices = sorted({min(s - 1, len(starts) - 1) for s in fast.cache_steps})
    else:
        indices = sorted({nearest_index(starts, s) for s in fast.cache_sigmas()})
    return CapturePlan(mapping, tuple(indices), tuple(starts[i] for i in indices))


def plan_for_config(full_sigmas: Any, fast_sigmas: Any, config: ChaiConfig) -> CapturePlan:
    """`capture_plan` with the config's cache steps and donor mapping."""
    return capture_plan(full_sigmas, fast_sigmas, config.cache_steps, config.donor_mapping)


def select_donor(donor_sigmas: Sequence[float], step_sigma: float, position: int,
                 mapping: str = "matched_sigma") -> int:
    """Index of the donor latent that serves a cache step.

    donor_sigmas: the noise level of each donor latent; step_sigma: the cache step's sigma; position: 0-based
    rank of the cache step among the cache steps. matched_sigma: nearest sigma; same_index: the donors in order of
    decreasing sigma, by rank (the last one when there are fewer); final_clean: the least noisy donor.
    """
    if not donor_sigmas:
        raise ValueError("no donor latents")
    if mapping == "matched_sigma":
        return nearest_index(donor_sigmas, step_sigma)
    order = sorted(range(len(donor_sigmas)), key=lambda i: -float(donor_sigmas[i]))
    if mapping == "same_index":
        return order[min(max(position, 0), len(order) - 1)]
    if mapping == "final_clean":
        return order[-1]
    raise ValueError(f"donor mapping must be one of {', '.join(DONOR_MAPPINGS)}; got {mapping!r}")
