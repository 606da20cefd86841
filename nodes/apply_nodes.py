"""CHAI Apply and CHAI Apply Trace: CHAI with the sampler nodes a graph already has (KSamplerAdvanced,
SamplerCustomAdvanced with CFGGuider / DualCFGGuider, the Wan 2.2 two-sampler graph).

CHAI Apply patches a MODEL clone for one request (Cache Attention on a usable hit, donor capture on a miss) and
gives the schedule to sample as SIGMAS and as a step count; CHAI Apply Trace, placed after the sampler, turns what
happened into the CHAI_TRACE that CHAI Cache Write stores. The work is in chai_attention.comfy.apply.
"""
from __future__ import annotations

import logging
from typing import Any

from comfy_api.v0_0_2 import io

from ..chai_attention.adapters import supported_families
from ..chai_attention.comfy.apply import AppliedRun, chai_apply
from ..chai_attention.constants import DEFAULT_RESTART_SIGMA, DEFAULT_REUSE, WAN22_BOUNDARY
from ..chai_attention.payloads import CacheHit
from ..chai_attention.status import sampler_status
from .canvas import show
from .errors import user_errors
from .schedule_inputs import (SAMPLERS, SCHEDULERS, chai_plan_inputs, reuse_inputs, schedule_inputs,
                              validate_steps)
from .sockets import CATEGORY, CHAI_APPLIED, CHAI_CACHE, CHAI_ENTITIES, CHAI_TRACE
from .widgets import combo

log = logging.getLogger(__name__)


class Apply(io.ComfyNode):
    """Patch a MODEL for one CHAI request, for any sampler node: fast on a hit (a restart from the donor's latent
    and/or Cache Attention), full with donor capture on a miss."""

    @classmethod
    def define_schema(cls) -> io.Schema:
        return io.Schema(
            node_id="CHAI_Apply",
            display_name="CHAI Apply",
            category=CATEGORY,
            description="CHAI for your own sampler nodes. With a usable hit the schedule is fast_steps long: by "
                        "default it starts from the donor's latent at restart_sigma (this node's LATENT output; "
                        "the sampler adds the seed's noise), or the MODEL it returns uses Cache Attention at the "
                        "cache steps; otherwise the MODEL captures the donor latents of a full_steps run. Give "
                        "the sampler its MODEL, LATENT and SIGMAS (SamplerCustomAdvanced) or its steps and "
                        "start_at_step (KSamplerAdvanced, same sampler and scheduler as here); put CHAI Apply "
                        "Trace after the sampler, then CHAI Cache Write, or connect cache and entities here and "
                        "the MODEL stores the run itself when the sampler finishes.",
            inputs=[
                io.Model.Input("model", tooltip=f"The video model the sampler uses, of a supported family "
                                                f"({'; '.join(supported_families())}); for Wan 2.2 A14B the "
                                                "high-noise expert. Same MODEL as the lookup's."),
                io.Latent.Input("latent", tooltip="The latent the sampler starts from (same as the lookup's)."),
                combo("sampler_name", options=SAMPLERS, default="euler",
                      tooltip="The sampler your sampler node uses (KSamplerSelect or KSampler's): the schedule "
                              "depends on it for a few samplers (dpm_2, ...)."),
                combo("scheduler", options=SCHEDULERS, default="simple",
                      tooltip="The scheduler your sampler node uses; 'opensora' is OpenSora 1.2's exact schedule "
                              "(feed SIGMAS to SamplerCustomAdvanced then)."),
                *schedule_inputs(boundary_note="; sets the switch_step output"),
                io.Conditioning.Input("positive", optional=True,
                                      tooltip="Image-to-video: the positive conditioning your sampler gets (it "
                                              "holds the start image; connect it to the lookup too): a donor must "
                                              "come from the same image(s). With it, HunyuanVideo image-to-video "
                                              "(not supported) is refused before sampling."),
                *reuse_inputs(" A restart hit gives the sampler its LATENT and start_at_step; a sampler given "
                              "only SIGMAS or steps (a graph saved before restarts) is started there too."),
                CHAI_CACHE.Input("cache", optional=True,
                                 tooltip="Optional, with entities: the lookup's cache. The MODEL then stores the "
                                         "run in it as soon as the sampler finishes, so no CHAI Apply Trace or "
                                         "Cache Write is needed (one node between loader and sampler). Not for "
                                         "the Wan 2.2 two-sampler graph (model_2)."),
                CHAI_ENTITIES.Input("entities", optional=True,
                                    tooltip="Optional, with cache: the lookup's entities, stored with the run."),
            ],
            outputs=[
                io.Model.Output("patched_model", display_name="MODEL",
                                tooltip="The patched MODEL for your sampler (the input MODEL is never changed)."),
                io.Sigmas.Output("sigmas", display_name="SIGMAS",
                                 tooltip="The schedule to sample: fast on a hit, full on a miss."),
                io.Int.Output("steps", display_name="steps",
                              tooltip="KSampler / KSamplerAdvanced 'steps': the schedule's step count (a restart "
                                      "hit: the schedule whose steps from start_at_step on are SIGMAS)."),
                io.Int.Output("switch_step", display_name="switch_step",
                              tooltip="Wan 2.2 A14B two-sampler graph: the first step of the low-noise expert "
                                      "(end_at_step of the first KSamplerAdvanced, start_at_step of the second)."),
                CHAI_APPLIED.Output("chai", display_name="chai",
                                    tooltip="This request's CHAI state; connect to CHAI Apply Trace."),
                io.String.Output("report", display_name="report", tooltip="Hit or miss, steps, why."),
                io.Latent.Output("latent_out", display_name="LATENT",
                                 tooltip="The LATENT your sampler starts from: on a restart hit the donor's latent "
                                         "(the sampler adds this seed's noise at the restart sigma: keep add_noise "
                                         "enabled), otherwise the input LATENT unchanged."),
                io.Int.Output("start_at_step", display_name="start_at_step",
                              tooltip="KSamplerAdvanced 'start_at_step' (a restart hit starts part-way; else 0)."),
            ],
        )

    @classmethod
    def validate_inputs(cls, cache_steps: str | None = None) -> bool | str:
        """Reject cache steps that do not parse before anything runs (reported once, under cache_steps)."""
        return validate_steps(cache_steps)

    @classmethod
    def execute(cls, model: Any, latent: dict, sampler_name: str, scheduler: str, full_steps: int, fast_steps: int,
                cache_steps: str, kv_mode: str, apply_to: str, hit: CacheHit | None = None, model_2: Any = None,
                boundary: float = WAN22_BOUNDARY, positive: Any = None, reuse: str = DEFAULT_REUSE,
                restart_sigma: float = DEFAULT_RESTART_SIGMA, cache: Any = None,
                entities: Any = None) -> io.NodeOutput:
        node = "CHAI Apply"
        with user_errors(node):
            if (cache is None) != (entities is None):
                raise ValueError("connect both cache and entities (the lookup's) for CHAI Apply to store the run "
                                 "itself, or neither (then CHAI Apply Trace and CHAI Cache Write store it)")
            config, schedule = chai_plan_inputs(model, latent, sampler_name, scheduler, full_steps, fast_steps,
                                                cache_steps, kv_mode, apply_to, reuse, restart_sigma)
            patched, applied = chai_apply(model, latent, config=config, schedule=schedule, sampler_name=sampler_name,
                                          scheduler=scheduler, hit=hit, model_2=model_2, positive=positive,
                                          boundary=boundary, store=None if cache is None else (cache, entities))
        report = apply_report(applied)
        status = f"{'HIT' if applied.plan.hit else 'MISS'} · {applied.steps} steps"
        start = applied.start_latent if applied.start_latent is not None else latent
        return io.NodeOutput(patched, applied.sigmas(), applied.total_steps, applied.switch_step, applied, report,
                             start, applied.start_at_step, ui=show(status, report))


def apply_report(applied: AppliedRun) -> str:
    """CHAI Apply's report: what the sampler will run and why."""
    plan, report = applied.plan, applied.plan.report
    lines = [f"CHAI Apply: {report.mode} ({'hit' if plan.hit else 'miss'}), "
             f"{applied.steps} steps; sample them with the MODEL and SIGMAS (or steps) from this node",
             f"lookup: {report.lookup}"]
    if plan.hit and report.reuse_note:
        lines.append(f"reuse: {report.reuse_note}")
    if plan.restart is not None:
        lines.append(f"start from this node's LATENT: SamplerCustomAdvanced with its SIGMAS, or KSamplerAdvanced "
                     f"with steps {applied.total_steps}, start_at_step {applied.start_at_step}, add_noise enabled")
    if plan.run is not None:
        lines.append(f"cache steps {','.join(map(str, applied.config.cache_steps))} of {applied.steps}")
    elif not plan.hit:
        lines.append(f"capturing donor latents at full-schedule steps "
                     f"{', '.join(str(i + 1) for i in applied.plan.full_capture().indices) or 'final'}")
    lines.append(f"switch_step {applied.switch_step} (Wan 2.2 A14B two-sampler graphs)")
    if applied.store is not None:
        lines.append("the MODEL stores the run in the cache when the sampler finishes (ComfyUI's log says what "
                     "it stored)")
    return "\n".join(lines)


class ApplyTrace(io.ComfyNode):
    """After the sampler: what CHAI Apply's MODEL did, as the CHAI_TRACE that CHAI Cache Write stores."""

    @classmethod
    def define_schema(cls) -> io.Schema:
        return io.Schema(
            node_id="CHAI_ApplyTrace",
            display_name="CHAI Apply Trace",
            category=CATEGORY,
            description="Reads what happened while your sampler ran on CHAI Apply's MODEL: on a miss the captured "
                        "donor latents, on a hit the cache steps that fired. Connect the sampler's output LATENT "
                        "(so it runs after the sampler) and give the trace to CHAI Cache Write.",
            inputs=[
                CHAI_APPLIED.Input("chai", tooltip="The chai output of CHAI Apply."),
                io.Latent.Input("samples", tooltip="The LATENT your (last) sampler returned."),
            ],
            outputs=[
                CHAI_TRACE.Output("trace", display_name="trace", tooltip="Connect to CHAI Cache Write."),
                io.String.Output("report", display_name="report",
                                 tooltip="Mode, steps, the cache steps that fired or the donors captured."),
            ],
        )

    @classmethod
    def execute(cls, chai: AppliedRun, samples: dict) -> io.NodeOutput:
        with user_errors("CHAI Apply Trace"):
            trace = chai.trace(samples.get("samples"))
        report = trace.report.text()
        return io.NodeOutput(trace, report, ui=show(sampler_status(trace.report), report))


NODES = [Apply, ApplyTrace]
