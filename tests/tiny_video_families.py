"""Test-only tiny HunyuanVideo and LTX-Video networks built from ComfyUI's own classes, and their conditioning.

The networks are ComfyUI's `HunyuanVideo` and `LTXVModel` at a tiny size, with random, well-scaled weights, saved
under ComfyUI's own key names so that its loader (UNETLoader / comfy.sd.load_diffusion_model) detects the family
and wraps them in model_base.HunyuanVideo / model_base.LTXV with their latent formats and sampling. ComfyUI is
imported inside the functions only; nothing here runs without a ComfyUI on sys.path.
"""
from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

HUNYUAN_CONTEXT = 32  # text feature width (the real model: 4096, LLaVA-Llama-3); read by the loader from txt_in
HUNYUAN_POOLED = 768  # CLIP-L pooled width: fixed by ComfyUI's loader when vector_in is present
HUNYUAN_HIDDEN = 256  # the loader reads heads as hidden // 128, and RoPE axes [16, 56, 56] need head width 128
LTXV_CAPTION = 4096  # T5-XXL width: LTXV's loader does not read caption channels from the file
LTXV_HEAD = 8  # the loader reads head width as attn2.to_k rows // 32 (32 heads): inner width 256
LTXV_CHANNELS = 128  # LTXV's latent channels (the loader's default in_channels)


def tiny_hunyuan_video(double_blocks: int = 2, single_blocks: int = 1, in_channels: int = 16) -> Any:
    """ComfyUI's HunyuanVideo T2V at hidden 256 (2 heads of 128), with vector_in (CLIP-L) and guidance_in."""
    from comfy import ops
    from comfy.ldm.hunyuan_video.model import HunyuanVideo

    return HunyuanVideo(in_channels=in_channels, out_channels=16, vec_in_dim=HUNYUAN_POOLED,
                        context_in_dim=HUNYUAN_CONTEXT, hidden_size=HUNYUAN_HIDDEN, mlp_ratio=4.0,
                        num_heads=HUNYUAN_HIDDEN // 128, depth=double_blocks, depth_single_blocks=single_blocks,
                        axes_dim=[16, 56, 56], theta=256, patch_size=[1, 2, 2], qkv_bias=True, guidance_embed=True,
                        byt5=False, meanflow=False, operations=ops.disable_weight_init)


def tiny_ltxv(layers: int = 2) -> Any:
    """ComfyUI's LTXVModel with 32 heads of width 8 (inner 256), 128 latent channels, T5-width captions."""
    from comfy import ops
    from comfy.ldm.lightricks.model import LTXVModel

    inner = 32 * LTXV_HEAD
    return LTXVModel(in_channels=LTXV_CHANNELS, cross_attention_dim=inner, attention_head_dim=LTXV_HEAD,
                     num_attention_heads=32, caption_channels=LTXV_CAPTION, num_layers=layers,
                     operations=ops.disable_weight_init)


def random_state(module: Any, gen: Any) -> dict[str, Any]:
    """Random, well-scaled tensors for every state-dict entry: norm gains near 1, matrices ~ 1/sqrt(fan-in),
    small vectors elsewhere (no zeros, so every path, block 0's attention included, visibly matters)."""
    import torch

    state = {}
    for key, value in module.state_dict().items():
        if key.endswith(("norm.scale", "query_norm.scale", "key_norm.scale", "q_norm.weight", "k_norm.weight",
                         "norm1.weight", "norm2.weight")):
            state[key] = 1 + 0.2 * torch.randn(value.shape, generator=gen)
        elif value.dim() >= 2:
            state[key] = torch.randn(value.shape, generator=gen) / value[0].numel() ** 0.5
        else:
            state[key] = 0.1 * torch.randn(value.shape, generator=gen)
    return state


def save_tiny(module: Any, path: Path, seed: int) -> Path:
    """Save `module` with random weights (seeded) under its own key names, as a diffusion-model file."""
    import torch
    from safetensors.torch import save_file

    save_file(random_state(module, torch.Generator().manual_seed(seed)), str(path))
    return path


def _word_vector(word: str, dim: int) -> Any:
    import torch

    seed = int.from_bytes(hashlib.sha256(word.encode()).digest()[:8], "little")
    return torch.randn(dim, generator=torch.Generator().manual_seed(seed))


class VideoCond:
    """Test-only text encoder for HunyuanVideo / LTXV graphs: one hash-seeded vector per word, padded to
    `length` tokens; optionally a pooled vector (HunyuanVideo's CLIP-L input) and an attention mask (as the
    T5 / LLaMA encoders return for padded prompts). The negative is a fixed sequence of the same layout."""

    @classmethod
    def INPUT_TYPES(cls) -> dict:
        return {"required": {"prompt": ("STRING", {"default": ""}), "dim": ("INT", {"default": HUNYUAN_CONTEXT}),
                             "length": ("INT", {"default": 12}), "pooled": ("INT", {"default": 0}),
                             "mask": ("BOOLEAN", {"default": False})}}

    RETURN_TYPES = ("CONDITIONING", "CONDITIONING")
    FUNCTION = "encode"
    CATEGORY = "testing"

    def encode(self, prompt: str, dim: int, length: int, pooled: int, mask: bool) -> tuple:
        return self.conditioning(prompt.lower().split(), dim, length, pooled, mask), self.conditioning(
            [f"<null{i}>" for i in range(2)], dim, length, pooled, mask)

    @staticmethod
    def conditioning(words: list[str], dim: int, length: int, pooled: int, mask: bool) -> list:
        """[[features [1, length, dim], extras]] with the words first and zero padding after them."""
        import torch

        words = (words or ["<empty>"])[:length]
        features = torch.zeros(1, length, dim)
        features[0, :len(words)] = torch.stack([_word_vector(w, dim) for w in words])
        extras: dict[str, Any] = {}
        if pooled:
            extras["pooled_output"] = _word_vector("<pooled>" + " ".join(words), pooled)[None]
        if mask:
            extras["attention_mask"] = (torch.arange(length) < len(words)).long()[None]
        return [[features, extras]]
