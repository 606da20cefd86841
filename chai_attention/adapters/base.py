"""The adapter interface (one per model family) and the registry that picks the adapter for a model."""
from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, Callable, ClassVar, Mapping, Sequence

from torch import nn

from ..constants import RUN_KEY
from ..run import BATCHED_CFG, CacheAttentionRun


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


class ModelAdapter(ABC):
    """What Cache Attention needs to know about one model family.

    recognise the model; locate the first transformer block and its self-attention; check that a run's donors can
    serve it; install the patch (an `attn_replace` mapping in pure torch, ModelPatcher hooks in ComfyUI). Families
    that ComfyUI runs mix in `chai_attention.hooks.HookAdapter`, which installs through ComfyUI's public hooks and
    never computes any part of the model itself.
    """

    family: ClassVar[str] = ""
    description: ClassVar[str] = ""
    pure_torch: ClassVar[bool] = False  # True when `attn_replace` serves the pure-torch pipeline

    def __init__(self, model: Any) -> None:
        self.model = unwrap_model(model)
        if not self.recognise(self.model):
            raise UnsupportedModelError(f"{type(self.model).__name__} is not a {self.description or self.family} "
                                        "model")

    @classmethod
    @abstractmethod
    def recognise(cls, model: Any) -> bool:
        """True when `model` (already unwrapped) belongs to this family."""

    @abstractmethod
    def first_block(self) -> nn.Module:
        """The transformer block whose self-attention Cache Attention replaces."""

    @abstractmethod
    def block_self_attention(self) -> nn.Module:
        """That block's self-attention module."""

    def check_run(self, run: CacheAttentionRun, latent_shape: Sequence[int] | None = None) -> None:
        """Raise ValueError when the run's donors cannot serve this model on a latent of `latent_shape`."""

    def check_request(self, latent: Mapping[str, Any] | None, conditionings: Sequence[Any] = ()) -> None:
        """Raise ValueError, before any sampling, when a request this adapter refuses shows in its LATENT or its
        CONDITIONING lists (e.g. an image-to-video request on a text-to-video adapter)."""

    def attn_replace(self, run: CacheAttentionRun, cond_or_uncond: Sequence[int] = BATCHED_CFG,
                     sigma: float | None = None) -> dict[Any, Callable[..., Any]]:
        """The model's `attn_replace` mapping for one pure-torch forward call (only where `pure_torch`)."""
        raise TypeError(f"the {self.family} adapter has no attn_replace hook for the pure-torch pipeline")

    def comfy_install(self, patcher: Any, run_key: str = RUN_KEY) -> None:
        """Install the Cache Attention patch on a ComfyUI ModelPatcher *clone* through its public hooks.

        The run itself travels per sampling call in transformer_options[run_key], never on the model.
        """
        raise NotImplementedError(f"{type(self).__name__} has no ComfyUI installation")


_REGISTERED: dict[str, type[ModelAdapter]] = {}


def register_adapter(cls: type[ModelAdapter]) -> type[ModelAdapter]:
    """Add (or replace) the adapter for `cls.family`; usable as a class decorator."""
    if not cls.family:
        raise ValueError(f"{cls.__name__} has no family name")
    _REGISTERED[cls.family] = cls
    return cls


def _adapter_classes() -> list[type[ModelAdapter]]:
    # Imported on first use so that importing the registry stays cheap.
    from .hunyuan_video import HunyuanVideoAdapter
    from .ltxv import LTXVAdapter
    from .stdit3 import STDiT3Adapter
    from .wan import WanAdapter

    builtin = {c.family: c for c in (STDiT3Adapter, WanAdapter, HunyuanVideoAdapter, LTXVAdapter)}
    return list({**builtin, **_REGISTERED}.values())


def supported_families() -> list[str]:
    """Families with an adapter, as 'family (description)' strings."""
    return [f"{c.family} ({c.description})" if c.description else c.family for c in _adapter_classes()]


def get_adapter(model: Any) -> ModelAdapter:
    """The adapter instance for `model` (a bare network or a wrapper); UnsupportedModelError names the options."""
    inner = unwrap_model(model)
    for cls in _adapter_classes():
        if cls.recognise(inner):
            return cls(inner)
    raise UnsupportedModelError(
        f"CHAI Cache Attention does not support {type(inner).__name__} models; supported: "
        f"{'; '.join(supported_families())}")
