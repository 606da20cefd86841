"""The adapter interface, one subclass per model family (the registry that picks one is `adapters.registry`)."""
from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, ClassVar, Mapping, Sequence

from torch import nn

from ..hooks import HookAdapter
from ..run import CacheAttentionRun


class UnsupportedModelError(TypeError):
    """The model belongs to no family with a Cache Attention adapter."""


def unwrap_model(model: Any, max_depth: int = 4) -> Any:
    """The diffusion network inside wrappers: follows `.diffusion_model` (a ComfyUI BaseModel) and `.model`
    (a ComfyUI ModelPatcher) without importing ComfyUI."""
    for _ in range(max_depth):
        inner = getattr(model, "diffusion_model", None)
        if inner is None and not isinstance(model, nn.Module):
            inner = getattr(model, "model", None)
        if inner is None or inner is model:
            break
        model = inner
    return model


class ModelAdapter(HookAdapter, ABC):
    """What Cache Attention needs to know about one model family: recognise the model, refuse what its donors
    cannot serve (`check_run`, `check_request`, `check_call`) and where the hooks go.

    Every family gets its donor K/V through the same hooks (chai_attention.hooks): a subclass sets the
    `HookAdapter` class variables (`block_key`, `attention_index`, ...) and overrides `donor_input`, `splice_kv` or
    `check_donor` only where the defaults do not fit; `comfy_install` puts the hooks on a ModelPatcher clone.
    Being a HookAdapter itself, ModelAdapter needs no mixin (and so no mixin order).
    """

    family: ClassVar[str] = ""
    description: ClassVar[str] = ""

    def __init__(self, model: Any) -> None:
        self.model = unwrap_model(model)
        if not self.recognise(self.model):
            raise UnsupportedModelError(f"{type(self.model).__name__} is not a {self.description or self.family} "
                                        "model")

    @classmethod
    @abstractmethod
    def recognise(cls, model: Any) -> bool:
        """True when `model` (already unwrapped) belongs to this family."""

    def check_run(self, run: CacheAttentionRun, latent_shape: Sequence[int] | None = None) -> None:
        """Raise ValueError when the run's donors cannot serve this model on a latent of `latent_shape`."""

    def check_request(self, latent: Mapping[str, Any] | None, conditionings: Sequence[Any] = ()) -> None:
        """Raise ValueError, before any sampling, when a request this adapter refuses shows in its LATENT or its
        CONDITIONING lists (e.g. an image-to-video request on a text-to-video adapter)."""
