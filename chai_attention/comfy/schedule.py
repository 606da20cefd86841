"""Schedules and latents as ComfyUI's KSampler sees them; the 'opensora' scheduler of the CHAI nodes.

ComfyUI glue: imports ComfyUI (and the OpenSora ComfyUI glue) inside functions only.
"""
from __future__ import annotations

from typing import Any, Mapping

import torch
from torch import Tensor

from ..request import Schedule

OPENSORA_SCHEDULER = "opensora"  # the CHAI nodes' extra scheduler choice: OpenSora 1.2's exact schedule


def prepared_latent(model: Any, latent: Mapping[str, Any]) -> Tensor:
    """The LATENT's samples as the sampler will see them (empty latents widened to the model's channels)."""
    import comfy.sample

    return comfy.sample.fix_empty_latent_channels(model, latent["samples"])


def latent_shape(model: Any, latent: Mapping[str, Any]) -> tuple[int, ...]:
    """Shape of the latent the sampler will run on (what cache entries are keyed by)."""
    return tuple(prepared_latent(model, latent).shape)


def check_sampler_name(sampler_name: str) -> None:
    """ValueError naming the choices when ComfyUI has no sampler of that name."""
    import comfy.samplers

    samplers = comfy.samplers.KSampler.SAMPLERS
    if sampler_name not in samplers:
        raise ValueError(f"unknown sampler {sampler_name!r}; choose one of {', '.join(samplers)}")


def comfy_schedule(model: Any, sampler_name: str, scheduler: str) -> Schedule:
    """steps -> the sigmas ComfyUI's KSampler would use (including its penultimate-sigma rule), on the CPU."""
    import comfy.samplers

    schedulers = comfy.samplers.KSampler.SCHEDULERS
    if scheduler not in schedulers:  # KSampler itself would silently fall back to its first choice
        raise ValueError(f"unknown scheduler {scheduler!r}; choose one of {', '.join(schedulers)}")
    check_sampler_name(sampler_name)

    def sigmas(steps: int) -> Tensor:
        ks = comfy.samplers.KSampler(model, steps=steps, device="cpu", sampler=sampler_name, scheduler=scheduler,
                                     denoise=1.0, model_options=model.model_options)
        return ks.sigmas.detach().to("cpu", torch.float32)

    return sigmas


def opensora_schedule(model: Any, latent: Mapping[str, Any]) -> Schedule:
    """steps -> the model's exact sigmas: OpenSora 1.2's for the latent's video, or a fixed-size checkpoint's."""
    from ...opensora.comfy_adapter import video_from_latent_dict
    from ...opensora.comfy_model import fixed_sampling, is_opensora
    from ...opensora.schedule import opensora_sigmas, uniform_flow_sigmas

    if not is_opensora(model):
        raise ValueError("the 'opensora' scheduler is OpenSora 1.2's exact schedule and needs an OpenSora model; "
                         "choose 'simple' (or another ComfyUI scheduler) for this model.")
    # A fixed-size checkpoint (the toy-world model) was trained on the uniform schedule with its own shift.
    fixed = fixed_sampling(model)
    if fixed is not None:
        return lambda steps: uniform_flow_sigmas(steps, fixed.shift)
    video = video_from_latent_dict(latent)
    return lambda steps: opensora_sigmas(steps, video.height, video.width, video.num_frames)


def node_schedule(model: Any, latent: Mapping[str, Any], sampler_name: str, scheduler: str) -> Schedule:
    """The schedule a CHAI node's sampler/scheduler widgets name: 'opensora' or one of ComfyUI's schedulers."""
    if scheduler == OPENSORA_SCHEDULER:
        return opensora_schedule(model, latent)
    return comfy_schedule(model, sampler_name, scheduler)


__all__ = ["OPENSORA_SCHEDULER", "prepared_latent", "latent_shape", "check_sampler_name", "comfy_schedule",
           "opensora_schedule", "node_schedule"]
