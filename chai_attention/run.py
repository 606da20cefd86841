"""Per-run Cache Attention state, model-agnostic: cache-step decisions, donor choice, donor K/V reuse, a record."""
from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any, Callable, Sequence, TypeVar

from torch import Tensor

from .config import ChaiConfig
from .donors import DonorSet
from .steps import CacheStepSelector

# ComfyUI's transformer_options["cond_or_uncond"] convention: one entry per batch chunk, 0 = cond, 1 = uncond.
COND, UNCOND = 0, 1
BATCHED_CFG: tuple[int, ...] = (COND, UNCOND)  # the reference sampler's [cond; uncond] batch
KV = TypeVar("KV")  # what a step's donor K/V are kept as (hooks: an attention_call.DonorKV)


@dataclass(frozen=True)
class StepPlan:
    """What a cache step does: which step, which donor, and at which sigma the donor is modulated."""

    step: int  # 1-based step of the fast schedule
    position: int  # 0-based rank among the cache steps
    sigma: float  # the schedule's sigma of the step
    donor_index: int
    donor_sigma: float
    donor_latent: Tensor
    modulation_sigma: float  # the step's own sigma, or the donor's (0) for final_clean


@dataclass(frozen=True)
class Firing:
    """One evaluation in which Cache Attention ran."""

    step: int  # 1-based
    sigma: float
    kind: str  # e.g. "spatial" for an STDiT3 spatial block
    index: int  # block index
    rows: int  # attention rows that attended to the donor
    total_rows: int


class CacheAttentionRun:
    """State of one fast run: hand it to an adapter; ask it which evaluations fire and what fired."""

    def __init__(self, config: ChaiConfig, fast_sigmas: Any, donors: DonorSet) -> None:
        self.config = config
        # The schedule the sampler really runs (normally config.fast_steps steps); cache steps must lie inside it.
        self.selector = CacheStepSelector(fast_sigmas, config.cache_steps)
        self.donors = donors
        self.firings: list[Firing] = []
        self.evaluations = 0
        # Ids of the cond entries that are the prompt (a guider's "positive"), when the sampler told us
        # (hooks.GuiderPrompts); then they, not chunk index 0, are the "cond" chunks (DualCFGGuider: index 2).
        self.prompt_ids: frozenset[Any] = frozenset()
        self._kv_key: tuple[Any, ...] | None = None
        self._kv: Any = None
        self._lock = threading.Lock()

    def plan_for(self, sigma: float) -> StepPlan | None:
        """The cache step an evaluation at `sigma` belongs to, or None (not a cache step: attend as usual)."""
        with self._lock:
            self.evaluations += 1
        step = self.selector.cache_step_of(sigma)
        if step is None:
            return None
        position = self.config.cache_steps.index(step)
        step_sigma = self.selector.sigmas[step - 1]
        i = self.donors.select(step_sigma, position, self.config.donor_mapping)
        donor = self.donors.donors[i]
        modulation = donor.sigma if self.config.donor_mapping == "final_clean" else step_sigma
        return StepPlan(step, position, step_sigma, i, donor.sigma, donor.latent, modulation)

    def chunk_flags(self, cond_or_uncond: Sequence[int], ids: Sequence[Any] | None = None) -> list[bool]:
        """Per batch chunk (0 = cond, 1 = uncond): does it attend to the donor under `apply_to`?

        ids: the chunks' cond entry ids (ComfyUI's transformer_options["uuids"]); when the run knows the prompt's
        ids, a chunk is "cond" when its id is one of them, whatever its index.
        """
        if not cond_or_uncond:
            raise ValueError("cond_or_uncond must name at least one batch chunk (0 = cond, 1 = uncond)")
        if self.config.apply_to == "both":
            return [True] * len(cond_or_uncond)
        if self.prompt_ids and ids is not None and len(ids) == len(cond_or_uncond):
            return [i in self.prompt_ids for i in ids]
        return [int(c) == COND for c in cond_or_uncond]

    def donor_kv(self, plan: StepPlan, key: Any, compute: Callable[[], KV]) -> KV:
        """Donor K/V for a step, computed once and reused by every call of that step with the same `key`."""
        full_key = (plan.step, plan.donor_index, plan.modulation_sigma, key)
        with self._lock:
            if self._kv_key == full_key and self._kv is not None:
                return self._kv
        kv = compute()
        with self._lock:
            self._kv_key, self._kv = full_key, kv  # only the latest step is kept: K/V can be large
        return kv

    def record(self, plan: StepPlan, kind: str, index: int, rows: int, total_rows: int) -> None:
        """Note that Cache Attention ran."""
        with self._lock:
            self.firings.append(Firing(plan.step, plan.sigma, kind, index, rows, total_rows))

    @property
    def fired_steps(self) -> tuple[int, ...]:
        """1-based steps at which Cache Attention ran at least once, ascending."""
        return tuple(sorted({f.step for f in self.firings}))

    def reset(self) -> None:
        """Forget the record of firings and evaluations (the same run samples again)."""
        with self._lock:
            self.firings.clear()
            self.evaluations = 0

    def release(self) -> None:
        """Drop the reused donor K/V (call when the run ends)."""
        with self._lock:
            self._kv_key, self._kv = None, None

    def summary(self) -> str:
        """One line for reports: steps that fired against those configured."""
        want = ",".join(map(str, self.config.cache_steps)) or "none"
        got = ",".join(map(str, self.fired_steps)) or "none"
        note = "" if set(self.fired_steps) == set(self.config.cache_steps) else (
            " (some cache steps never fired: was the sampler's schedule the one CHAI was given?)")
        return (f"cache attention at steps {got} of {self.selector.n_steps} (configured {want}); "
                f"{self.config.kv_mode} K/V, {self.config.apply_to} CFG half, {self.config.donor_mapping} donors"
                f"{note}")
