"""The one CHAI request plan, shared by the pure-torch pipeline, CHAI Sampler and CHAI Apply (comfy/prepare.py).

A lookup's `CacheHit` decides the run: a usable hit samples the fast schedule with a Cache Attention run, anything
else (a miss, no lookup, a hit for another model or shape, donors the adapter refuses) the full schedule with a
donor-capture plan. The same functions write the report before and after sampling (`plan_request`, then the host
samples, then `finish_fast` / `finish_full` and `trace_for`), and `cache_io.write_trace` decides what a finished run
stores.

A usable hit is served in one of the reuse modes (`choose_reuse`): a restart (restart.py: the hosts start the
fast schedule's tail at the donor's origin, re-noised with the request's own noise), Cache Attention (the paper's,
from noise), or both. A restart is taken only when the entry kept an origin near the configured sigma and the
donor shares the request's scene: in the quality lab a restart from a donor of another scene carried that scene
over (docs/quality-lab.md); such a hit falls back to Cache Attention, and the report says why.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from typing import Any, Callable, Sequence

from torch import Tensor

from .config import ChaiConfig
from .constants import BOTH, CACHE_ATTENTION, FAST, FULL, RESTART
from .donors import DonorCapture, DonorSet
from .payloads import CacheHit, ChaiReport, SampleTrace
from .restart import (MIN_RESTART_FULL_STEPS, RestartSchedule, capture_index, few_step, few_step_tail,
                      restart_schedule, serves, started_from_noise)
from .run import CacheAttentionRun
from .steps import CapturePlan, as_sigmas, plan_for_config

log = logging.getLogger(__name__)

Schedule = Callable[[int], Any]  # steps -> sigmas (a tensor or a sequence of N + 1 floats)


def format_sigmas(sigmas: Sequence[float]) -> str:
    """Sigmas as a short comma-separated list for reports."""
    return ", ".join(f"{float(s):.4f}" for s in sigmas)


@dataclass(frozen=True)
class RestartStart:
    """Where a restart hit starts: its schedule's tail on the host schedule and the donor's origin latent."""

    schedule: RestartSchedule
    origin: Tensor  # the donor's origin (restart.py), in the model-input space the capture read it from
    history_sigma: float | None = None  # a few-step restart: the host resumes DPM-Solver++(2M) from the origin here

    @property
    def sigma(self) -> float:
        """The noise level the hit starts at."""
        return self.schedule.start_sigma

    @property
    def history(self) -> tuple[Tensor, float] | None:
        """(the previous denoised estimate, its sigma) a resumed restart's solver starts from, else None."""
        return None if self.history_sigma is None else (self.origin, self.history_sigma)


@dataclass
class RequestPlan:
    """What one request samples: FAST (a hit: a restart and/or a Cache Attention run), or FULL with a capture plan."""

    mode: str
    schedule: Any  # the sigmas as the schedule function returned them (ComfyUI samples from this object)
    sigmas: tuple[float, ...]
    report: ChaiReport
    run: CacheAttentionRun | None = None
    capture: CapturePlan | None = None
    restart: RestartStart | None = None
    reuse: str = ""  # a FAST plan's reuse mode

    @property
    def hit(self) -> bool:
        """Whether the request is served from a donor (FAST)."""
        return self.mode == FAST

    def full_capture(self) -> CapturePlan:
        """The donor-capture plan of a FULL request (ValueError for a FAST one, which captures nothing)."""
        if self.capture is None:
            raise ValueError(f"a {self.mode} request has no donor-capture plan")
        return self.capture


def start_report(hit: CacheHit | None, config: ChaiConfig) -> ChaiReport:
    """The report of a request before it samples (a full run until `plan_request` finds the hit usable)."""
    report = ChaiReport(prompt=hit.prompt if hit else "", mode=FULL, steps=config.full_steps)
    if hit is None:
        report.lookup = "no CHAI_HIT connected: full schedule, donor latents captured"
        report.reason = "no lookup"
        return report
    report.entities, report.lookup, report.reason = hit.entities, hit.report, hit.reason
    if hit.hit:
        report.matches = hit.matches
        report.donor_prompt, report.donor_entry = hit.donor_prompt, hit.entry_id
    return report


def usable_run(hit: CacheHit | None, fingerprint: str, shape: Sequence[int], config: ChaiConfig, adapter: Any,
               fast_sigmas: tuple[float, ...],
               run_cls: type[CacheAttentionRun] = CacheAttentionRun) -> tuple[CacheAttentionRun | None, str | None]:
    """(the Cache Attention run, None) for a hit that can serve this model and latent, else (None, why)."""
    if hit is None:
        return None, None
    why = hit.unusable_reason(fingerprint, tuple(shape))
    if why is not None:
        return None, why
    if hit.donors is None:  # unusable_reason refuses a hit without donors
        raise ValueError("a usable cache hit must carry its donor latents")
    if not len(hit.donors) and config.cache_steps:
        return None, "the cached entry holds no Cache Attention donors, only a restart latent"
    run = run_cls(config, fast_sigmas, hit.donors)
    try:
        adapter.check_run(run, tuple(shape))
    except ValueError as exc:
        run.release()
        return None, str(exc)
    return run, None


def choose_reuse(hit: CacheHit, config: ChaiConfig) -> tuple[str, str]:
    """(the reuse mode a usable hit gets, why when it is not the configured one)."""
    if config.reuse == CACHE_ATTENTION:
        return CACHE_ATTENTION, ""
    origin = hit.donors.origin if hit.donors is not None else None
    few = few_step(config.full_steps)
    if origin is None:
        why = "the cached entry kept no restart latent (stored before restarts, or its run did not start from noise)"
    elif few and not hit.same_prompt:
        why = (f"below {MIN_RESTART_FULL_STEPS} full steps a restart keeps quality only from a donor of the same "
               "prompt (a new seed of it): on the quality lab's distilled model a donor of the same scene, or of the "
               "same subject and scene in another colour, was worse than the model's own run")
    elif not few and not serves(origin.sigma, config.restart_sigma):
        why = (f"the cached entry's restart latent is at sigma {origin.sigma:.3f}, not near restart_sigma "
               f"{config.restart_sigma:g}")
    elif not few and not hit.scene_match:
        why = ("the donor shares the main subject but not the scene (or the prompt names no scene): a restart would "
               "carry the donor's scene over, so it borrows attention only")
    else:
        return config.reuse, ""
    return CACHE_ATTENTION, why


def _restart_start(hit: CacheHit, config: ChaiConfig, schedule: Schedule) -> tuple[RestartStart, Any]:
    """The restart's start and its schedule as the schedule function returns it (a slice of schedule(T))."""
    origin = hit.donors.origin if hit.donors is not None else None
    if origin is None:
        raise ValueError("a restart needs the donor's origin")
    if few_step(config.full_steps):  # the model's own schedule from the origin's step, resuming the donor's solver
        raw = schedule(config.full_steps)
        tail, history_sigma = few_step_tail(as_sigmas(raw), origin.sigma)
        return RestartStart(tail, origin.latent, history_sigma), raw[tail.start_step:]
    tail = restart_schedule(schedule, origin.sigma, config.fast_steps)
    raw = schedule(tail.total)
    return RestartStart(tail, origin.latent), raw[tail.start_step:]


def reuse_note(mode: str, plan_sigmas: Sequence[float], config: ChaiConfig, why: str,
               restart: RestartStart | None) -> str:
    """The report's line on a hit: the mode, where it starts, why, and the model evaluations it saves."""
    steps = len(plan_sigmas) - 1
    if restart is not None:
        head = (f"{mode}: from the donor's latent at sigma {restart.sigma:.3f} ({steps} steps of the "
                f"{restart.schedule.total}-step schedule from step {restart.schedule.start_step + 1})"
                + (", sampled with DPM-Solver++(2M) resuming the donor's history (a few-step model)"
                   if restart.history_sigma is not None else "")
                + (f" ({why})" if why else ""))
    else:
        head = f"{mode}: {steps} steps from noise" + (f" ({why})" if why else "")
    saved = config.full_steps - steps
    return (f"{head}; {steps} model evaluations per CFG branch against the miss's {config.full_steps} "
            f"({saved} saved, {config.full_steps / steps:.2f}x)")


def plan_request(hit: CacheHit | None, *, fingerprint: str, shape: Sequence[int], config: ChaiConfig,
                 adapter: Any, schedule: Schedule,
                 run_cls: type[CacheAttentionRun] = CacheAttentionRun) -> RequestPlan:
    """Decide the run of one request: fast on a usable hit (in its reuse mode), else full (an unusable hit says
    why in the report). This is the one place a run's mode is chosen."""
    report = start_report(hit, config)
    fast_raw = schedule(config.fast_steps)
    fast = as_sigmas(fast_raw)
    why = hit.unusable_reason(fingerprint, tuple(shape)) if hit is not None else None
    if hit is not None and why is None:
        mode, fallback = choose_reuse(hit, config)
        restart, raw = None, fast_raw
        if mode in (RESTART, BOTH):
            try:
                restart, raw = _restart_start(hit, config, schedule)
            except ValueError as exc:  # a schedule with no tail to start from (a sampler that reshapes it)
                mode, fallback = CACHE_ATTENTION, f"no restart on this schedule: {exc}"
        if mode == CACHE_ATTENTION and fallback and not config.cache_steps:
            why = f"{fallback}, and no cache steps are set to borrow attention at"  # a plain fast run reuses nothing
        sigmas = as_sigmas(raw)
        run = None
        if why is None and mode in (CACHE_ATTENTION, BOTH):
            run, why = usable_run(hit, fingerprint, shape, config, adapter, sigmas, run_cls)
            if why is not None and mode == BOTH:  # the restart needs nothing of the adapter
                mode, fallback, why = RESTART, f"no Cache Attention after it: {why}", None
        if why is None:
            report.mode, report.steps, report.reuse = FAST, len(sigmas) - 1, mode
            report.cache_steps = config.cache_steps if run is not None else ()
            report.reuse_note = reuse_note(mode, sigmas, config, fallback, restart)
            return RequestPlan(FAST, raw, sigmas, report, run=run, restart=restart, reuse=mode)
    if why is not None and hit is not None and hit.hit:
        report.hit_unusable = True
        report.reason = f"the cached entry could not be used ({why}); sampling the full schedule"
        report.lookup += f" (unusable: {why})"
    full_raw = schedule(config.full_steps)
    full = as_sigmas(full_raw)
    return RequestPlan(FULL, full_raw, full, report, capture=full_capture_plan(full, fast, config))


def full_capture_plan(full: tuple[float, ...], fast: tuple[float, ...], config: ChaiConfig) -> CapturePlan:
    """A miss's capture: the Cache Attention donors and, when the run starts from noise, the restart origin."""
    plan = plan_for_config(full, fast, config)
    index = capture_index(full, config.restart_sigma)
    if not started_from_noise(full) or not 0.0 < full[index] < 1.0:
        return plan
    return replace(plan, origin_index=index, origin_sigma=full[index])


def finish_fast(plan: RequestPlan) -> None:
    """Record in the report which cache steps fired; warn when a configured one never did."""
    run, report = plan.run, plan.report
    if plan.mode != FAST:
        raise ValueError(f"finish_fast needs a fast plan, not a {plan.mode} one")
    if run is None:  # a restart without Cache Attention
        report.attention = f"restart at sigma {plan.restart.sigma:.3f}, no Cache Attention" if plan.restart else ""
        return
    report.fired_steps = run.fired_steps
    report.attention = run.summary()
    if set(run.fired_steps) != set(run.config.cache_steps):
        log.warning("[CHAI] %s", report.attention)


def finish_full(plan: RequestPlan, capture: DonorCapture) -> tuple[DonorSet | None, str]:
    """The captured donors (None when incomplete) and the capture problem; both recorded in the report."""
    problem = capture.problem()
    donors = None if problem else capture.donors()
    plan.report.attention = (f"captured {len(donors)} donor latents at sigmas {format_sigmas(donors.sigmas)}"
                             if donors is not None else f"capture incomplete: {problem}")
    if donors is not None and donors.origin is not None:
        plan.report.attention += f" and the restart origin at sigma {donors.origin.sigma:.4f}"
    return donors, problem


def trace_for(plan: RequestPlan, hit: CacheHit | None, *, fingerprint: str, shape: Sequence[int],
              config: ChaiConfig, sampler_name: str, scheduler: str, donors: DonorSet | None = None,
              capture_problem: str = "") -> SampleTrace:
    """The CHAI_TRACE of a finished run (what the cache write decides on)."""
    run = plan.run
    donor_entry, donor_cache = None, None
    if plan.mode == FAST:  # a fast run: it refreshes its donor's recency on the write
        if hit is None:
            raise ValueError("the trace of a fast run needs the hit it ran with")
        donor_entry, donor_cache = hit.entry_id, hit.cache_root
    return SampleTrace(
        mode=plan.mode, fingerprint=fingerprint, shape=tuple(shape), config=config, sampler_name=sampler_name,
        scheduler=scheduler, sigmas=plan.sigmas, report=plan.report, donors=None if plan.mode == FAST else donors,
        capture_problem=capture_problem, donor_entry=donor_entry, donor_cache=donor_cache,
        fired_steps=run.fired_steps if run is not None else (), firings=tuple(run.firings) if run is not None else ())
