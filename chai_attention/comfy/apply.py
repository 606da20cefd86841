"""CHAI as a MODEL patch for any sampler node (CHAI Apply): a restart and/or Cache Attention on a hit, donor capture
on a miss. A restart hit also hands the sampler the LATENT to start from (the donor's origin: the sampler adds the
seed's noise at the restart sigma) and the start_at_step of its schedule (KSamplerAdvanced).

`chai_apply` decides the request as CHAI Sampler does (`prepare.prepare`) and returns a ModelPatcher *clone*
carrying it (`prepare.patch`): on a usable hit the adapter's public hooks plus the run in
transformer_options[RUN_KEY]; on a miss an APPLY_MODEL wrapper that keeps the model input at the planned sigmas of
the full schedule. The sampler node samples
the schedule `chai_apply` returns (SIGMAS, or its step count for KSampler-style nodes); KSamplerAdvanced step
ranges and two-expert graphs work because steps are matched by sigma. An OUTER_SAMPLE wrapper starts the record
afresh whenever a sampling begins at the schedule's first sigma (a re-queued graph re-uses the patched MODEL) and
times the sampling. `AppliedRun.trace` turns the record into the CHAI_TRACE that CHAI Cache Write stores; with a
cache and the prompt's entities (`store`), the wrapper stores it itself when a sampling ends at sigma 0, so one node
between loader and sampler does the whole request.
ComfyUI glue: imports ComfyUI inside functions only.
"""
from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field, replace
from typing import Any, Mapping, Sequence

import torch
from torch import Tensor

from ..cache_io import write_trace
from ..config import ChaiConfig
from ..constants import CACHE_ATTENTION, WAN22_BOUNDARY
from ..payloads import CacheHit, SampleTrace
from ..request import RequestPlan, Schedule, finish_fast, finish_full, trace_for
from ..steps import match_step
from .capture import ModelInputCapture
from .prepare import patch, prepare
from .resume import resume_sampler
from .sample import restart_latent
from .schedule import prepared_latent

log = logging.getLogger(__name__)

MONITOR_KEY = "chai_apply_monitor"  # OUTER_SAMPLE wrapper key


@dataclass(eq=False)
class AppliedRun:
    """CHAI_APPLIED: one request's plan, bound to the patched MODEL; filled in while a sampler node samples.

    Unlike the other CHAI payloads this one changes after it is built (the record of the sampling); ComfyUI
    hands the same object to CHAI Apply Trace, which reads it after the sampler node ran.
    """

    plan: RequestPlan
    hit: CacheHit | None
    fingerprint: str
    shape: tuple[int, ...]
    config: ChaiConfig
    sampler_name: str
    scheduler: str
    capture: ModelInputCapture | None = None  # on a miss
    switch_step: int = 0
    latent_in: Any = None  # the model's process_latent_in: a sampler's output LATENT -> the model-input space
    start_latent: dict[str, Any] | None = None  # a restart hit: the LATENT the sampler must start from
    resumer: Any = None  # a few-step restart hit: the SAMPLER that resumes the donor's solver (resume.py)
    handover: Any = None  # a two-expert restart below the boundary: (model_sampling, process_latent_out) to hand over
    seconds: float = 0.0  # time inside the sampler nodes' sampling, summed
    samplings: int = 0
    problems: list[str] = field(default_factory=list)
    store: tuple[Any, Any] | None = None  # (cache, entities): store the run when a sampling ends at sigma 0
    stored: str = ""  # what that store did, once it ran ('' before)
    _stored_trace: SampleTrace | None = field(default=None, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @property
    def steps(self) -> int:
        """Steps of the schedule to sample (fast on a usable hit, else full)."""
        return len(self.plan.sigmas) - 1

    @property
    def start_at_step(self) -> int:
        """KSamplerAdvanced's start_at_step: where a restart's tail begins on the `total_steps` schedule (else 0)."""
        return self.plan.restart.schedule.start_step if self.plan.restart is not None else 0

    @property
    def total_steps(self) -> int:
        """KSampler / KSamplerAdvanced 'steps': the schedule whose tail from start_at_step is `sigmas()`."""
        return self.plan.restart.schedule.total if self.plan.restart is not None else self.steps

    def sigmas(self) -> Tensor:
        """The schedule as SIGMAS (float32, CPU)."""
        return torch.tensor(self.plan.sigmas, dtype=torch.float32)

    def started(self, sigmas: Tensor, noise: Any = None, latent_image: Any = None) -> None:
        """A sampler begins on `sigmas`: a run from the schedule's first sigma starts the record afresh."""
        values = [float(s) for s in sigmas.reshape(-1).tolist()]
        restart_problem = self._restart_problem(noise, latent_image)
        own = self.plan.sigmas
        fresh = bool(values) and match_step(values[0], own) == 0
        with self._lock:
            if fresh:
                self.seconds, self.samplings = 0.0, 0
                self.problems.clear()
                self.stored = ""
                if self.capture is not None:
                    self.capture.reset()
                if self.plan.run is not None:
                    self.plan.run.reset()
            self.samplings += 1
            if restart_problem:
                self.problems.append(restart_problem)
            unknown = [s for s in values[:-1] if match_step(s, own) is None]
            if unknown:
                self.problems.append(
                    f"the sampler ran sigmas that are not on CHAI's {self.steps}-step schedule ({len(unknown)} of "
                    f"{len(values) - 1}); give the sampler CHAI Apply's steps (or SIGMAS) and the sampler and "
                    "scheduler set on CHAI Apply")

    def redirect(self, latent_image: Any, sigmas: Any) -> tuple[Any, Any]:
        """A restart hit's sampling start: (latent_image, sigmas) the sampler should run.

        A graph that gives the sampler CHAI Apply's SIGMAS (or steps) but not its LATENT, as saved workflows from
        before restarts do, would start the restart's schedule from an empty latent, or run the whole
        `total_steps` schedule from noise: the sampling is redirected to start from the restart LATENT on the
        restart's sigmas (the sampler's own noise is kept). Anything else is left as it is.
        """
        if self.start_latent is None or not isinstance(sigmas, Tensor) or not isinstance(latent_image, Tensor):
            return latent_image, sigmas
        mine = self.start_latent["samples"]
        if tuple(latent_image.shape) != tuple(mine.shape):
            return latent_image, sigmas
        values = [float(s) for s in sigmas.reshape(-1).tolist()]
        tail, start = self.plan.sigmas, self.start_at_step
        if len(values) == self.total_steps + 1 and _same(values[start:], tail):
            sigmas = sigmas[start:]
        elif not _same(values, tail):
            return latent_image, sigmas
        return mine.to(latent_image.device, latent_image.dtype), sigmas

    def hands_over(self, sigmas: Any) -> bool:
        """Whether this sampling is the first expert's share before a two-expert restart that starts below the
        boundary: the schedule's head, from pure noise down to the restart sigma (the restart skips those steps)."""
        if self.handover is None or self.plan.restart is None or not isinstance(sigmas, Tensor):
            return False
        values = [float(s) for s in sigmas.reshape(-1).tolist()]
        tail = self.plan.restart.schedule
        return len(values) == tail.start_step + 1 and abs(values[-1] - tail.start_sigma) < 1e-4

    def handed_over(self, noise: Tensor, latent_image: Tensor) -> Tensor:
        """What the first expert's sampler returns instead of sampling: the restart's start (the origin noised to
        the restart sigma with this seed's noise), as a LATENT with leftover noise, which the second expert's
        sampler (add_noise off, from start_at_step) continues exactly as it would a sampled one."""
        restart = self.plan.restart
        if restart is None or self.handover is None:
            raise ValueError("no two-expert restart to hand over")
        sampling, latent_out = self.handover
        sigma = torch.tensor(restart.sigma, dtype=torch.float32)
        origin = restart.origin.to(noise.device, torch.float32)
        x = sampling.noise_scaling(sigma, noise.to(torch.float32), origin)
        with self._lock:
            self.samplings += 1
            if not bool(noise.any()):
                self.problems.append("the first sampler added no noise to this restart hit: enable add_noise on it "
                                     "(the restart starts from the request's own noise)")
        return latent_out(sampling.inverse_noise_scaling(sigma, x)).to(latent_image.dtype)

    def resumes(self, sigmas: Any) -> bool:
        """Whether this sampling is a few-step restart's tail, which samples with `resumer` whatever sampler the
        node chose (the lab found the resumed solver the only restart that keeps a few-step model's quality)."""
        return (self.resumer is not None and isinstance(sigmas, Tensor)
                and _same([float(s) for s in sigmas.reshape(-1).tolist()], self.plan.sigmas))

    def _restart_problem(self, noise: Any, latent_image: Any) -> str:
        """What is wrong with how a sampler starts a restart hit ('' when nothing is, or it is no restart). Called
        after `redirect`, which starts every sampling on CHAI Apply's schedule from the restart LATENT (a sampling
        on another schedule is reported as such by `started`)."""
        if self.start_latent is None or not isinstance(latent_image, Tensor):
            return ""
        if tuple(latent_image.shape) != tuple(self.start_latent["samples"].shape):
            return ("this restart hit's sampler did not start from CHAI Apply's LATENT output: connect it to the "
                    "sampler's latent (and start_at_step to KSamplerAdvanced), or set reuse to cache_attention")
        if isinstance(noise, Tensor) and not bool(noise.any()):
            return ("the sampler added no noise to this restart hit's LATENT: enable add_noise (the restart "
                    "starts from the request's own noise)")
        return ""

    def add_time(self, seconds: float) -> None:
        with self._lock:
            self.seconds += seconds

    def store_now(self, samples: Any) -> None:
        """Store the finished run (`store` set): what CHAI Apply Trace and CHAI Cache Write would do, never raising
        (the sampler's result must reach the graph whatever the cache does)."""
        if self.store is None or self.stored:
            return
        cache, entities = self.store
        try:
            trace = self._trace(samples if isinstance(samples, Tensor) else None)
            written = write_trace(cache, entities, trace)
            self.stored, self._stored_trace = written.line, trace
        except Exception as exc:  # noqa: BLE001 - a cache that cannot take the entry must not lose the video
            self.stored = f"not stored: {exc}"
            log.warning("[CHAI] apply: the run was not stored: %s", exc)
        log.info("[CHAI] apply stored the run: %s", self.stored)

    def trace(self, samples: Tensor | None = None) -> SampleTrace:
        """The CHAI_TRACE of what sampled so far; `samples` (the final latent) serves the final_clean mapping."""
        if self.stored and self._stored_trace is not None:  # stored by the MODEL: a Cache Write must not store it again
            self.plan.report.write = f"stored by CHAI Apply when the sampler finished: {self.stored}"
            return replace(self._stored_trace, donors=None,
                           capture_problem="CHAI Apply already stored this run when its sampler finished")
        return self._trace(samples)

    def _trace(self, samples: Tensor | None) -> SampleTrace:
        """The trace itself (see `trace`)."""
        plan, report = self.plan, self.plan.report
        donors, problem = None, ""
        if self.capture is not None:
            if samples is not None and self.capture.plan.final and tuple(samples.shape) == self.shape:
                # Donors live in the model-input space the capture reads; a LATENT is in the output space.
                self.capture.observe_final(self.latent_in(samples) if self.latent_in is not None else samples)
            donors, problem = finish_full(plan, self.capture)
        else:
            finish_fast(plan)
        if self.samplings == 0:
            problem = problem or "no sampler ran on CHAI Apply's MODEL"
            report.attention = "no sampler ran on CHAI Apply's MODEL"
        if self.problems:
            report.attention += f"; {self.problems[-1]}"
        report.timings = {"sample": self.seconds}
        return trace_for(plan, self.hit, fingerprint=self.fingerprint, shape=self.shape, config=self.config,
                         sampler_name=self.sampler_name, scheduler=self.scheduler, donors=donors,
                         capture_problem=problem)


def _same(values: Sequence[float], sigmas: Sequence[float]) -> bool:
    """Whether two schedules are the same steps (each value on its step, within the matching tolerance)."""
    return len(values) == len(sigmas) and all(match_step(v, sigmas) == i for i, v in enumerate(values[:-1]))


class SamplingMonitor:
    """OUTER_SAMPLE wrapper: tells the AppliedRun when a sampling starts (on which sigmas) and how long it takes."""

    def __init__(self, applied: AppliedRun) -> None:
        self.applied = applied

    def __deepcopy__(self, memo: dict) -> "SamplingMonitor":
        return self

    def __call__(self, executor: Any, *args: Any, **kwargs: Any) -> Any:
        if len(args) > 3 and self.applied.hands_over(args[3]) and isinstance(args[0], Tensor):
            return self.applied.handed_over(args[0], args[1])  # a two-expert restart begins on the second sampler
        if len(args) > 3:  # a restart hit may start the sampler elsewhere (AppliedRun.redirect)
            latent_image, sigmas = self.applied.redirect(args[1], args[3])
            sampler = self.applied.resumer if self.applied.resumes(sigmas) else args[2]
            args = (args[0], latent_image, sampler, sigmas, *args[4:])
        sigmas = args[3] if len(args) > 3 else kwargs.get("sigmas")
        noise = args[0] if args else kwargs.get("noise")
        latent_image = args[1] if len(args) > 1 else kwargs.get("latent_image")
        if isinstance(sigmas, Tensor):
            self.applied.started(sigmas, noise, latent_image)
        start = time.perf_counter()
        try:
            out = executor(*args, **kwargs)
        finally:
            self.applied.add_time(time.perf_counter() - start)
        if isinstance(sigmas, Tensor) and sigmas.numel() and float(sigmas.reshape(-1)[-1]) == 0.0:
            self.applied.store_now(out)  # a sampling that ran to the end (not a first expert's share)
        return out


def switch_step(sigmas: tuple[float, ...], boundary: float) -> int:
    """Steps of `sigmas` whose sigma is at least `boundary` (Wan 2.2 A14B: the high-noise expert's share)."""
    return sum(1 for s in sigmas[:-1] if s >= boundary)


def two_expert_refusal(plan: RequestPlan, boundary: float) -> str:
    """Why the two-KSamplerAdvanced graph cannot run this restart hit ('' when it can, or it is no restart). CHAI
    Apply patches the first expert only: a restart starting below the boundary runs wholly on the second sampler
    (the first hands it the noised origin), one starting above it would need the second patched too, and a
    few-step restart's resumed solver would have to run on the second sampler."""
    restart = plan.restart
    if restart is None:
        return ""
    if plan.run is not None:
        return "Cache Attention after a restart below the boundary would run on the second expert, unpatched"
    if restart.history is not None:
        return ("a few-step restart resumes the donor's solver, which the second sampler of a two-sampler graph "
                "does not run; CHAI Sampler with model_2 does")
    if restart.sigma >= boundary:
        return (f"a restart at sigma {restart.sigma:.3f} would start on the first expert (boundary {boundary:g}); "
                "CHAI Apply restarts two experts only below the boundary, CHAI Sampler with model_2 anywhere")
    return ""


def check_before_switch(plan: RequestPlan, switch: int, boundary: float) -> None:
    """ValueError when a cache step (hit) or a captured step (miss) falls on the second expert's steps."""
    if plan.hit:
        late = [s for s in plan.run.config.cache_steps if s > switch] if plan.run is not None else []
        what = f"cache steps {late} of the {len(plan.sigmas) - 1}-step fast schedule"
    else:
        # a final latent comes from CHAI Apply Trace
        late = [i + 1 for i in plan.full_capture().indices if i >= switch]
        what = f"the donor capture (full-schedule steps {late})"
    if late:
        raise ValueError(f"{what} fall at sigmas below the experts' boundary {boundary:g} (after switch_step "
                         f"{switch}), on the second expert, which CHAI Apply does not patch; choose cache steps that "
                         f"lie before the switch (docs/cache-attention.md, Wan 2.2 A14B) or use CHAI Sampler with "
                         "model_2")


def chai_apply(model: Any, latent: Mapping[str, Any], *, config: ChaiConfig, schedule: Schedule,
               sampler_name: str, scheduler: str, hit: CacheHit | None = None, model_2: Any = None,
               positive: Sequence[Any] | None = None, boundary: float = WAN22_BOUNDARY,
               store: tuple[Any, Any] | None = None) -> tuple[Any, AppliedRun]:
    """(the patched MODEL clone, its AppliedRun).

    positive: the CONDITIONING the sampler gets that CHAI Apply was given: its image (image-to-video) is part of
    the request's key, and the adapter refuses what it cannot serve before sampling (`ModelAdapter.check_request`).

    model_2: `model` is the high-noise expert of a pair that switches below sigma `boundary` (Wan 2.2 A14B); only
    `model` is patched, so every cache step (hit) or captured step (miss) must lie before the switch.

    store: (cache, the prompt's PromptEntities): the MODEL stores the run itself when a sampling ends at sigma 0
    (not with model_2: the second expert's sampler, which CHAI does not patch, finishes that run).
    """
    import comfy.patcher_extension

    if store is not None and model_2 is not None:
        raise ValueError("CHAI Apply cannot store a two-expert run itself (the low-noise expert's sampler finishes "
                         "it): leave cache and entities unconnected and put CHAI Apply Trace and CHAI Cache Write "
                         "after the second sampler")
    prepared = prepare(model, latent, hit, config=config, schedule=schedule, sampler_name=sampler_name,
                       model_2=model_2, positive=positive, conditionings=(positive,))
    why = two_expert_refusal(prepared.plan, boundary) if model_2 is not None else ""
    if why:  # a restart the two-sampler graph cannot run: the hit borrows attention instead (or misses)
        if prepared.plan.run is not None:
            prepared.plan.run.release()
        config = replace(config, reuse=CACHE_ATTENTION)
        prepared = prepare(model, latent, hit, config=config, schedule=schedule, sampler_name=sampler_name,
                           model_2=model_2, positive=positive, conditionings=(positive,))
        report = prepared.plan.report
        if prepared.plan.hit:
            report.reuse_note += f" (no restart: {why})"
        else:
            report.reason = f"{report.reason}; no restart: {why}"
    plan = prepared.plan
    clone = model.clone()
    patch(clone, prepared)
    switch = switch_step(plan.sigmas, boundary)
    if model_2 is not None:
        check_before_switch(plan, switch, boundary)
    applied = AppliedRun(plan, hit, prepared.fingerprint, prepared.shape, config, sampler_name, scheduler,
                         prepared.capture, switch, model.model.process_latent_in, store=store)
    if plan.restart is not None:
        applied.start_latent = {**latent, "samples": restart_latent(model, plan.restart.origin,
                                                                    prepared_latent(model, latent))}
        applied.switch_step = plan.restart.schedule.start_step + switch
        if plan.restart.history is not None:
            applied.resumer = resume_sampler(plan.restart.history, plan.restart.sigma)
        if model_2 is not None:  # the restart starts below the boundary (two_expert_refusal): hand it over
            applied.handover = (model.model.model_sampling, model.model.process_latent_out)
    clone.add_wrapper_with_key(comfy.patcher_extension.WrappersMP.OUTER_SAMPLE, MONITOR_KEY, SamplingMonitor(applied))
    log.info("[CHAI] apply: %s, %d steps", plan.mode, applied.steps)
    return clone, applied


__all__ = ["AppliedRun", "SamplingMonitor", "switch_step", "two_expert_refusal", "check_before_switch", "chai_apply",
           "MONITOR_KEY"]
