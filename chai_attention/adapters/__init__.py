"""One Cache Attention adapter per model family, and the registry that picks one for a model."""
from .base import ModelAdapter, UnsupportedModelError, get_adapter, register_adapter, supported_families, unwrap_model

__all__ = ["ModelAdapter", "UnsupportedModelError", "get_adapter", "register_adapter", "supported_families",
           "unwrap_model"]
