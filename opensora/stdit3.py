"""STDiT3, the Open-Sora 1.2 video diffusion transformer, in plain torch (XL/2 by default, any size by config).

Module and parameter names equal the official `hpcai-tech/OpenSora-STDiT-v3/model.safetensors` names, so its
state dict loads 1:1 (see `opensora.loading`).

Output convention (rectified flow, Open-Sora orientation). With sigma = timestep / 1000 and

    x_t = (1 - sigma) * x0 + sigma * noise          (timestep 1000 = pure noise, 0 = clean latent),

`forward` returns a float32 tensor [B, out_channels, T, H, W] whose first `in_channels` (4) channels are the
velocity v = x0 - noise, pointing from noise towards data; the remaining channels (the "sigma" half, present when
`pred_sigma`) are unused at inference. The Open-Sora sampler steps towards data with
`x <- x + v * (t_i - t_{i+1}) / 1000`. ComfyUI's flow models (CONST sampling: denoised = x - sigma * out) expect
the opposite sign, so a ComfyUI wrapper must return `-out[:, :4]`; then denoised = x + sigma * v = x0.

forward(x, timestep, y, mask=None, fps=None, height=None, width=None, *, y_drop=None, attn_replace=None,
        transformer_options=None):
  * x: latent [B, in_channels, T, H, W] (any T/H/W; padded to whole patches inside, cropped back);
  * timestep: Open-Sora units in [0, 1000] (1000 = noise), a number or [B];
  * y: T5 features [B, 1, L, caption_channels] (L <= model_max_length; [B, L, Cc] also accepted);
  * mask: [B, L] (or [1, L], repeated) valid-token mask, 1/0 or bool; None = all valid;
  * fps: number or [B]; default 24, or 120 for a single latent frame (Open-Sora's image fps);
  * height, width: nominal pixel size (number or tensor, first element used) setting the position-embedding
    scale; default 8x the latent size, but pass the true size (426, not 424, for 240p 9:16);
  * y_drop: [B] bool, replace those samples' captions with the null caption `y_embedder.y_embedding`;
  * attn_replace, transformer_options: see below.

Hooks for attention patches (Cache Attention targets `model.spatial_blocks[0]`):
  * `SelfAttention.qkv_heads(x, rope)` -> (q, k, v) per head after q/k RMS-norm and RoPE;
    `SelfAttention.attend(q, k, v)` -> heads merged and projected (what `forward` returns).
  * `STDiT3Block.modulated_attn_input(x, t_mlp)` -> LN(x) * (1 + scale_msa) + shift_msa, in token layout
    [B, T*S, C]; `to_attn_layout` / `from_attn_layout` move between that layout and the block's attention layout.
  * `STDiT3.embed_video(z, height, width)` and `STDiT3.embed_timestep(timestep, fps, batch)` run the model's
    input pipeline on another latent (e.g. a cached one) and timestep (e.g. 0 for a clean latent).
  * `forward(..., attn_replace={("spatial_attn", 0): fn})`: `fn(call: SelfAttnCall) -> Tensor` replaces the
    self-attention of that block; it gets q, k, v and the modulated input and returns the projected attention
    output in the attention layout (usually `call.block.attn.attend(q, k2, v2)`). Gating and residual stay intact.

ComfyUI's DiT contract, as ComfyUI's own Wan honours it (`forward(..., transformer_options=...)`):
  * block patches: `transformer_options["patches_replace"]["dit"][(SPATIAL_BLOCK, i)]` (and `(TEMPORAL_BLOCK, i)`)
    replaces block i: it is called as `patch(args, {"original_block": fn})` with args {"x" [B, T*S, C], "y",
    "t_mlp", "y_mask", "T", "S", "rope", "transformer_options"}; `fn(args)` runs the block and returns {"x": ...};
    the block's output is the returned dict's "x";
  * the attention override `transformer_options["optimized_attention_override"]`, in the options a block is
    given, is called by that block's self-attention (see `opensora.stdit3_layers`).
"""
from __future__ import annotations

import math
from typing import Any, Callable, Iterable, Mapping, cast

import torch
from einops import rearrange
from torch import Tensor, nn

from .stdit3_config import DEFAULT_FPS, FREQ_EMBED_DIM, IMAGE_FPS, VAE_DOWNSCALE, STDiT3Config
from .stdit3_layers import (OVERRIDE_KEY, AttnReplace, CaptionEmbedder, Layers, PatchEmbed3D, RotaryEmbedding, SelfAttention,
                            SelfAttnCall, STDiT3Block, T2IFinalLayer, TimestepEmbedder, apply_rope, rope_cos_sin,
                            rope_frequencies, sdpa_attention, sincos_pos_embed_2d, t2i_modulate,
                            timestep_sinusoid)

PATCH_GROUP = "dit"  # transformer_options["patches_replace"] group of the block patches (ComfyUI's DiT convention)
SPATIAL_BLOCK, TEMPORAL_BLOCK = "spatial_block", "temporal_block"  # block patch keys: (SPATIAL_BLOCK, i)

BlockPatch = Callable[[dict, dict], dict]


# ---------------------------------------------------------------------------------------------- model

def _first_scalar(value: Any, name: str) -> float:
    """A python float from a number or a tensor (first element, as Open-Sora reads height/width)."""
    if isinstance(value, Tensor):
        if value.numel() == 0:
            raise ValueError(f"{name} is an empty tensor")
        return float(value.reshape(-1)[0].item())
    return float(value)


def _per_sample(value: Any, batch: int, device: torch.device, name: str) -> Tensor:
    """A float tensor [batch] from a number or a tensor of 1 or batch elements."""
    t = torch.as_tensor(value, device=device).reshape(-1)
    if t.numel() == 1:
        t = t.expand(batch)
    elif t.numel() != batch:
        raise ValueError(f"{name} has {t.numel()} values for a batch of {batch}")
    return t


def _blocks(blocks: nn.ModuleList) -> Iterable[STDiT3Block]:
    """spatial_blocks or temporal_blocks as the STDiT3Blocks they hold (a ModuleList's items are untyped)."""
    return cast(Iterable[STDiT3Block], blocks)


def _run_block(block: STDiT3Block, patch: BlockPatch | None, args: dict[str, Any], replace: AttnReplace | None,
               index: int, info: dict[str, Any], options: dict[str, Any]) -> Tensor:
    """One block, through its block patch when transformer_options hold one (see the module docstring)."""

    def original(a: dict[str, Any]) -> dict[str, Tensor]:
        return {"x": block(a["x"], a["y"], a["t_mlp"], a["y_mask"], a["T"], a["S"], a["rope"], replace, index, info,
                           a.get("transformer_options"))}

    if patch is None:
        return original({**args, "transformer_options": options})["x"]
    return patch({**args, "transformer_options": options}, {"original_block": original})["x"]


class STDiT3(nn.Module):
    """Open-Sora 1.2 STDiT3 (spatial-temporal DiT with adaLN-single, RoPE temporal attention and T5 cross-attention)."""

    def __init__(self, config: STDiT3Config | None = None, *, operations: Any = None,
                 device: torch.device | str | None = None, dtype: torch.dtype | None = None,
                 **overrides: Any) -> None:
        # config defaults to XL/2 and is updated by field `overrides`; operations: namespace with Linear, Conv3d
        # and LayerNorm classes (default torch.nn); device/dtype: where and how the weights are created.
        super().__init__()
        cfg = config or STDiT3Config()
        if overrides:
            cfg = STDiT3Config.from_dict({**cfg.to_dict(), **overrides})
        self.config = cfg
        self._compute_dtype: torch.dtype | None = None
        mk = Layers(operations or nn, device, dtype)
        c = cfg.hidden_size
        self.rope = RotaryEmbedding(cfg.head_dim, cfg.rope_theta, mk)
        self.x_embedder = PatchEmbed3D(cfg.patch_size, cfg.in_channels, c, mk)
        self.t_embedder = TimestepEmbedder(c, mk=mk)
        self.fps_embedder = TimestepEmbedder(c, mk=mk)
        self.t_block = nn.Sequential(nn.SiLU(), mk.linear(c, 6 * c))
        self.y_embedder = CaptionEmbedder(cfg.caption_channels, c, cfg.model_max_length, mk)
        self.spatial_blocks = nn.ModuleList(STDiT3Block(cfg, False, mk) for _ in range(cfg.depth))
        self.temporal_blocks = nn.ModuleList(STDiT3Block(cfg, True, mk) for _ in range(cfg.depth))
        self.final_layer = T2IFinalLayer(c, math.prod(cfg.patch_size), cfg.out_channels, cfg.norm_eps, mk)
        if not self.x_embedder.proj.weight.is_meta:
            self.init_tables()

    @torch.no_grad()
    def init_tables(self) -> None:
        """Fill the modulation tables and the null caption with N(0, 1/width), as Open-Sora initialises them."""
        # Not done by factory calls in the constructors: random factories on "meta" pull in torch._dynamo.
        blocks: list[STDiT3Block | T2IFinalLayer] = [*_blocks(self.spatial_blocks), *_blocks(self.temporal_blocks),
                                                     self.final_layer]
        for block in blocks:
            block.scale_shift_table.normal_(0.0, self.config.hidden_size ** -0.5)
        self.y_embedder.y_embedding.normal_(0.0, self.config.caption_channels ** -0.5)

    @property
    def dtype(self) -> torch.dtype:
        """Compute dtype: the weights' dtype unless set (e.g. weights stored in fp8, cast per layer on the fly)."""
        return self._compute_dtype or self.x_embedder.proj.weight.dtype

    @dtype.setter
    def dtype(self, value: torch.dtype | None) -> None:
        self._compute_dtype = value

    @property
    def device(self) -> torch.device:
        """Device of the weights."""
        return self.x_embedder.proj.weight.device

    def patch_grid(self, t: int, h: int, w: int) -> tuple[int, int, int]:
        """Token grid (T, Hp, Wp) for a latent of t frames and h x w cells (padded up to whole patches)."""
        pt, ph, pw = self.config.patch_size
        return -(-t // pt), -(-h // ph), -(-w // pw)

    def position_embedding(self, hp: int, wp: int, height: float, width: float,
                           device: torch.device | None = None) -> Tensor:
        """[1, hp*wp, C] table in the model dtype; height/width are the nominal pixel size (sets the scale)."""
        scale = math.sqrt(height * width) / self.config.input_sq_size
        base_size = round(math.sqrt(hp * wp))
        table = sincos_pos_embed_2d(self.config.hidden_size, hp, wp, scale, base_size, device or self.device,
                                    self.dtype)
        return table.to(self.dtype)

    def embed_video(self, z: Tensor, height: Any = None, width: Any = None) -> Tensor:
        """Patch-embed a latent z [B, C, T, H, W] and add the position table: the input of `spatial_blocks[0]`."""
        _, _, tx, hx, wx = z.shape
        t, hp, wp = self.patch_grid(tx, hx, wx)
        height_px = _first_scalar(height, "height") if height is not None else float(hx * VAE_DOWNSCALE)
        width_px = _first_scalar(width, "width") if width is not None else float(wx * VAE_DOWNSCALE)
        pos = self.position_embedding(hp, wp, height_px, width_px, z.device)
        h = self.x_embedder(z.to(self.dtype))
        return (h.unflatten(1, (t, hp * wp)) + pos[:, None]).flatten(1, 2)

    def embed_timestep(self, timestep: Any, fps: Any, batch: int,
                       device: torch.device | None = None) -> tuple[Tensor, Tensor]:
        """(t [B, C], t_mlp [B, 6C]) for timesteps in [0, 1000] and fps; t feeds the final layer, t_mlp the blocks."""
        # The timestep is rounded to the model dtype before the sinusoid, as Open-Sora does. `device` (default:
        # the timestep tensor's, else the weights') is where the computation runs: under ComfyUI's partial
        # offload the weights may sit elsewhere and comfy.ops layers cast them to their input's device.
        if device is None:
            device = timestep.device if isinstance(timestep, Tensor) else self.device
        ts = _per_sample(timestep, batch, device, "timestep").to(self.dtype)
        fs = _per_sample(fps, batch, device, "fps").float()
        t = self.t_embedder(ts, self.dtype) + self.fps_embedder(fs, self.dtype)
        return t, self.t_block(t)

    def null_caption(self, batch: int = 1, length: int | None = None) -> Tensor:
        """The null caption [batch, 1, length, caption_channels]: the first `length` rows of `y_embedding`."""
        table = self.y_embedder.y_embedding
        length = table.shape[0] if length is None else length
        if not 0 < length <= table.shape[0]:
            raise ValueError(f"null caption length must be in 1..{table.shape[0]}, got {length}")
        return table[:length][None, None].expand(batch, 1, length, table.shape[1])

    def encode_text(self, y: Tensor, mask: Tensor | None, batch: int,
                    drop: Tensor | None = None) -> tuple[Tensor, Tensor | None]:
        """Project T5 features y [B, 1, L, Cc] (or [B, L, Cc]) -> ([B, L', C], bool mask [B, L'] or None)."""
        # mask [B or 1, L] marks valid tokens (a smaller batch is repeated, as Open-Sora does for CFG); columns
        # invalid for every sample are dropped. drop [B] bool swaps rows for the null caption.
        if y.dim() == 4:
            if y.shape[1] != 1:
                raise ValueError(f"y must be [B, 1, L, {self.config.caption_channels}], got {list(y.shape)}")
            y = y[:, 0]
        if y.dim() != 3 or y.shape[-1] != self.config.caption_channels:
            raise ValueError(f"y must be [B, 1, L, {self.config.caption_channels}], got {list(y.shape)}")
        if y.shape[0] != batch:
            if y.shape[0] != 1:
                raise ValueError(f"y has batch {y.shape[0]} for a latent batch of {batch}")
            y = y.expand(batch, -1, -1)
        y_mask = None
        if mask is not None:
            m = mask.to(device=y.device).reshape(mask.shape[0], -1) != 0
            if m.shape[1] != y.shape[1]:
                raise ValueError(f"mask covers {m.shape[1]} tokens but y has {y.shape[1]}")
            if m.shape[0] != batch:
                if batch % m.shape[0]:
                    raise ValueError(f"mask batch {m.shape[0]} does not divide the batch {batch}")
                m = m.repeat(batch // m.shape[0], 1)
            if not bool(m.any(dim=1).all()):
                raise ValueError("every sample needs at least one valid caption token in mask")
            keep = m.any(dim=0)
            if not bool(keep.all()):
                y, m = y[:, keep], m[:, keep]
            y_mask = None if bool(m.all()) else m
        out = self.y_embedder(y.to(self.dtype), drop)
        return out, y_mask

    def unpatchify(self, x: Tensor, grid: tuple[int, int, int], size: tuple[int, int, int]) -> Tensor:
        """[B, T*Hp*Wp, pt*ph*pw*out] -> [B, out, T, H, W] cropped to the unpadded latent size."""
        pt, ph, pw = self.config.patch_size
        t, hp, wp = grid
        x = rearrange(x, "b (t h w) (pt ph pw c) -> b c (t pt) (h ph) (w pw)", t=t, h=hp, w=wp, pt=pt, ph=ph, pw=pw)
        return x[:, :, : size[0], : size[1], : size[2]]

    def forward(self, x: Tensor, timestep: Any, y: Tensor, mask: Tensor | None = None, fps: Any = None,
                height: Any = None, width: Any = None, *, y_drop: Tensor | None = None,
                attn_replace: Mapping[tuple[str, int], AttnReplace] | None = None,
                transformer_options: Mapping[str, Any] | None = None) -> Tensor:
        """Float32 [B, out_channels, T, H, W] flow prediction for latent x (arguments: see the module docstring)."""
        if x.dim() != 5 or x.shape[1] != self.config.in_channels:
            raise ValueError(f"x must be [B, {self.config.in_channels}, T, H, W], got {list(x.shape)}")
        b, _, tx, hx, wx = x.shape
        grid = self.patch_grid(tx, hx, wx)
        s = grid[1] * grid[2]
        if fps is None:
            fps = IMAGE_FPS if tx == 1 else DEFAULT_FPS
        h = self.embed_video(x, height, width)
        t, t_mlp = self.embed_timestep(timestep, fps, b, x.device)
        y_tokens, y_mask = self.encode_text(y, mask, b, y_drop)
        rope = tuple(r.to(x.device) for r in self.rope.cos_sin(grid[0]))
        info = {"timestep": timestep, "fps": fps, "height": height, "width": width} if attn_replace else {}
        replace = attn_replace or {}
        options = dict(transformer_options or {})
        patches = (options.get("patches_replace") or {}).get(PATCH_GROUP) or {}
        for i, (spatial, temporal) in enumerate(zip(_blocks(self.spatial_blocks), _blocks(self.temporal_blocks))):
            args = {"y": y_tokens, "t_mlp": t_mlp, "y_mask": y_mask, "T": grid[0], "S": s}
            h = _run_block(spatial, patches.get((SPATIAL_BLOCK, i)), {**args, "x": h, "rope": None},
                           replace.get(("spatial_attn", i)), i, info, options)
            h = _run_block(temporal, patches.get((TEMPORAL_BLOCK, i)), {**args, "x": h, "rope": rope},
                           replace.get(("temporal_attn", i)), i, info, options)
        out = self.unpatchify(self.final_layer(h, t), grid, (tx, hx, wx))
        return out.float()


__all__ = [
    "STDiT3", "STDiT3Config", "STDiT3Block", "SelfAttention", "SelfAttnCall", "AttnReplace", "Layers",
    "PATCH_GROUP", "SPATIAL_BLOCK", "TEMPORAL_BLOCK", "OVERRIDE_KEY", "sdpa_attention",
    "DEFAULT_FPS", "FREQ_EMBED_DIM", "IMAGE_FPS", "VAE_DOWNSCALE", "apply_rope", "rope_cos_sin", "rope_frequencies",
    "sincos_pos_embed_2d", "t2i_modulate", "timestep_sinusoid",
]
