"""The ComfyUI face of CHAI: V3 nodes, imported only when ComfyUI asks for the node list."""
from __future__ import annotations

import logging
from types import ModuleType
from typing import Any, Callable

from .paths import register_cache_folder, register_toy_weights_folder

log = logging.getLogger(__name__)


def _cache_nodes() -> ModuleType:
    from . import cache_nodes

    return cache_nodes


def _chai_nodes() -> ModuleType:
    from . import chai_nodes

    return chai_nodes


def _apply_nodes() -> ModuleType:
    from . import apply_nodes

    return apply_nodes


def _opensora_nodes() -> ModuleType:
    from . import opensora_nodes

    return opensora_nodes


def _opensora_vae_nodes() -> ModuleType:
    from . import opensora_vae_nodes

    return opensora_vae_nodes


def _toy_nodes() -> ModuleType:
    from . import toy_nodes

    return toy_nodes


# The modules that define nodes, each exporting NODES (a list of io.ComfyNode classes), in menu order; each is
# imported on its own so that one broken group of nodes cannot take the others down.
_NODE_MODULES: tuple[Callable[[], ModuleType], ...] = (
    _cache_nodes, _chai_nodes, _apply_nodes, _opensora_nodes, _opensora_vae_nodes, _toy_nodes)


def node_list() -> list[type]:
    """Import the node modules, register the `chai_cache` and toy-weights folders and return every node class."""
    register_cache_folder()
    register_toy_weights_folder()
    classes: list[type] = []
    for load in _NODE_MODULES:
        try:
            module = load()
        except ImportError as exc:
            log.error("[CHAI] the nodes in %s could not be loaded: %s", load.__name__.strip("_"), exc)
            continue
        classes.extend(module.NODES)
    return classes


def __getattr__(name: str) -> Any:
    # NODE_CLASSES is built on first access so that importing this package never imports ComfyUI.
    if name == "NODE_CLASSES":
        return node_list()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
