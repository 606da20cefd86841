"""CHAI Cache Attention: step selection, donor latents, the K/V math, model adapters and the pure-torch pipeline.

Importing the package is cheap (no torch): import the submodule you need, e.g.
`from chai_attention.torch_pipeline import ChaiPipeline`. `config` and `steps` are plain Python.
"""
from .config import ChaiConfig, parse_cache_steps

__all__ = ["ChaiConfig", "parse_cache_steps"]
