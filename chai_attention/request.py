"""The one CHAI request plan, shared by the pure-torch pipeline, CHAI Sampler and CHAI Apply (comfy/prepare.py).

A lookup's `CacheHit` decides the run: a usable hit samples the fast schedule with a Cache Attention run, anything
else (a miss, no lookup, a hit for another model or shape, donors the adapter refuses) the full schedule with a
donor-capture plan. The same functions write the report before and after sampling (`plan_request`, then the host
samples, then `finish_fast` / `finish_full` and `trace_for`), and `cache_io.write_trace` decides what a finished run
stores.

Where a reuse mode plugs in: a new way to serve a hit (for example restarting from the donor's latent at an
intermediate sigma instead of sampling the fast schedule from noise) is a third branch of `plan_request`, decided
from the hit and the config like FAST, with its own `RequestPlan.mode`; the hosts then sample `plan.schedule` as
they do today.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from .config import ChaiConfig
from .constants import FAST, FULL
from .donors import DonorCapture, DonorSet
from .payloads import CacheHit, ChaiReport, SampleTrace
from .run import CacheAttentionRun
from .steps import CapturePlan, as_sigmas, plan_for_config

log = logging.getLogger(__name__)

Schedule = Callable[[int], Any]  # steps -> sigmas (a tensor or a sequence of N + 1 floats)


def format_sigmas(sigmas: Sequence[float]) -> str:
    """Sigmas as a short comma-separated list for reports."""
    return ", ".join(f"{float(s):.4f}" for s in sigmas)


@dataclass
class RequestPlan:
    """What one request samples: FAST with a Cache Attention run, or FULL with a donor-capture plan."""

    mode: str
    schedule: Any  # the sigmas as the schedule function returned them (ComfyUI samples from this object)
    sigmas: tuple[float, ...]
    report: ChaiReport
    run: CacheAttentionRun | None = None
    capture: CapturePlan | None = None

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
    run = run_cls(config, fast_sigmas, hit.donors)
    try:
        adapter.check_run(run, tuple(shape))
    except ValueError as exc:
        run.release()
        return None, str(exc)
    return run, None


def plan_request(hit: CacheHit | None, *, fingerprint: str, shape: Sequence[int], config: ChaiConfig,
                 adapter: Any, schedule: Schedule,
                 run_cls: type[CacheAttentionRun] = CacheAttentionRun) -> RequestPlan:
    """Decide the run of one request: fast on a usable hit, else full (an unusable hit says why in the report).

    This is the one place a run's mode is chosen; a new reuse mode is one more branch here (see the module note).
    """
    report = start_report(hit, config)
    fast_raw = schedule(config.fast_steps)
    fast = as_sigmas(fast_raw)
    run, why = usable_run(hit, fingerprint, shape, config, adapter, fast, run_cls)
    if run is not None:
        report.mode, report.steps, report.cache_steps = FAST, config.fast_steps, config.cache_steps
        return RequestPlan(FAST, fast_raw, fast, report, run=run)
    if why is not None and hit is not None and hit.hit:
        report.hit_unusable = True
        report.reason = f"the cached entry could not be used ({why}); sampling the full schedule"
        report.lookup += f" (unusable: {why})"
    full_raw = schedule(config.full_steps)
    full = as_sigmas(full_raw)
    return RequestPlan(FULL, full_raw, full, report, capture=plan_for_config(full, fast, config))


def finish_fast(plan: RequestPlan) -> None:
    """Record in the report which cache steps fired; warn when a configured one never did."""
    run, report = plan.run, plan.report
    if run is None:
        raise ValueError(f"finish_fast needs a fast plan with its Cache Attention run, not a {plan.mode} one")
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
    return donors, problem


def trace_for(plan: RequestPlan, hit: CacheHit | None, *, fingerprint: str, shape: Sequence[int],
              config: ChaiConfig, sampler_name: str, scheduler: str, donors: DonorSet | None = None,
              capture_problem: str = "") -> SampleTrace:
    """The CHAI_TRACE of a finished run (what the cache write decides on)."""
    run = plan.run
    donor_entry, donor_cache = None, None
    if run is not None:  # a fast run: it refreshes its donor's recency on the write
        if hit is None:
            raise ValueError("the trace of a fast run needs the hit it ran with")
        donor_entry, donor_cache = hit.entry_id, hit.cache_root
    return SampleTrace(
        mode=plan.mode, fingerprint=fingerprint, shape=tuple(shape), config=config, sampler_name=sampler_name,
        scheduler=scheduler, sigmas=plan.sigmas, report=plan.report, donors=None if run is not None else donors,
        capture_problem=capture_problem, donor_entry=donor_entry, donor_cache=donor_cache,
        fired_steps=run.fired_steps if run is not None else (), firings=tuple(run.firings) if run is not None else ())
