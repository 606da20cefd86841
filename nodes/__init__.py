"""The ComfyUI face of CHAI: V3 nodes, imported only when ComfyUI asks for the node list."""
from __future__ import annotations

import importlib
import logging
from typing import Any

log = logging.getLogger(__name__)

# Modules that define nodes, each exporting NODES (a list of io.ComfyNode classes), in menu order.
_NODE_MODULES = ("cache_nodes", "chai_nodes", "opensora_nodes", "opensora_vae_nodes", "toy_nodes")


def node_list() -> list[type]:
    """Import the node modules, register the `chai_cache` and toy-weights folders and return every node class."""
    from .paths import register_cache_folder, register_toy_weights_folder

    register_cache_folder()
    register_toy_weights_folder()
    classes: list[type] = []
    for name in _NODE_MODULES:
        try:
            module = importlib.import_module(f".{name}", __name__)
        except ImportError as exc:  # one broken group of nodes must not take the others down
            log.error("[CHAI] the nodes in %s could not be loaded: %s", name, exc)
            continue
        classes.extend(module.NODES)
    return classes


def __getattr__(name: str) -> Any:
    # NODE_CLASSES is built on first access so that importing this package never imports ComfyUI.
    if name == "NODE_CLASSES":
        return node_list()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
