"""ComfyUI-CHAI: cross-request Cache Attention for text-to-video diffusion.

ComfyUI entry point (V3 extension). Importing this file is cheap and imports nothing of ComfyUI, torch or
the pack's optional dependencies; the nodes load when ComfyUI asks for the node list, and a node whose
dependency is missing reports what to install when it runs.
"""
from __future__ import annotations

from typing import Any

# The frontend extension that shows each CHAI node's report on the node (web/chai_reports.js).
WEB_DIRECTORY = "./web"


async def comfy_entrypoint() -> Any:
    """Return the CHAI ComfyExtension (called by ComfyUI after importing the pack)."""
    from comfy_api.v0_0_2 import ComfyExtension

    class ChaiExtension(ComfyExtension):
        """Lists the CHAI nodes."""

        async def get_node_list(self) -> list[type]:
            from .nodes import node_list

            return node_list()

    return ChaiExtension()
