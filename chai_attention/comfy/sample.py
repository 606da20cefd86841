"""CHAI Sampler's sampling: `prepare` the request, then sample like KSampler on patched clones, one or two experts.

ComfyUI glue: imports ComfyUI inside functions only. The shared MODEL is never modified.
"""
from __future__ import annotations

import logging
import time
from typing import Any, Mapping

import torch
from torch import Tensor

from ..config import ChaiConfig
from ..constants import CAPTURE_KEY, RUN_KEY, WAN22_BOUNDARY
from ..hooks import WRAPPER_KEY as HOOK_WRAPPER_KEY
from ..payloads import CacheHit, SampleTrace
from ..request import Schedule, finish_fast, finish_full, trace_for
from ..steps import as_sigmas
from .prepare import patch, prepare
from .resume import resume_sampler
from .schedule import prepared_latent

log = logging.getLogger(__name__)


def expert_stages(sigmas: Any, model: Any, model_2: Any = None,
                  boundary: float = WAN22_BOUNDARY) -> list[tuple[Any, Any]]:
    """(MODEL, sigmas) per sampling stage: one stage, or with a second expert (Wan 2.2 A14B) the steps at sigma >=
    boundary on `model` and the rest on `model_2`, as the two-KSamplerAdvanced graph splits them."""
    values = as_sigmas(sigmas)
    switch = sum(1 for s in values[:-1] if s >= boundary)
    if model_2 is None or switch == 0:
        return [(model_2 if model_2 is not None else model, sigmas)]
    if switch >= len(values) - 1:
        return [(model, sigmas)]
    return [(model, sigmas[:switch + 1]), (model_2, sigmas[switch:])]


def restart_latent(model: Any, origin: Tensor, like: Tensor) -> Tensor:
    """The LATENT a restart samples from: the donor's origin (model-input space) in the LATENT's space and dtype."""
    return model.model.process_latent_out(origin.to(like.device, torch.float32)).to(like.dtype)


def unpatch(clone: Any, added: set[str]) -> None:
    """Take everything `prepare.patch` added off a clone; undo the adapter's object patches on the shared model."""
    import comfy.patcher_extension
    import comfy.utils

    clone.model_options.get("transformer_options", {}).pop(RUN_KEY, None)
    clone.remove_wrappers_with_key(comfy.patcher_extension.WrappersMP.APPLY_MODEL, CAPTURE_KEY)
    clone.remove_wrappers_with_key(comfy.patcher_extension.WrappersMP.APPLY_MODEL, HOOK_WRAPPER_KEY)
    backup = getattr(clone, "object_patches_backup", {})
    for key in added:
        if key in backup:
            comfy.utils.set_attr(clone.model, key, backup.pop(key))


def chai_sample(model: Any, positive: Any, negative: Any, latent: Mapping[str, Any], *, seed: int, cfg: float,
                sampler_name: str, scheduler: str, config: ChaiConfig, schedule: Schedule,
                hit: CacheHit | None = None, model_2: Any = None,
                boundary: float = WAN22_BOUNDARY) -> tuple[dict[str, Any], SampleTrace]:
    """Sample a LATENT as ComfyUI's KSampler does: fast on a usable hit (restart and/or Cache Attention), else full.

    schedule(steps) gives the sigmas (e.g. `schedule.comfy_schedule`); scheduler is only its label for reports.
    model_2: a second expert (Wan 2.2 A14B low-noise) for the steps below `boundary`. Returns the output LATENT (a
    copy of the input dict with new samples) and the trace for CHAI_CacheWrite.
    """
    import comfy.model_management
    import comfy.sample
    import comfy.samplers
    import comfy.utils
    import latent_preview

    start = time.perf_counter()
    comfy.model_management.throw_exception_if_processing_interrupted()
    prepared = prepare(model, latent, hit, config=config, schedule=schedule, sampler_name=sampler_name,
                       model_2=model_2, positive=positive, conditionings=(positive, negative))
    plan, report = prepared.plan, prepared.plan.report
    samples = prepared_latent(model, latent)

    noise = comfy.sample.prepare_noise(samples, seed, latent.get("batch_index"))
    if plan.restart is not None:  # the sampler adds the seed's noise at the restart sigma (restart.py)
        samples = restart_latent(model, plan.restart.origin, samples)
    stages: list[tuple[Any, Any, set[str]]] = []
    for expert, sigmas in expert_stages(plan.schedule, model, model_2, boundary):
        clone = expert.clone()
        stages.append((clone, sigmas, patch(clone, prepared)))

    total = len(plan.sigmas) - 1
    preview = latent_preview.prepare_callback(stages[0][0], total)
    offset = 0

    def callback(step: int, x0: Tensor, x: Tensor, total_steps: int) -> None:
        # The progress hook checks too, but only when a server installed it; this works in every host.
        comfy.model_management.throw_exception_if_processing_interrupted()
        preview(step + offset, x0, x, total)

    history = plan.restart.history if plan.restart is not None else None
    # A few-step restart resumes the donor's solver, whatever sampler_name says (the report names it).
    sampler = (resume_sampler(history, plan.restart.sigma) if plan.restart is not None and history is not None
               else comfy.samplers.sampler_object(sampler_name))
    setup = time.perf_counter()
    out = samples
    try:
        for i, (clone, sigmas, _) in enumerate(stages):
            out = comfy.sample.sample_custom(
                clone, noise if i == 0 else torch.zeros_like(noise), cfg, sampler, sigmas, positive, negative, out,
                noise_mask=latent.get("noise_mask"), callback=callback, disable_pbar=not comfy.utils.PROGRESS_BAR_ENABLED, seed=seed)
            offset += len(sigmas) - 1
    finally:
        if plan.run is not None:
            plan.run.release()
        for clone, _, added in stages:
            unpatch(clone, added)
    done = time.perf_counter()
    report.timings = {"setup": setup - start, "sample": done - setup}

    donors, problem = None, ""
    if prepared.capture is not None:
        donors, problem = finish_full(plan, prepared.capture)
    else:
        finish_fast(plan)
    report.timings["total"] = time.perf_counter() - start
    out_latent = dict(latent)
    out_latent["samples"] = out
    trace = trace_for(plan, hit, fingerprint=prepared.fingerprint, shape=prepared.shape, config=config,
                      sampler_name=sampler_name, scheduler=scheduler, donors=donors, capture_problem=problem)
    log.info("[CHAI] %s run: %d steps in %.2f s (%s)", report.mode, report.steps, report.timings["sample"],
             report.attention)
    return out_latent, trace


__all__ = ["expert_stages", "restart_latent", "unpatch", "chai_sample"]
