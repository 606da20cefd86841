"""One Cache Attention adapter per model family, and the registry that picks one for a model.

A new family is one module here with a `ModelAdapter` subclass, registered below (docs/adding-a-model-family.md).
"""
from .base import ModelAdapter, UnsupportedModelError, unwrap_model
from .hunyuan_video import HunyuanVideoAdapter
from .ltxv import LTXVAdapter
from .registry import get_adapter, register_adapter, supported_families
from .stdit3 import STDiT3Adapter
from .wan import WanAdapter

for _builtin in (STDiT3Adapter, WanAdapter, HunyuanVideoAdapter, LTXVAdapter):
    register_adapter(_builtin)

__all__ = ["ModelAdapter", "UnsupportedModelError", "get_adapter", "register_adapter", "supported_families",
           "unwrap_model", "STDiT3Adapter", "WanAdapter", "HunyuanVideoAdapter", "LTXVAdapter"]
