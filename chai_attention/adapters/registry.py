"""The adapter registry: which `ModelAdapter` serves a model (the built-ins are registered by `adapters/__init__`)."""
from __future__ import annotations

from typing import Any

from .base import ModelAdapter, UnsupportedModelError, unwrap_model

_REGISTERED: dict[str, type[ModelAdapter]] = {}


def register_adapter(cls: type[ModelAdapter]) -> type[ModelAdapter]:
    """Add (or replace) the adapter for `cls.family`; usable as a class decorator. Asked in registration order."""
    if not cls.family:
        raise ValueError(f"{cls.__name__} has no family name")
    _REGISTERED[cls.family] = cls
    return cls


def adapter_classes() -> list[type[ModelAdapter]]:
    """The registered adapter classes, in registration order."""
    return list(_REGISTERED.values())


def supported_families() -> list[str]:
    """Families with an adapter, as 'family (description)' strings."""
    return [f"{c.family} ({c.description})" if c.description else c.family for c in adapter_classes()]


def get_adapter(model: Any) -> ModelAdapter:
    """The adapter instance for `model` (a bare network or a wrapper); UnsupportedModelError names the options."""
    inner = unwrap_model(model)
    for cls in adapter_classes():
        if cls.recognise(inner):
            return cls(inner)
    raise UnsupportedModelError(
        f"CHAI Cache Attention does not support {type(inner).__name__} models; supported: "
        f"{'; '.join(supported_families())}")
