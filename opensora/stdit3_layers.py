"""STDiT3's building blocks: position and timestep maths, the layer classes and the self-attention hook types.

Every self-attention honours ComfyUI's attention override: when the block's transformer options hold a callable
under `OVERRIDE_KEY`, the block computes q, k, v and calls `override(sdpa_attention, q, k, v, heads,
skip_reshape=True, transformer_options=...)` (q/k/v [B', heads, L', head_dim]); the override may call the function
with other keys and values. Without one, the block runs its `attn` module as a whole (so object patches of
`attn.forward` keep working).

Module and parameter names are those of the official checkpoint (see `opensora.stdit3`, which assembles them).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, Callable

import torch
import torch.nn.functional as F
from einops import rearrange
from torch import Tensor, nn

from .stdit3_config import FREQ_EMBED_DIM, STDiT3Config

OVERRIDE_KEY = "optimized_attention_override"  # ComfyUI's transformer option for a replacement attention function


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
    return x * cos.to(device=x.device, dtype=x.dtype) + rotated * sin.to(device=x.device, dtype=x.dtype)


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


def module_weight(module: nn.Module) -> Tensor:
    """The `weight` tensor of a Linear-like layer (any `ops` namespace's)."""
    weight = module.weight
    if not isinstance(weight, Tensor):
        raise TypeError(f"{type(module).__name__}.weight is a {type(weight).__name__}, expected a tensor")
    return weight


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
        freq = timestep_sinusoid(t, self.freq_dim).to(dtype or module_weight(self.mlp[0]).dtype)
        return self.mlp(freq)


class CaptionEmbedder(nn.Module):
    """Projects T5 features to the hidden size; holds the null caption `y_embedding` used for CFG."""

    y_embedding: Tensor  # buffer

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

    freqs: Tensor  # buffer

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


def sdpa_attention(q: Tensor, k: Tensor, v: Tensor, heads: int, mask: Tensor | None = None,
                   skip_reshape: bool = False, skip_output_reshape: bool = False, **kwargs: Any) -> Tensor:
    """Softmax attention with ComfyUI's attention-function contract: q, k, v [B, L, heads * d] (or [B, heads, L, d]
    with skip_reshape) -> [B, L, heads * d] (or [B, heads, L, d] with skip_output_reshape); extra keywords ignored."""
    if not skip_reshape:
        q, k, v = (rearrange(t, "b n (h d) -> b h n d", h=heads) for t in (q, k, v))
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    return out if skip_output_reshape else rearrange(out, "b h n d -> b n (h d)")


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
        return self.proj(sdpa_attention(q, k, v, self.num_heads, attn_mask, skip_reshape=True))

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
                index: int = 0, info: dict[str, Any] | None = None,
                transformer_options: dict[str, Any] | None = None) -> Tensor:
        """x [B, T*S, C] -> same; y [B, L, C] projected caption, t_mlp [B, 6C]; transformer_options may hold an
        attention override (see the module docstring)."""
        shift_msa, scale_msa, gate_msa, shift_mlp, scale_mlp, gate_mlp = self.modulation(t_mlp)
        x_mod = t2i_modulate(self.norm1(x), shift_msa, scale_msa)
        h = self.to_attn_layout(x_mod, T, S)
        rope = rope if self.temporal else None
        override = (transformer_options or {}).get(OVERRIDE_KEY)
        kind = "temporal" if self.temporal else "spatial"

        def call_of(q: Tensor, k: Tensor, v: Tensor) -> SelfAttnCall:
            return SelfAttnCall(q, k, v, x_mod, t_mlp, T, S, self, kind, index, rope, dict(info or {}))

        if override is None:
            h = self.attn(h, rope) if replace is None else replace(call_of(*self.attn.qkv_heads(h, rope)))
        else:
            q, k, v = self.attn.qkv_heads(h, rope)
            if replace is None:
                attention: Callable[..., Tensor] = sdpa_attention
            else:
                def attention(q: Tensor, k: Tensor, v: Tensor, heads: int, mask: Tensor | None = None,
                              skip_reshape: bool = False, **kwargs: Any) -> Tensor:
                    # Another pack's attn_replace patch attends (and projects) with the override's q/k/v.
                    return replace(call_of(q, k, v))
            h = override(attention, q, k, v, self.attn.num_heads, skip_reshape=True,
                         transformer_options=transformer_options)
            if replace is None:
                h = self.attn.proj(h)
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
