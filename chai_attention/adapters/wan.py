"""Cache Attention for ComfyUI's Wan 2.1 / 2.2 text-to-video models (`comfy.ldm.wan.model.WanModel`).

Wan has no spatial-only block: `blocks[0].self_attn` is a full 3-D attention, so donor and live latents are
aligned token by token and a hit needs the same latent shape (RoPE comes from the live call). Installed on a
ModelPatcher clone through two public hooks: a DiT block replace of block 0 marks cache-step calls (it sees the
time embedding e0), and an object patch of block 0's `self_attn.forward` attends with the donor K/V on marked
calls. The donor path, the supported and refused variants and why are in docs/cache-attention.md.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..constants import RUN_KEY, TIMESTEP_SCALE
from ..kv import cache_attention, chunk_row_mask
from ..run import COND, CacheAttentionRun, StepPlan
from ..steps import options_sigma
from .base import ModelAdapter, UnsupportedModelError

CALL_KEY = "chai_wan_call"  # transformer_options key (of block 0's copy only) that marks a cache-step call
ATTN_PATH = "diffusion_model.blocks.0.self_attn"
FIRING_KIND = "self_attn"

# ComfyUI Wan classes whose forward adds streams to the tokens before block 0 or calls blocks differently.
_UNSUPPORTED_CLASSES = {
    "VaceWanModel": "VACE", "CameraWanModel": "Camera", "HumoWanModel": "HuMo", "WanModel_S2V": "S2V",
    "AnimateWanModel": "Animate",
}
_VARIANT_MARKERS = {  # attribute -> variant, for subclasses under other names
    "vace_patch_embedding": "VACE", "control_adapter": "Camera", "audio_proj": "HuMo",
    "casual_audio_encoder": "S2V", "pose_patch_embedding": "Animate",
}
SUPPORTED_TEXT = ("Wan 2.1 T2V (1.3B, 14B), Wan 2.2 T2V A14B (each expert) and Wan 2.2 TI2V 5B used for "
                  "text-to-video")

Rope = Callable[[Tensor, Tensor], Tensor]
AttentionFn = Callable[..., Tensor]


@dataclass(frozen=True)
class WanContext:
    """What block 0's live self-attention call tells the donor path: time embedding, RoPE table, layout."""

    e0: Tensor  # the block's time modulation input (block replace `vec`): [B, 1 | T, 6, dim] or [B, 6, dim]
    freqs: Tensor  # the live call's RoPE table
    tokens: int  # live sequence length L
    dtype: torch.dtype  # live token dtype
    options: Mapping[str, Any] = field(default_factory=dict)  # transformer_options handed to the attention


@dataclass(frozen=True)
class WanCall:
    """Per-call state the block replace hands to the attention patch (only for cache-step calls)."""

    run: CacheAttentionRun
    plan: StepPlan
    flags: tuple[bool, ...]  # per CFG chunk: attends to the donor
    e0: Tensor
    timestep_of: Callable[[float], Tensor]  # flow sigma -> model timestep (for a donor modulated at its own sigma)


def per_token(e: Tensor, tokens: int) -> Tensor:
    """Spread a modulation term [B, n, dim] over `tokens` tokens: as is for n in (1, tokens), else each of the n
    entries (one per latent frame) repeated over its frame's tokens, as WanAttentionBlock does."""
    n = e.shape[1]
    if n in (1, tokens):
        return e
    return e.repeat_interleave(math.ceil(tokens / n), dim=1)[:, :tokens]


def pad_to_patch(z: Tensor, patch: Sequence[int]) -> Tensor:
    """Circular padding of [B, C, *dims] at the end of each dim up to a multiple of the patch size."""
    pad: list[int] = []
    for size, p in zip(reversed(z.shape[2:]), reversed(tuple(patch))):
        pad += [0, (-size) % p]
    return F.pad(z, pad, mode="circular") if any(pad) else z


def sinusoid(dim: int, t: Tensor) -> Tensor:
    """The standard [cos | sin] timestep embedding of width `dim` (Wan's frequency-embedding input)."""
    half = dim // 2
    t = t.to(torch.float32).reshape(-1)
    freqs = torch.pow(10000.0, -torch.arange(half, device=t.device, dtype=torch.float32) / half)
    angles = torch.outer(t, freqs)
    return torch.cat([torch.cos(angles), torch.sin(angles)], dim=1)


def _has_modules(owner: Any, names: Sequence[str]) -> bool:
    return all(isinstance(getattr(owner, n, None), nn.Module) for n in names)


class WanAdapter(ModelAdapter):
    """ComfyUI's Wan 2.1 / 2.2 T2V: block 0 is `blocks[0]`, its 3-D self-attention `blocks[0].self_attn`."""

    family = "wan"
    description = "Wan 2.1 / 2.2 text-to-video (ComfyUI WanModel), blocks[0].self_attn"

    def __init__(self, model: Any, rope: Rope | None = None, attention: AttentionFn | None = None) -> None:
        super().__init__(model)
        reason = self.unsupported_reason(self.model)
        if reason:
            raise UnsupportedModelError(f"CHAI Cache Attention does not support this Wan model: {reason}. "
                                        f"Supported: {SUPPORTED_TEXT}")
        self._rope = rope
        self._attention = attention

    # ---------------------------------------------------------------------------------------- recognition

    @classmethod
    def recognise(cls, model: Any) -> bool:
        """A Wan-structured network: Conv3d patch_embedding, blocks[0] with norm1, modulation and a self_attn
        with q/k/v/o and norm_q/norm_k (by structure, so no ComfyUI import is needed)."""
        if not isinstance(model, nn.Module) or not isinstance(getattr(model, "patch_embedding", None), nn.Conv3d):
            return False
        blocks = getattr(model, "blocks", None)
        if not isinstance(blocks, nn.ModuleList) or len(blocks) == 0:
            return False
        block = blocks[0]
        attn = getattr(block, "self_attn", None)
        return (_has_modules(block, ("norm1",)) and isinstance(getattr(block, "modulation", None), Tensor)
                and attn is not None and _has_modules(attn, ("q", "k", "v", "o", "norm_q", "norm_k"))
                and isinstance(getattr(attn, "num_heads", None), int))

    @staticmethod
    def unsupported_reason(model: nn.Module) -> str | None:
        """Why a recognised Wan network cannot use Cache Attention, or None when it can."""
        name = type(model).__name__
        if name in _UNSUPPORTED_CLASSES:
            return f"{name} is a Wan {_UNSUPPORTED_CLASSES[name]} model"
        for attr, variant in _VARIANT_MARKERS.items():
            if getattr(model, attr, None) is not None:
                return f"{name} has `{attr}`, i.e. it is a Wan {variant} model"
        if getattr(model, "model_type", "t2v") != "t2v" or getattr(model, "img_emb", None) is not None:
            return f"{name} is an image-to-video model (model_type {getattr(model, 'model_type', '?')!r})"
        out_dim = getattr(model, "out_dim", None)
        in_channels = model.patch_embedding.in_channels
        if out_dim is not None and in_channels != out_dim:
            return (f"its input takes {in_channels} channels for a {out_dim}-channel latent (image or control "
                    "channels are concatenated: image-to-video, Fun-Control or inpaint), so a donor latent alone "
                    "cannot be embedded")
        return None

    def first_block(self) -> nn.Module:
        """`blocks[0]`."""
        return self.model.blocks[0]

    def block_self_attention(self) -> nn.Module:
        """`blocks[0].self_attn`."""
        return self.first_block().self_attn

    # ------------------------------------------------------------------- the functions the attention uses

    def _attention_global(self, name: str) -> Callable[..., Tensor]:
        forward = getattr(type(self.block_self_attention()), "forward", None)
        fn = getattr(forward, "__globals__", {}).get(name)
        if fn is None:
            raise RuntimeError(f"{type(self.block_self_attention()).__name__}.forward no longer calls `{name}`: "
                               "this ComfyUI's Wan attention differs from the one CHAI's Wan adapter was written "
                               "for (ComfyUI 0.3.64); update chai_attention/adapters/wan.py")
        return fn

    def rope(self, x: Tensor, freqs: Tensor) -> Tensor:
        """RoPE as the block's attention applies it (ComfyUI's apply_rope1 unless one was given)."""
        fn = self._rope or self._attention_global("apply_rope1")
        return fn(x, freqs)

    def attention_fn(self) -> AttentionFn:
        """The attention function the block's self-attention calls (ComfyUI's optimized_attention)."""
        return self._attention or self._attention_global("optimized_attention")

    # ---------------------------------------------------------------------------------- the donor path

    def modulation(self, e0: Tensor, tokens: Tensor) -> tuple[Tensor, Tensor]:
        """Block 0's adaLN shift and scale for `tokens` [Bd, L, dim] from the live e0 (its first row when the
        donor batch differs: every row of a call shares the timestep)."""
        block = self.first_block()
        if e0.shape[0] != tokens.shape[0]:
            e0 = e0[:1]
        mod = block.modulation.to(device=tokens.device, dtype=tokens.dtype)
        parts = (mod + e0).chunk(6, dim=1) if e0.dim() < 4 else (mod.unsqueeze(0) + e0).unbind(2)
        n = tokens.shape[1]
        return per_token(parts[0], n), per_token(parts[1], n)

    def embed(self, donor: Tensor, context: WanContext) -> Tensor:
        """Donor latent [C, T, H, W] or [Bd, C, T, H, W] -> patch tokens [Bd, L, dim] in the live dtype."""
        z = donor[None] if donor.dim() == 4 else donor
        if z.dim() != 5:
            raise ValueError(f"a Wan donor latent is [C, T, H, W] or [B, C, T, H, W], got {tuple(donor.shape)}")
        pe = self.model.patch_embedding
        if z.shape[1] != pe.in_channels:
            raise ValueError(f"donor latent {tuple(z.shape)} has {z.shape[1]} channels, the model {pe.in_channels}")
        z = pad_to_patch(z.to(device=context.freqs.device, dtype=context.dtype), pe.kernel_size)
        tokens = pe(z.float()).to(context.dtype).flatten(2).transpose(1, 2)
        self._check_positions(donor.shape[-3:], tokens.shape[1], context)
        return tokens

    def _check_positions(self, dims: Sequence[int], tokens: int, context: WanContext) -> None:
        """The donor's token grid must be the live one: same count and, where the model can say, same RoPE."""
        message = (f"donor latent grid {tuple(dims)} gives {tokens} tokens but the live call has {context.tokens}"
                   if tokens != context.tokens else None)
        rope_encode = getattr(self.model, "rope_encode", None)
        if message is None and callable(rope_encode):
            own = rope_encode(*dims, device=context.freqs.device, dtype=context.dtype)
            if own.shape != context.freqs.shape or not torch.equal(own.to(context.freqs.dtype), context.freqs):
                message = f"donor latent grid {tuple(dims)} has other token positions than the live latent"
        if message:
            raise ValueError(f"{message}: Wan Cache Attention needs the donor latent to have the live latent's "
                             "shape (same resolution and frame count, no extra reference frames)")

    def donor_tokens(self, donor: Tensor, context: WanContext) -> Tensor:
        """Donor latent -> block 0's modulated self-attention input [Bd, L, dim] at the context's e0."""
        tokens = self.embed(donor, context)
        shift, scale = self.modulation(context.e0, tokens)
        return torch.addcmul(shift, self.first_block().norm1(tokens), 1 + scale)

    def donor_kv(self, donor: Tensor, context: WanContext) -> tuple[Tensor, Tensor]:
        """Donor K/V [Bd, heads, L, head_dim]: block 0's k + norm_k + RoPE (live freqs) and v."""
        attn = self.block_self_attention()
        h = self.donor_tokens(donor, context)
        b, s, n = h.shape[0], h.shape[1], attn.num_heads
        k = self.rope(attn.norm_k(attn.k(h)).view(b, s, n, -1), context.freqs)
        v = attn.v(h).view(b, s, n, -1)
        return k.transpose(1, 2), v.transpose(1, 2)

    def attend(self, q: Tensor, k: Tensor, v: Tensor, context: WanContext | None = None) -> Tensor:
        """q/k/v [R, heads, N, head_dim] -> the attention function on [R, N, heads*head_dim], then `o`."""
        attn = self.block_self_attention()
        heads = q.shape[1]

        def flat(t: Tensor) -> Tensor:
            return t.transpose(1, 2).reshape(t.shape[0], t.shape[2], heads * t.shape[3])

        options = dict(context.options) if context is not None else {}
        out = self.attention_fn()(flat(q), flat(k), flat(v), heads=heads, transformer_options=options)
        return attn.o(out)

    def time_modulation(self, sigma: float, timestep_of: Callable[[float], Tensor], like: Tensor) -> Tensor:
        """e0 [1, 1, 6, dim] for a flow sigma through the model's time embedding (a donor modulated at its own
        noise level, donor mapping `final_clean`)."""
        dm = self.model
        t = timestep_of(sigma).to(like.device)
        e = dm.time_embedding(sinusoid(dm.freq_dim, t).to(like.dtype)).reshape(1, -1, like.shape[-1])
        return dm.time_projection(e).unflatten(2, (6, like.shape[-1]))

    # ------------------------------------------------------------------------------------ cache attention

    def check_run(self, run: CacheAttentionRun, latent_shape: Sequence[int] | None = None) -> None:
        """Donors must be [C, T, H, W] / [B, C, T, H, W] latents of the model's channels and, when the sampled
        latent's shape is given, of its shape: Wan Cache Attention aligns tokens by position."""
        shape = tuple(run.donors.shape)
        channels = self.model.patch_embedding.in_channels
        if len(shape) not in (4, 5) or shape[-4] != channels:
            raise ValueError(f"donor latents of shape {shape} are not {channels}-channel Wan video latents "
                             "([C, T, H, W] or [B, C, T, H, W])")
        if latent_shape is not None and tuple(latent_shape)[-4:] != shape[-4:]:
            raise ValueError(f"donor latents {shape} and the latent being sampled {tuple(latent_shape)} differ in "
                             "shape: Wan Cache Attention needs the same resolution and frame count (token "
                             "positions are shared through RoPE)")

    def cache_self_attention(self, x: Tensor, freqs: Tensor, options: Mapping[str, Any], call: WanCall) -> Tensor:
        """Block 0's self-attention at a cache step: live queries, donor keys/values on the flagged CFG rows."""
        attn = self.block_self_attention()
        b, s, n = x.shape[0], x.shape[1], attn.num_heads
        # The same projections, in the same order, as WanSelfAttention.forward.
        q = self.rope(attn.norm_q(attn.q(x)).view(b, s, n, -1), freqs)
        k = self.rope(attn.norm_k(attn.k(x)).view(b, s, n, -1), freqs)
        v = attn.v(x).view(b, s, n, -1)
        run, plan = call.run, call.plan
        context = WanContext(call.e0, freqs, s, x.dtype, options)
        if plan.modulation_sigma != plan.sigma:
            context = WanContext(self.time_modulation(plan.modulation_sigma, call.timestep_of, call.e0), freqs, s,
                                 x.dtype, options)
        key = (tuple(x.shape[1:]), str(x.device), x.dtype)
        k_d, v_d = run.donor_kv(plan, key, lambda: self.donor_kv(plan.donor_latent, context))
        rows = chunk_row_mask(call.flags, b, x.device)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)

        def attend(q_: Tensor, k_: Tensor, v_: Tensor) -> Tensor:
            return self.attend(q_, k_, v_, context)

        if bool(rows.all()):
            out = cache_attention(q, k, v, k_d, v_d, attend, mode=run.config.kv_mode)
        else:
            # Rows that keep their own K/V (the uncond half under apply_to="cond") come out of the very
            # computation the unpatched block runs, on the whole batch, so they stay bit-identical whatever
            # batch-size-dependent kernels the attention or the output projection pick.
            out = attend(q, k, v)
            out[rows] = cache_attention(q[rows], k[rows], v[rows], k_d, v_d, attend,
                                        mode=run.config.kv_mode).to(out.dtype)
        run.record(plan, FIRING_KIND, 0, int(rows.sum()), int(rows.numel()))
        return out

    def call_for(self, options: Mapping[str, Any], e0: Tensor, run_key: str = RUN_KEY,
                 timestep_of: Callable[[float], Tensor] | None = None) -> WanCall | None:
        """The cache-step state for a block-0 call, or None (no run, no sigma, not a cache step, no row on)."""
        run = options.get(run_key)
        if run is None:
            return None
        sigma = options_sigma(options)
        if sigma is None:
            return None
        plan = run.plan_for(sigma)
        if plan is None:
            return None
        flags = tuple(run.chunk_flags(tuple(int(c) for c in options.get("cond_or_uncond") or (COND,))))
        if not any(flags):
            return None
        return WanCall(run, plan, flags, e0, timestep_of or _flow_timestep)

    def block_replace(self, run_key: str = RUN_KEY, timestep_of: Callable[[float], Tensor] | None = None,
                      previous: Callable[..., dict] | None = None) -> Callable[[dict, dict], dict]:
        """The `("double_block", 0)` replace: marks cache-step calls of block 0 for the attention patch."""

        def chai_wan_block0(args: dict, extra: dict) -> dict:
            options = args.get("transformer_options") or {}
            call = self.call_for(options, args["vec"], run_key, timestep_of)
            if call is not None:
                args = {**args, "transformer_options": {**options, CALL_KEY: call}}
            return previous(args, extra) if previous is not None else extra["original_block"](args)

        chai_wan_block0.chai_wan_previous = previous  # type: ignore[attr-defined]
        return chai_wan_block0

    def attention_patch(self, original: Callable[..., Tensor]) -> Callable[..., Tensor]:
        """The replacement for `blocks[0].self_attn.forward`: cache attention when the call is marked."""

        def chai_wan_self_attn(x: Tensor, freqs: Tensor, transformer_options: Mapping[str, Any] = {},
                               **kwargs: Any) -> Tensor:
            call = transformer_options.get(CALL_KEY) if transformer_options else None
            if call is None:
                return original(x, freqs, transformer_options=transformer_options, **kwargs)
            return self.cache_self_attention(x, freqs, transformer_options, call)

        chai_wan_self_attn.chai_wan_original = original  # type: ignore[attr-defined]
        return chai_wan_self_attn

    def comfy_install(self, patcher: Any, run_key: str = RUN_KEY) -> None:
        """Patch a ModelPatcher clone: block-0 DiT replace plus an object patch of block 0's self_attn.forward.

        Runs only when transformer_options[run_key] holds a CacheAttentionRun; the original model is untouched
        (ComfyUI applies object patches when it loads this clone and restores them when it unloads it).
        """
        if patcher.get_model_object("diffusion_model") is not self.model:
            raise ValueError("comfy_install: the adapter was built for another model than this patcher's")
        sampling = patcher.get_model_object("model_sampling")

        def timestep_of(sigma: float) -> Tensor:
            return sampling.timestep(torch.tensor([float(sigma)])).float()

        replaces = patcher.model_options.get("transformer_options", {}).get("patches_replace", {}).get("dit", {})
        previous = replaces.get(("double_block", 0))
        if previous is not None and hasattr(previous, "chai_wan_previous"):
            previous = previous.chai_wan_previous  # reinstalled: replace our own patch instead of stacking it
        original = patcher.get_model_object(ATTN_PATH + ".forward")
        original = getattr(original, "chai_wan_original", original)
        patcher.set_model_patch_replace(self.block_replace(run_key, timestep_of, previous), "dit", "double_block", 0)
        patcher.add_object_patch(ATTN_PATH + ".forward", self.attention_patch(original))


def _flow_timestep(sigma: float) -> Tensor:
    """Wan's default flow timestep, 1000 * sigma (used outside ComfyUI)."""
    return torch.tensor([float(sigma) * TIMESTEP_SCALE])
