"""A test-only ComfyUI output node that records its inputs, for tier-2 tests (no ComfyUI import needed here)."""
from __future__ import annotations

from typing import Any


def capture_node(store: dict[str, dict[str, Any]], optional: dict[str, tuple], as_lists: bool = False) -> type:
    """A V1 output node class whose `run(key, **inputs)` stores the inputs under `store[key]`.

    `optional` maps input names to ComfyUI input specs. With `as_lists` the node takes whole lists (INPUT_IS_LIST,
    e.g. from CHAI Prompt List); a one-element list is stored as its element.
    """

    class Capture:
        """Test-only output node: stores whatever it is given under `key`."""

        RETURN_TYPES = ()
        FUNCTION = "run"
        OUTPUT_NODE = True
        CATEGORY = "testing"
        INPUT_IS_LIST = as_lists

        @classmethod
        def INPUT_TYPES(cls) -> dict:
            return {"required": {"key": ("STRING", {"default": "x"})}, "optional": dict(optional)}

        def run(self, key: Any, **kwargs: Any) -> dict:
            if as_lists:
                store[key[0]] = {k: (v[0] if len(v) == 1 else v) for k, v in kwargs.items()}
            else:
                store[key] = kwargs
            return {}

    return Capture
