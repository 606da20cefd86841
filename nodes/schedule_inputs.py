"""The inputs CHAI Sampler and CHAI Apply share (in their saved-workflow order) and what they make of them."""
from __future__ import annotations

from typing import Any

import comfy.samplers
from comfy_api.v0_0_2 import io

from ..chai_attention import constants
from ..chai_attention.comfy.schedule import OPENSORA_SCHEDULER, node_schedule
from ..chai_attention.config import ChaiConfig, check_cache_steps, parse_cache_steps
from ..chai_attention.request import Schedule
from .sockets import CHAI_HIT
from .widgets import combo

SAMPLERS = list(comfy.samplers.KSampler.SAMPLERS)
SCHEDULERS = [*comfy.samplers.KSampler.SCHEDULERS, OPENSORA_SCHEDULER]
KV_MODES = list(constants.KV_MODES)
APPLY_TO = list(constants.APPLY_TO)
MAX_STEPS = 1000


def schedule_inputs(boundary_note: str = "") -> list[Any]:
    """The inputs CHAI Sampler and CHAI Apply share, in their saved-workflow order: steps, cache steps, K/V mode,
    CFG half, the lookup's hit, and Wan 2.2 A14B's second expert with its boundary."""
    return [
        io.Int.Input("full_steps", default=30, min=1, max=MAX_STEPS,
                     tooltip="Steps on a miss (the full schedule; 30 in the paper and in Wan's template)."),
        io.Int.Input("fast_steps", default=8, min=1, max=MAX_STEPS,
                     tooltip="Steps on a hit (the paper: 8, about 3.5x faster than 30)."),
        io.String.Input("cache_steps", default=",".join(map(str, constants.DEFAULT_CACHE_STEPS)),
                        tooltip="Steps of the fast schedule, counted from 1, at which Cache Attention runs. The "
                                "default was chosen in the pack's quality lab (docs/quality-lab.md compares it "
                                "with the paper's 2,3,4). Empty = none (a plain fast run)."),
        combo("kv_mode", options=KV_MODES, default="replace",
              tooltip="'replace' (the paper): block 0 attends to the donor's keys/values only. 'concat': to its "
                      "own and the donor's (keeps more of the new prompt)."),
        combo("apply_to", options=APPLY_TO, default="cond",
              tooltip="'cond' (default): only the prompt half of CFG attends to the donor; 'both': the negative "
                      "half too."),
        CHAI_HIT.Input("hit", optional=True,
                       tooltip="The lookup result from CHAI Cache Lookup. Not connected, or a miss: the full "
                               "schedule runs and the donors are captured."),
        io.Model.Input("model_2", optional=True,
                       tooltip="Wan 2.2 A14B: the low-noise expert, which samples the steps below 'boundary' "
                               "(the second sampler's MODEL in a two-sampler graph). Connect it to the lookup too."),
        io.Float.Input("boundary", default=constants.WAN22_BOUNDARY, min=0.0, max=1.0, step=0.005, optional=True,
                       tooltip=f"Wan 2.2 A14B: the sigma below which the low-noise expert samples "
                               f"({constants.WAN22_BOUNDARY:g} text-to-video, 0.9 image-to-video)" + boundary_note
                               + "."),
    ]


REUSE_MODES = list(constants.REUSE_MODES)


def reuse_inputs(apply_note: str = "") -> list[Any]:
    """The reuse inputs CHAI Sampler and CHAI Apply end with (optional, so saved workflows keep loading)."""
    return [
        combo("reuse", options=REUSE_MODES, default=constants.DEFAULT_REUSE, optional=True,
              tooltip="How a hit reuses its donor. 'restart' (default): start from the donor's latent at "
                      "restart_sigma with this request's own noise (the seed still matters) and run fast_steps "
                      "from there: in the quality lab it kept the full run's quality (docs/quality-lab.md). Taken "
                      "only for a donor of the same scene; others get Cache Attention. Under 16 full_steps (a "
                      "distilled few-step model) only a re-rolled seed of the same prompt restarts, on the model's "
                      "own schedule, resuming the cached run's DPM-Solver++(2M) whatever sampler is set. "
                      "'cache_attention': the paper's, from noise. 'both': a restart, then Cache Attention at "
                      "cache_steps." + apply_note),
        io.Float.Input("restart_sigma", default=constants.DEFAULT_RESTART_SIGMA, min=0.05, max=0.95, step=0.05,
                       optional=True,
                       tooltip="The noise level a restart starts at (a miss stores its latent there). Lower "
                               "starts later and copies more of the donor: below about 0.7 the donor's object "
                               "shows through in the lab. On a few-step model the restart starts at the "
                               "schedule's own sigma nearest this one (0.9 on Wan's 4-step shift-5: after step 1)."),
    ]


def validate_steps(cache_steps: str | None) -> bool | str:
    """validate_inputs of the nodes with cache_steps: True, or what is wrong with the steps.

    ComfyUI repeats a failure under every input a validate_inputs reads (and skips their min/max checks), so
    only cache_steps is read: fast_steps keeps ComfyUI's own range check, and a cache step beyond the fast
    schedule (which needs both) is refused when the node runs, in one message.
    """
    try:
        check_cache_steps(cache_steps, MAX_STEPS)
    except ValueError as exc:
        return str(exc)
    return True


def chai_plan_inputs(model: Any, latent: dict, sampler_name: str, scheduler: str, full_steps: int, fast_steps: int,
                     cache_steps: str, kv_mode: str, apply_to: str, reuse: str = constants.DEFAULT_REUSE,
                     restart_sigma: float = constants.DEFAULT_RESTART_SIGMA) -> tuple[ChaiConfig, Schedule]:
    """(ChaiConfig, steps -> sigmas) from the schedule inputs CHAI Sampler and CHAI Apply share."""
    config = ChaiConfig(full_steps=full_steps, fast_steps=fast_steps, cache_steps=parse_cache_steps(cache_steps),
                        kv_mode=kv_mode, apply_to=apply_to, reuse=reuse, restart_sigma=restart_sigma)
    return config, node_schedule(model, latent, sampler_name, scheduler)
