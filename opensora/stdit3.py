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

forward(x, timestep, y, mask=None, fps=None, height=None, width=None, *, y_drop=None, attn_replace=None):
  * x: latent [B, in_channels, T, H, W] (any T/H/W; padded to whole patches inside, cropped back);
  * timestep: Open-Sora units in [0, 1000] (1000 = noise), a number or [B];
  * y: T5 features [B, 1, L, caption_channels] (L <= model_max_length; [B, L, Cc] also accepted);
  * mask: [B, L] (or [1, L], repeated) valid-token mask, 1/0 or bool; None = all valid;
  * fps: number or [B]; default 24, or 120 for a single latent frame (Open-Sora's image fps);
  * height, width: nominal pixel size (number or tensor, first element used) setting the position-embedding
    scale; default 8x the latent size, but pass the true size (426, not 424, for 240p 9:16);
  * y_drop: [B] bool, replace those samples' captions with the null caption `y_embedder.y_embedding`;
  * attn_replace: see below.

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
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, fields
from functools import lru_cache
from typing import Any, Callable, Mapping

import torch
import torch.nn.functional as F
from einops import rearrange
from torch import Tensor, nn

VAE_DOWNSCALE = 8  # pixels per latent cell, used when the nominal pixel size is not given
DEFAULT_FPS = 24.0
IMAGE_FPS = 120.0  # Open-Sora conditions single images on fps 120
FREQ_EMBED_DIM = 256  # sinusoid width fed to the timestep and fps MLPs


@dataclass(frozen=True)
class STDiT3Config:
    """Architecture of an STDiT3 model; the defaults are STDiT3-XL/2 as released with Open-Sora 1.2."""

    hidden_size: int = 1152
    depth: int = 28  # spatial blocks; there are as many temporal blocks, interleaved
    num_heads: int = 16
    mlp_ratio: float = 4.0
    patch_size: tuple[int, int, int] = (1, 2, 2)
    in_channels: int = 4
    pred_sigma: bool = True  # the model also outputs a (discarded) sigma half: out_channels = 2 * in_channels
    caption_channels: int = 4096  # T5-XXL d_model
    model_max_length: int = 300  # T5 tokens; rows of the null-caption table
    qk_norm: bool = True
    input_sq_size: int = 512  # reference side (pixels) of the position-embedding scale
    norm_eps: float = 1e-6  # layer norms and q/k RMS norms
    rope_theta: float = 10000.0

    def __post_init__(self) -> None:
        object.__setattr__(self, "patch_size", tuple(int(p) for p in self.patch_size))
        for name in ("hidden_size", "depth", "num_heads", "in_channels", "caption_channels", "model_max_length",
                     "input_sq_size"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"STDiT3Config.{name} must be a positive int, got {value!r}")
        if len(self.patch_size) != 3 or min(self.patch_size) <= 0:
            raise ValueError(f"STDiT3Config.patch_size must be three positive ints (t, h, w), got {self.patch_size}")
        if self.hidden_size % self.num_heads:
            raise ValueError(f"hidden_size {self.hidden_size} is not divisible by num_heads {self.num_heads}")
        if self.head_dim % 2:
            raise ValueError(f"head_dim {self.head_dim} must be even (RoPE rotates pairs)")
        if self.hidden_size % 4:
            raise ValueError(f"hidden_size {self.hidden_size} must be divisible by 4 (2-D sin-cos embedding)")
        if self.mlp_ratio <= 0 or int(self.hidden_size * self.mlp_ratio) <= 0:
            raise ValueError(f"mlp_ratio must be positive, got {self.mlp_ratio}")
        if self.norm_eps <= 0 or self.rope_theta <= 0:
            raise ValueError("norm_eps and rope_theta must be positive")

    @property
    def head_dim(self) -> int:
        """Width of one attention head (72 for XL/2)."""
        return self.hidden_size // self.num_heads

    @property
    def out_channels(self) -> int:
        """Output channels: velocity, plus the sigma half when pred_sigma."""
        return self.in_channels * (2 if self.pred_sigma else 1)

    @property
    def mlp_hidden(self) -> int:
        """Hidden width of the block MLPs (4608 for XL/2)."""
        return int(self.hidden_size * self.mlp_ratio)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict of the fields."""
        out = asdict(self)
        out["patch_size"] = list(self.patch_size)
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "STDiT3Config":
        """Build from a dict such as `to_dict()` wrote; unknown fields are an error."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"unknown STDiT3Config fields: {unknown}")
        return cls(**dict(data))


# ---------------------------------------------------------------------------------------------- maths helpers

def timestep_sinusoid(t: Tensor, dim: int = FREQ_EMBED_DIM, max_period: float = 10000.0) -> Tensor:
    """Sinusoidal embedding [N, dim] of scalars t [N], cos half first, computed in float32."""
    half = dim // 2
    freqs = torch.exp(-math.log(max_period) * torch.arange(half, dtype=torch.float32, device=t.device) / half)
    args = t.float()[:, None] * freqs[None]
    emb = torch.cat([torch.cos(args), torch.sin(args)], dim=-1)
    if dim % 2:
        emb = F.pad(emb, (0, 1))
    return emb


@lru_cache(maxsize=32)
def _sincos_2d(dim: int, hp: int, wp: int, scale: float, base_size: int, device: str,
               freq_dtype: torch.dtype) -> Tensor:
    """Cached float32 [1, hp*wp, dim] 2-D sin-cos table (see `sincos_pos_embed_2d`)."""
    quarter = dim // 4
    inv_freq = 1.0 / (10000.0 ** (torch.arange(quarter, dtype=torch.float32, device=device) / quarter))
    inv_freq = inv_freq.to(freq_dtype).float()
    rows = torch.arange(hp, dtype=torch.float32, device=device) / scale * (base_size / hp)
    cols = torch.arange(wp, dtype=torch.float32, device=device) / scale * (base_size / wp)

    def sin_cos(p: Tensor) -> Tensor:
        ang = p[:, None] * inv_freq[None]
        return torch.cat([ang.sin(), ang.cos()], dim=-1)

    row_emb = sin_cos(rows)[:, None, :].expand(hp, wp, dim // 2)
    col_emb = sin_cos(cols)[None, :, :].expand(hp, wp, dim // 2)
    # Column (W) coordinate first: the MAE "w goes first" ordering Open-Sora inherited.
    return torch.cat([col_emb, row_emb], dim=-1).reshape(1, hp * wp, dim)


def sincos_pos_embed_2d(dim: int, hp: int, wp: int, scale: float, base_size: int,
                        device: torch.device | str = "cpu", freq_dtype: torch.dtype = torch.float32) -> Tensor:
    """Open-Sora's additive 2-D position table [1, hp*wp, dim] (float32) for a hp x wp patch grid, row-major."""
    # Patch (r, c) sits at row r / scale * base_size / hp and column c / scale * base_size / wp; each coordinate is
    # encoded as [sin(p * f_k), cos(p * f_k)] with f_k = 10000^(-k / (dim/4)), the column half first. The
    # frequencies are rounded to `freq_dtype` first: Open-Sora keeps them in a buffer that a bf16 model casts, so
    # a bf16 model saw (and was trained with) bf16-rounded frequencies; the angles themselves are float32.
    return _sincos_2d(int(dim), int(hp), int(wp), float(scale), int(base_size), str(torch.device(device)),
                      freq_dtype)


def rope_cos_sin(freqs: Tensor, length: int) -> tuple[Tensor, Tensor]:
    """cos and sin [length, 2 * len(freqs)] for positions 0..length-1, each angle repeated for its pair."""
    # Computed in the dtype of `freqs`, as rotary-embedding-torch does: a bf16 model rotates with bf16 angles.
    pos = torch.arange(length, device=freqs.device, dtype=freqs.dtype)
    angles = (pos[:, None] * freqs[None, :]).repeat_interleave(2, dim=-1)
    return angles.cos(), angles.sin()


def apply_rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotate interleaved pairs (x[2k], x[2k+1]) of the last dim by the angles of the second-to-last (sequence) dim."""
    pairs = x.unflatten(-1, (-1, 2))
    rotated = torch.stack((-pairs[..., 1], pairs[..., 0]), dim=-1).flatten(-2)
    like = {"device": x.device, "dtype": x.dtype}
    return x * cos.to(**like) + rotated * sin.to(**like)


def t2i_modulate(x: Tensor, shift: Tensor, scale: Tensor) -> Tensor:
    """adaLN-single modulation x * (1 + scale) + shift."""
    return x * (1 + scale) + shift


# ---------------------------------------------------------------------------------------------- layers

@dataclass(frozen=True)
class Layers:
    """Layer maker: `ops` gives the Linear/Conv3d/LayerNorm classes; device/dtype go to every created tensor."""

    # ops is torch.nn by default; ComfyUI's comfy.ops namespaces plug in cast-on-the-fly and low-VRAM loading.

    ops: Any = nn
    device: torch.device | str | None = None
    dtype: torch.dtype | None = None

    @property
    def factory(self) -> dict[str, Any]:
        """device/dtype keyword arguments."""
        return {"device": self.device, "dtype": self.dtype}

    def linear(self, in_features: int, out_features: int) -> nn.Module:
        """Linear layer with bias."""
        return self.ops.Linear(in_features, out_features, bias=True, **self.factory)

    def layer_norm(self, dim: int, eps: float) -> nn.Module:
        """Layer norm without affine weights."""
        return self.ops.LayerNorm(dim, eps=eps, elementwise_affine=False, **self.factory)

    def empty(self, *shape: int) -> Tensor:
        """Uninitialised tensor on the layer device/dtype."""
        return torch.empty(*shape, **self.factory)


DEFAULT_LAYERS = Layers()


class RMSNorm(nn.Module):
    """Llama-style RMS norm over the last dim: normalised in float32, cast back, then times a learned weight."""

    def __init__(self, dim: int, eps: float = 1e-6, mk: Layers = DEFAULT_LAYERS) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim, **mk.factory))
        self.eps = eps

    def forward(self, x: Tensor) -> Tensor:
        """Normalise x [..., dim]."""
        x32 = x.float()
        normed = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight.to(device=x.device, dtype=x.dtype) * normed.to(x.dtype)


class Mlp(nn.Module):
    """Two linear layers with a tanh-approximated GELU between (timm Mlp names: fc1, fc2)."""

    def __init__(self, in_features: int, hidden_features: int, out_features: int,
                 mk: Layers = DEFAULT_LAYERS) -> None:
        super().__init__()
        self.fc1 = mk.linear(in_features, hidden_features)
        self.act = nn.GELU(approximate="tanh")
        self.fc2 = mk.linear(hidden_features, out_features)

    def forward(self, x: Tensor) -> Tensor:
        """fc2(gelu(fc1(x)))."""
        return self.fc2(self.act(self.fc1(x)))


class PatchEmbed3D(nn.Module):
    """Zero-pad T/H/W to multiples of the patch, Conv3d with kernel = stride = patch, flatten to tokens."""

    def __init__(self, patch_size: tuple[int, int, int], in_channels: int, hidden_size: int,
                 mk: Layers = DEFAULT_LAYERS) -> None:
        super().__init__()
        self.patch_size = patch_size
        self.proj = mk.ops.Conv3d(in_channels, hidden_size, kernel_size=patch_size, stride=patch_size, **mk.factory)

    def forward(self, x: Tensor) -> Tensor:
        """[B, C, T, H, W] -> [B, Tp*Hp*Wp, hidden] (t-major, then rows, then columns)."""
        pt, ph, pw = self.patch_size
        _, _, t, h, w = x.shape
        pad = (0, -w % pw, 0, -h % ph, 0, -t % pt)
        if any(pad):
            x = F.pad(x, pad)
        return self.proj(x).flatten(2).transpose(1, 2)


class TimestepEmbedder(nn.Module):
    """Scalar -> 256-d cos/sin sinusoid -> Linear, SiLU, Linear (used for the timestep and for fps)."""

    def __init__(self, hidden_size: int, freq_dim: int = FREQ_EMBED_DIM, mk: Layers = DEFAULT_LAYERS) -> None:
        super().__init__()
        self.freq_dim = freq_dim
        self.mlp = nn.Sequential(mk.linear(freq_dim, hidden_size), nn.SiLU(), mk.linear(hidden_size, hidden_size))

    def forward(self, t: Tensor, dtype: torch.dtype | None = None) -> Tensor:
        """Embed t [B] -> [B, hidden], computing in `dtype` (default: the weights' dtype)."""
        freq = timestep_sinusoid(t, self.freq_dim).to(dtype or self.mlp[0].weight.dtype)
        return self.mlp(freq)


class CaptionEmbedder(nn.Module):
    """Projects T5 features to the hidden size; holds the null caption `y_embedding` used for CFG."""

    def __init__(self, caption_channels: int, hidden_size: int, token_num: int, mk: Layers = DEFAULT_LAYERS) -> None:
        super().__init__()
        self.y_proj = Mlp(caption_channels, hidden_size, hidden_size, mk)
        self.register_buffer("y_embedding", mk.empty(token_num, caption_channels))  # filled by STDiT3.init_tables

    def forward(self, caption: Tensor, drop: Tensor | None = None) -> Tensor:
        """Project caption [B, L, Cc] -> [B, L, hidden]; rows where `drop` [B] is true use the null caption."""
        if drop is not None:
            null = self.y_embedding[: caption.shape[1]].to(device=caption.device, dtype=caption.dtype)
            caption = torch.where(drop.to(torch.bool).view(-1, 1, 1), null[None], caption)
        return self.y_proj(caption)


class RotaryEmbedding(nn.Module):
    """RoPE inverse frequencies `freqs` [head_dim/2] = theta^(-2k/head_dim), as rotary-embedding-torch's 'lang'."""

    def __init__(self, dim: int, theta: float = 10000.0, mk: Layers = DEFAULT_LAYERS) -> None:
        super().__init__()
        # Computed on the CPU, then moved: arange on the "meta" device would import torch._dynamo (seconds).
        device = mk.device if mk.device is not None else torch.empty(0).device
        self.register_buffer("freqs", rope_frequencies(dim, theta, "cpu").to(device, mk.dtype))

    def cos_sin(self, length: int) -> tuple[Tensor, Tensor]:
        """cos, sin tables [length, dim] for sequence positions 0..length-1."""
        return rope_cos_sin(self.freqs, length)


def rope_frequencies(dim: int, theta: float = 10000.0, device: torch.device | str | None = None) -> Tensor:
    """theta^(-2k/dim) for k = 0 .. dim/2 - 1, float32 (computed on the CPU, then moved to `device`)."""
    freqs = 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.float32, device="cpu")[: dim // 2] / dim))
    return freqs if device is None else freqs.to(device)


class SelfAttention(nn.Module):
    """Multi-head self-attention with a fused qkv projection and per-head RMS q/k norm (Open-Sora `Attention`)."""

    def __init__(self, dim: int, num_heads: int, qk_norm: bool = True, eps: float = 1e-6,
                 mk: Layers = DEFAULT_LAYERS) -> None:
        super().__init__()
        self.dim = dim
        self.num_heads = num_heads
        self.head_dim = dim // num_heads
        self.qkv = mk.linear(dim, 3 * dim)
        self.q_norm: nn.Module = RMSNorm(self.head_dim, eps, mk) if qk_norm else nn.Identity()
        self.k_norm: nn.Module = RMSNorm(self.head_dim, eps, mk) if qk_norm else nn.Identity()
        self.proj = mk.linear(dim, dim)

    def _heads(self, x: Tensor) -> Tensor:
        """[B, N, n*C] -> [B, n*heads, N, head_dim] split so that chunk i of dim 1 is projection i."""
        return rearrange(x, "b n (p h d) -> b (p h) n d", h=self.num_heads, d=self.head_dim)

    def qkv_heads(self, x: Tensor, rope: tuple[Tensor, Tensor] | None = None) -> tuple[Tensor, Tensor, Tensor]:
        """q, k, v [B, heads, N, head_dim] from hidden states x [B, N, C]: q/k normed, then rotated if `rope`."""
        q, k, v = self._heads(self.qkv(x)).chunk(3, dim=1)
        q, k = self.q_norm(q), self.k_norm(k)
        if rope is not None:
            q, k = apply_rope(q, *rope), apply_rope(k, *rope)
        return q, k, v

    def attend(self, q: Tensor, k: Tensor, v: Tensor, attn_mask: Tensor | None = None) -> Tensor:
        """softmax(q k^T / sqrt(head_dim)) v, heads merged, then `proj`: [B, N, C]."""
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask)
        return self.proj(rearrange(out, "b h n d -> b n (h d)"))

    def forward(self, x: Tensor, rope: tuple[Tensor, Tensor] | None = None) -> Tensor:
        """Self-attention over the sequence dim of x [B, N, C]."""
        return self.attend(*self.qkv_heads(x, rope))


class CrossAttention(nn.Module):
    """Video tokens attend to the (masked) projected caption tokens of their own sample; no q/k norm."""

    def __init__(self, dim: int, num_heads: int, mk: Layers = DEFAULT_LAYERS) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.q_linear = mk.linear(dim, dim)
        self.kv_linear = mk.linear(dim, 2 * dim)
        self.proj = mk.linear(dim, dim)

    def forward(self, x: Tensor, y: Tensor, y_mask: Tensor | None = None) -> Tensor:
        """x [B, N, C], y [B, L, C], y_mask [B, L] bool (true = attend) or None -> [B, N, C]."""
        q = rearrange(self.q_linear(x), "b n (h d) -> b h n d", h=self.num_heads)
        k, v = rearrange(self.kv_linear(y), "b l (p h d) -> p b h l d", p=2, h=self.num_heads).unbind(0)
        mask = None if y_mask is None else y_mask[:, None, None, :]
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return self.proj(rearrange(out, "b h n d -> b n (h d)"))


@dataclass
class SelfAttnCall:
    """What an `attn_replace` callable receives for one block's self-attention."""

    q: Tensor  # [B', heads, L', head_dim] in the attention layout, after q-norm (and RoPE in temporal blocks)
    k: Tensor
    v: Tensor
    x_mod: Tensor  # modulated block input [B, T*S, C] (token layout)
    t_mlp: Tensor  # [B, 6C] adaLN-single vector of this step
    T: int
    S: int
    block: "STDiT3Block"
    kind: str  # "spatial" or "temporal"
    index: int
    rope: tuple[Tensor, Tensor] | None
    info: dict[str, Any] = field(default_factory=dict)  # forward inputs: timestep, fps, height, width


AttnReplace = Callable[[SelfAttnCall], Tensor]


class STDiT3Block(nn.Module):
    """One spatial (attention within each frame) or temporal (attention along time, RoPE) transformer block."""

    def __init__(self, cfg: STDiT3Config, temporal: bool, mk: Layers = DEFAULT_LAYERS) -> None:
        super().__init__()
        c = cfg.hidden_size
        self.temporal = temporal
        self.hidden_size = c
        self.norm1 = mk.layer_norm(c, cfg.norm_eps)
        self.attn = SelfAttention(c, cfg.num_heads, cfg.qk_norm, cfg.norm_eps, mk)
        self.cross_attn = CrossAttention(c, cfg.num_heads, mk)
        self.norm2 = mk.layer_norm(c, cfg.norm_eps)
        self.mlp = Mlp(c, cfg.mlp_hidden, c, mk)
        self.scale_shift_table = nn.Parameter(mk.empty(6, c))  # filled by STDiT3.init_tables

    def modulation(self, t_mlp: Tensor) -> tuple[Tensor, ...]:
        """(shift_msa, scale_msa, gate_msa, shift_mlp, scale_mlp, gate_mlp), each [B, 1, C]."""
        table = self.scale_shift_table[None].to(device=t_mlp.device, dtype=t_mlp.dtype)
        return (table + t_mlp.view(t_mlp.shape[0], 6, -1)).chunk(6, dim=1)

    def modulated_attn_input(self, x: Tensor, t_mlp: Tensor) -> Tensor:
        """LN(x) * (1 + scale_msa) + shift_msa for x [B, T*S, C]: the tokens the self-attention projects."""
        table = self.scale_shift_table[None, :2].to(device=t_mlp.device, dtype=t_mlp.dtype)
        shift, scale = (table + t_mlp.view(t_mlp.shape[0], 6, -1)[:, :2]).chunk(2, dim=1)
        return t2i_modulate(self.norm1(x), shift, scale)

    def to_attn_layout(self, h: Tensor, T: int, S: int) -> Tensor:
        """[B, T*S, C] -> [(B*T), S, C] (spatial) or [(B*S), T, C] (temporal)."""
        if self.temporal:
            return rearrange(h, "b (t s) c -> (b s) t c", t=T, s=S)
        return rearrange(h, "b (t s) c -> (b t) s c", t=T, s=S)

    def from_attn_layout(self, h: Tensor, T: int, S: int) -> Tensor:
        """Inverse of `to_attn_layout`."""
        if self.temporal:
            return rearrange(h, "(b s) t c -> b (t s) c", t=T, s=S)
        return rearrange(h, "(b t) s c -> b (t s) c", t=T, s=S)

    def forward(self, x: Tensor, y: Tensor, t_mlp: Tensor, y_mask: Tensor | None, T: int, S: int,
                rope: tuple[Tensor, Tensor] | None = None, replace: AttnReplace | None = None,
                index: int = 0, info: dict[str, Any] | None = None) -> Tensor:
        """x [B, T*S, C] -> same; y [B, L, C] projected caption, t_mlp [B, 6C]."""
        shift_msa, scale_msa, gate_msa, shift_mlp, scale_mlp, gate_mlp = self.modulation(t_mlp)
        x_mod = t2i_modulate(self.norm1(x), shift_msa, scale_msa)
        h = self.to_attn_layout(x_mod, T, S)
        rope = rope if self.temporal else None
        if replace is None:
            h = self.attn(h, rope)
        else:
            q, k, v = self.attn.qkv_heads(h, rope)
            call = SelfAttnCall(q, k, v, x_mod, t_mlp, T, S, self, "temporal" if self.temporal else "spatial",
                                index, rope, dict(info or {}))
            h = replace(call)
        x = x + gate_msa * self.from_attn_layout(h, T, S)
        x = x + self.cross_attn(x, y, y_mask)
        x = x + gate_mlp * self.mlp(t2i_modulate(self.norm2(x), shift_mlp, scale_mlp))
        return x


class T2IFinalLayer(nn.Module):
    """PixArt-style final layer: LN, modulation by the timestep embedding t (not t_mlp), linear to patch pixels."""

    def __init__(self, hidden_size: int, patch_volume: int, out_channels: int, eps: float = 1e-6,
                 mk: Layers = DEFAULT_LAYERS) -> None:
        super().__init__()
        self.norm_final = mk.layer_norm(hidden_size, eps)
        self.linear = mk.linear(hidden_size, patch_volume * out_channels)
        self.scale_shift_table = nn.Parameter(mk.empty(2, hidden_size))  # filled by STDiT3.init_tables

    def forward(self, x: Tensor, t: Tensor) -> Tensor:
        """x [B, N, C], t [B, C] -> [B, N, patch_volume * out_channels]."""
        table = self.scale_shift_table[None].to(device=t.device, dtype=t.dtype)
        shift, scale = (table + t[:, None]).chunk(2, dim=1)
        return self.linear(t2i_modulate(self.norm_final(x), shift, scale))


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
        for block in [*self.spatial_blocks, *self.temporal_blocks, self.final_layer]:
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
                attn_replace: Mapping[tuple[str, int], AttnReplace] | None = None) -> Tensor:
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
        for i, (spatial, temporal) in enumerate(zip(self.spatial_blocks, self.temporal_blocks)):
            h = spatial(h, y_tokens, t_mlp, y_mask, grid[0], s, None, replace.get(("spatial_attn", i)), i, info)
            h = temporal(h, y_tokens, t_mlp, y_mask, grid[0], s, rope, replace.get(("temporal_attn", i)), i, info)
        out = self.unpatchify(self.final_layer(h, t), grid, (tx, hx, wx))
        return out.float()
