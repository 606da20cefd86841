"""The setup CHAI Sampler and CHAI Apply share: one `prepare` decides the request, one `patch` carries it on a clone.

`prepare` runs, in order: the sampler check, the request's key (`lookup.request_key`: adapter, the adapters'
refusals, fingerprint, latent shape), and `request.plan_request` with a `SharedRun`: FAST with
a Cache Attention run on a usable hit, else FULL with a `ModelInputCapture`. `patch` then puts the run (the
adapter's public hooks plus transformer_options[RUN_KEY]) or the capture (an APPLY_MODEL wrapper) on a
ModelPatcher clone. ComfyUI glue: imports ComfyUI inside functions only.

The reuse mode is chosen in `request.plan_request`; a restart's start (the donor's origin and the schedule's tail)
rides in `plan.restart`, which `sample.chai_sample` and `apply.chai_apply` turn into the LATENT the sampler starts
from; a restart alone puts nothing on the clone.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from ..adapters import get_adapter
from ..config import ChaiConfig
from ..constants import CAPTURE_KEY, RUN_KEY
from ..payloads import CacheHit
from ..request import RequestPlan, Schedule, plan_request
from ..run import CacheAttentionRun
from .capture import ModelInputCapture
from .lookup import RequestKey, request_key
from .schedule import check_sampler_name


class SharedRun(CacheAttentionRun):
    """A CacheAttentionRun that copies of the model options share instead of duplicating.

    ModelPatcher.clone() deep-copies model_options; a copy of the run would record firings nobody reads and
    duplicate the donor latents.
    """

    def __copy__(self) -> "SharedRun":
        return self

    def __deepcopy__(self, memo: dict) -> "SharedRun":
        return self


@dataclass
class PreparedRequest:
    """One ComfyUI request, decided: its key, its plan, and on a miss the donor capture to install."""

    key: RequestKey
    plan: RequestPlan
    capture: ModelInputCapture | None = None

    @property
    def fingerprint(self) -> str:
        """The fingerprint the request's cache entry is keyed by."""
        return self.key.fingerprint

    @property
    def shape(self) -> tuple[int, ...]:
        """The shape of the latent the sampler runs on."""
        return self.key.shape


def prepare(model: Any, latent: Mapping[str, Any], hit: CacheHit | None, *, config: ChaiConfig, schedule: Schedule,
            sampler_name: str, model_2: Any = None, positive: Sequence[Any] | None = None,
            conditionings: Sequence[Any] = ()) -> PreparedRequest:
    """Decide one request on `model` (and Wan 2.2 A14B's low-noise `model_2`) before anything samples.

    `positive` is the CONDITIONING whose image (image-to-video) is part of the key; `conditionings` are all the
    CONDITIONING lists the sampler gets, for the adapters' refusals (e.g. image-to-video on a text-to-video one).
    """
    check_sampler_name(sampler_name)
    key = request_key(model, latent, model_2=model_2, positive=positive, conditionings=conditionings)
    plan = plan_request(hit, fingerprint=key.fingerprint, shape=key.shape, config=config, adapter=key.adapter,
                        schedule=schedule, run_cls=SharedRun)
    capture = (ModelInputCapture(plan.capture, plan.sigmas, key.shape, getattr(key.adapter, "check_call", None))
               if plan.capture is not None else None)
    return PreparedRequest(key, plan, capture)


def patch(clone: Any, prepared: PreparedRequest) -> set[str]:
    """Put the request on a ModelPatcher clone: the run (hit) or the capture (miss). Returns the object patches the
    adapter added, which the caller restores when it is done (see `sample.unpatch`)."""
    import comfy.patcher_extension

    run = prepared.plan.run
    if prepared.capture is not None:
        clone.add_wrapper_with_key(comfy.patcher_extension.WrappersMP.APPLY_MODEL, CAPTURE_KEY, prepared.capture)
        return set()
    if run is None:  # a restart alone patches nothing: the sampler starts from the restart latent
        return set()
    before = set(clone.object_patches)
    get_adapter(clone).comfy_install(clone, run_key=RUN_KEY)
    # After the install: set_model_patch_replace replaces the transformer_options dict.
    clone.model_options.setdefault("transformer_options", {})[RUN_KEY] = run
    return set(clone.object_patches) - before


__all__ = ["SharedRun", "PreparedRequest", "prepare", "patch"]
