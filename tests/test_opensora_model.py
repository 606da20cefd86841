"""STDiT3 (opensora/stdit3.py) and its loader (opensora/loading.py): parity with the official key list, maths
checked against straightforward re-derivations, attention locality, checkpoint loading and refusal."""
from __future__ import annotations

import copy
import json
import math
import weakref
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import save_file

from comfyui_chai.opensora.loading import (
    KeyMismatchError,
    TensorSource,
    WrongArchitectureError,
    infer_config,
    load_stdit3,
    load_stdit3_from_source,
    load_stdit3_state_dict,
    read_checkpoint_header,
    save_stdit3,
)
from comfyui_chai.opensora.stdit3 import (
    SPATIAL_BLOCK,
    TEMPORAL_BLOCK,
    STDiT3,
    STDiT3Config,
    SelfAttnCall,
    apply_rope,
    rope_cos_sin,
    rope_frequencies,
    sdpa_attention,
    sincos_pos_embed_2d,
)

FIXTURE = Path(__file__).parent / "fixtures" / "stdit3_xl2_keys.json"
TINY = dict(hidden_size=64, depth=2, num_heads=4, caption_channels=32, model_max_length=8)


def randomize_(model: STDiT3, seed: int = 0) -> STDiT3:
    """Give every tensor (norm weights, biases, tables) random values so no term can hide behind a 0 or a 1."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1 + 0.3 * torch.randn(p.shape, generator=gen))
            elif p.dim() == 1:
                p.copy_(0.1 * torch.randn(p.shape, generator=gen))
    return model


@pytest.fixture(scope="module")
def tiny() -> STDiT3:
    """A tiny STDiT3 in fp32, eval mode."""
    torch.manual_seed(0)
    return randomize_(STDiT3(STDiT3Config(**TINY))).eval()


def make_inputs(batch: int = 2, t: int = 3, h: int = 5, w: int = 6, seed: int = 1):
    """Latent, timesteps, caption features and a ragged mask for the tiny model."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(batch, 4, t, h, w, generator=gen)
    y = torch.randn(batch, 1, 8, 32, generator=gen)
    lengths = [5, 8, 3, 6][:batch]
    mask = torch.tensor([[1] * n + [0] * (8 - n) for n in lengths])
    timestep = torch.tensor([700.0, 250.0, 999.0, 10.0][:batch])
    return x, timestep, y, mask


# ---------------------------------------------------------------------------------------------- parity (XL/2)

def test_xl2_state_dict_matches_official_key_list() -> None:
    """STDiT3() built on the meta device has exactly the official names and shapes, 973 tensors, ~1.21 B params."""
    fixture = json.loads(FIXTURE.read_text())
    with torch.device("meta"):
        model = STDiT3()
    state = {k: list(v.shape) for k, v in model.state_dict().items()}
    assert len(fixture["keys"]) == fixture["num_tensors"] == 973
    assert sorted(set(fixture["keys"]) - set(state)) == []
    assert sorted(set(state) - set(fixture["keys"])) == []
    assert {k: v for k, v in state.items() if fixture["keys"][k] != v} == {}
    total = sum(math.prod(s) for s in state.values())
    learnable = sum(p.numel() for p in model.parameters())
    print(f"STDiT3-XL/2: {len(state)} tensors, {total:,} elements, {learnable:,} parameters")
    assert total == fixture["total_elements"] == 1_208_872_772
    assert learnable == fixture["learnable_parameters"] == 1_207_643_936
    assert round(learnable / 1e9, 2) == 1.21
    assert model.config.head_dim == 72 and model.config.out_channels == 8 and model.config.mlp_hidden == 4608


def test_config_validation() -> None:
    """Bad configurations fail at construction with the field named."""
    with pytest.raises(ValueError, match="divisible by num_heads"):
        STDiT3Config(hidden_size=100, num_heads=16)
    with pytest.raises(ValueError, match="even"):
        STDiT3Config(hidden_size=60, num_heads=4)  # head_dim 15
    with pytest.raises(ValueError, match="depth"):
        STDiT3Config(depth=0)
    with pytest.raises(ValueError, match="patch_size"):
        STDiT3Config(patch_size=(1, 2))
    with pytest.raises(ValueError, match="unknown"):
        STDiT3Config.from_dict({"hidden": 3})
    cfg = STDiT3Config(**TINY, patch_size=[1, 2, 2])
    assert cfg.patch_size == (1, 2, 2) and STDiT3Config.from_dict(cfg.to_dict()) == cfg


def test_custom_operations_and_compute_dtype(tiny: STDiT3) -> None:
    """Layers come from `operations` (like comfy.ops); bf16-stored weights compute in fp32 once model.dtype is set."""

    class CastLinear(torch.nn.Linear):
        """Casts its weights to the input dtype, as ComfyUI's manual-cast ops do."""

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return F.linear(x, self.weight.to(x.dtype), self.bias.to(x.dtype))

    class CastConv3d(torch.nn.Conv3d):
        """Casts its weights to the input dtype."""

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self._conv_forward(x, self.weight.to(x.dtype), self.bias.to(x.dtype))

    ops = SimpleNamespace(Linear=CastLinear, Conv3d=CastConv3d, LayerNorm=torch.nn.LayerNorm)
    model = STDiT3(STDiT3Config(**TINY), operations=ops, dtype=torch.bfloat16).eval()
    assert isinstance(model.spatial_blocks[0].attn.qkv, CastLinear) and isinstance(model.x_embedder.proj, CastConv3d)
    assert {t.dtype for t in model.state_dict().values()} == {torch.bfloat16}
    model.load_state_dict(tiny.state_dict())
    assert model.dtype == torch.bfloat16
    model.dtype = torch.float32
    rounded = copy.deepcopy(tiny)
    rounded.load_state_dict({k: v.bfloat16().float() for k, v in tiny.state_dict().items()})
    rounded.rope.freqs = rounded.rope.freqs.bfloat16()  # RoPE angles follow the stored frequencies' dtype
    x, ts, y, mask = make_inputs()
    with torch.no_grad():
        got, want = model(x, ts, y, mask), rounded(x, ts, y, mask)
    assert torch.allclose(got, want, atol=1e-5), (got - want).abs().max()


# ---------------------------------------------------------------------------------------------- forward shapes

@pytest.mark.parametrize("t,h,w", [(1, 4, 4), (3, 5, 6), (5, 8, 7), (2, 3, 9)])
def test_forward_shapes(tiny: STDiT3, t: int, h: int, w: int) -> None:
    """Output is float32 [B, 8, T, H, W] for any frame count and odd sizes (padded inside, cropped back)."""
    x, ts, y, mask = make_inputs(t=t, h=h, w=w)
    with torch.no_grad():
        out = tiny(x, ts, y, mask, fps=24, height=h * 8, width=w * 8)
    assert out.shape == (2, 8, t, h, w) and out.dtype == torch.float32
    assert torch.isfinite(out).all()


def test_forward_patch_size_with_temporal_patching() -> None:
    """A temporal patch of 2 pads an odd frame count and crops it back."""
    torch.manual_seed(0)
    model = STDiT3(STDiT3Config(**TINY, patch_size=(2, 2, 2))).eval()
    x, ts, y, mask = make_inputs(t=3)
    with torch.no_grad():
        out = model(x, ts, y, mask)
    assert out.shape == (2, 8, 3, 5, 6)


def test_forward_input_validation(tiny: STDiT3) -> None:
    """Wrong shapes are reported, not broadcast silently."""
    x, ts, y, mask = make_inputs()
    with pytest.raises(ValueError, match="x must be"):
        tiny(x[:, :3], ts, y, mask)
    with pytest.raises(ValueError, match="mask covers"):
        tiny(x, ts, y, mask[:, :5])
    with pytest.raises(ValueError, match="at least one valid"):
        tiny(x, ts, y, torch.zeros_like(mask))
    with pytest.raises(ValueError, match="timestep has 3"):
        tiny(x, torch.ones(3), y, mask)


# ---------------------------------------------------------------------------------------------- reference maths

def ref_rope(x: torch.Tensor, theta: float = 10000.0) -> torch.Tensor:
    """RoPE the obvious way: rotate each interleaved pair (2k, 2k+1) at position p by p * theta^(-2k/D)."""
    out = x.clone()
    length, dim = x.shape[-2], x.shape[-1]
    for p in range(length):
        for k in range(dim // 2):
            a = p * theta ** (-2 * k / dim)
            x0, x1 = x[..., p, 2 * k], x[..., p, 2 * k + 1]
            out[..., p, 2 * k] = x0 * math.cos(a) - x1 * math.sin(a)
            out[..., p, 2 * k + 1] = x1 * math.cos(a) + x0 * math.sin(a)
    return out


def ref_rms(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """RMS norm the obvious way, in float64."""
    xd = x.double()
    return weight.double() * xd / torch.sqrt((xd * xd).mean(-1, keepdim=True) + eps)


def test_rope_matches_reference() -> None:
    """apply_rope(rope_cos_sin(...)) equals the explicit pairwise rotation, and scores depend on offsets only."""
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(2, 3, 7, 12, dtype=torch.float64, generator=gen)
    freqs = rope_frequencies(12).double()
    assert torch.allclose(freqs, torch.tensor([10000 ** (-2 * k / 12) for k in range(6)], dtype=torch.float64))
    cos, sin = rope_cos_sin(freqs, 7)
    got = apply_rope(x, cos, sin)
    assert torch.allclose(got, ref_rope(x), atol=1e-12)
    assert torch.allclose(got.norm(dim=-1), x.norm(dim=-1))  # a rotation
    # Relative positions: the same q, k at positions (i, j) and (i+2, j+2) give the same score.
    q = x[0, 0, :1].expand(7, 12)
    k = x[0, 1, :1].expand(7, 12)
    rq, rk = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
    assert torch.allclose(rq[1] @ rk[4], rq[3] @ rk[6]) and not torch.allclose(rq[1] @ rk[4], rq[1] @ rk[1])
    # Interleaved pairs, not halves: rotating the first pair only mixes dims 0 and 1.
    e = torch.zeros(2, 12, dtype=torch.float64)
    e[:, 0] = 1
    rot = apply_rope(e, *rope_cos_sin(freqs, 2))
    assert torch.allclose(rot[1, :2], torch.tensor([math.cos(1), math.sin(1)], dtype=torch.float64))
    assert torch.count_nonzero(rot[1, 2:]) == 0


def test_qk_norm_matches_reference(tiny: STDiT3) -> None:
    """q_norm / k_norm are per-head RMS norms (eps 1e-6) applied before RoPE in temporal blocks."""
    attn = tiny.temporal_blocks[1].attn
    gen = torch.Generator().manual_seed(2)
    h = torch.randn(3, 5, 64, generator=gen)
    qkv = h @ attn.qkv.weight.T + attn.qkv.bias
    heads = qkv.view(3, 5, 3, 4, 16).permute(2, 0, 3, 1, 4)  # (q|k|v, B, heads, L, head_dim)
    q_ref = ref_rope(ref_rms(heads[0], attn.q_norm.weight))
    k_ref = ref_rope(ref_rms(heads[1], attn.k_norm.weight))
    q, k, v = attn.qkv_heads(h, tiny.rope.cos_sin(5))
    assert torch.allclose(q.double(), q_ref, atol=1e-5) and torch.allclose(k.double(), k_ref, atol=1e-5)
    assert torch.equal(v, heads[2])
    # bf16: normalised in float32, cast back, then multiplied by the weight.
    hb = heads[0].bfloat16()
    normed = (hb.float() * torch.rsqrt(hb.float().pow(2).mean(-1, True) + 1e-6)).bfloat16()
    want = attn.q_norm.weight.bfloat16() * normed
    assert torch.equal(copy.deepcopy(attn.q_norm).bfloat16()(hb), want)


def ref_pos_embed(dim: int, hp: int, wp: int, height: float, width: float, bf16_freqs: bool = False) -> np.ndarray:
    """The notes' 2-D table: token (r, c) -> [sc(column coord), sc(row coord)], sc = [sin, cos]."""
    scale = math.sqrt(height * width) / 512
    base = round(math.sqrt(hp * wp))
    f = 10000.0 ** (-np.arange(dim // 4) / (dim // 4))
    if bf16_freqs:  # what Open-Sora's bf16 model computes with (its frequency buffer is cast with the model)
        f = torch.tensor(f, dtype=torch.float32).bfloat16().double().numpy()
    rows = []
    for r in range(hp):
        for c in range(wp):
            pr, pc = r / scale * base / hp, c / scale * base / wp
            rows.append(np.concatenate([np.sin(pc * f), np.cos(pc * f), np.sin(pr * f), np.cos(pr * f)]))
    return np.stack(rows)[None]


def test_position_embedding_matches_reference() -> None:
    """240p 9:16: grid 15x27, base size 20, scale sqrt(240*426)/512; column coordinate first."""
    table = sincos_pos_embed_2d(1152, 15, 27, math.sqrt(240 * 426) / 512, 20)
    assert table.shape == (1, 405, 1152) and table.dtype == torch.float32
    assert np.allclose(table.numpy(), ref_pos_embed(1152, 15, 27, 240, 426), atol=1e-4)
    model = STDiT3(STDiT3Config(**TINY))
    got = model.position_embedding(3, 5, 100, 130)
    assert np.allclose(got.numpy(), ref_pos_embed(64, 3, 5, 100, 130), atol=1e-5)
    bf16 = sincos_pos_embed_2d(1152, 15, 27, math.sqrt(240 * 426) / 512, 20, freq_dtype=torch.bfloat16)
    assert np.allclose(bf16.numpy(), ref_pos_embed(1152, 15, 27, 240, 426, bf16_freqs=True), atol=1e-4)
    assert not np.allclose(bf16.numpy(), table.numpy(), atol=1e-2)


def ref_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """softmax(q k^T / sqrt(d)) v for [L, d] matrices."""
    return torch.softmax(q @ k.T / math.sqrt(q.shape[-1]), dim=-1) @ v


def ref_layer_norm(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """Layer norm without affine weights."""
    mu = x.mean(-1, keepdim=True)
    return (x - mu) / torch.sqrt(((x - mu) ** 2).mean(-1, keepdim=True) + eps)


def ref_block(blk, x: torch.Tensor, ys: list[torch.Tensor], t_mlp: torch.Tensor, T: int, S: int) -> torch.Tensor:
    """One STDiT3 block per the notes, with explicit loops over samples, frames/positions and heads."""
    B, _, C = x.shape
    nh = blk.attn.num_heads
    D = C // nh
    out = torch.empty_like(x)
    for b in range(B):
        m = blk.scale_shift_table + t_mlp[b].view(6, C)
        shift_msa, scale_msa, gate_msa, shift_mlp, scale_mlp, gate_mlp = m
        xb = x[b].view(T, S, C)
        h = ref_layer_norm(xb) * (1 + scale_msa) + shift_msa
        att = torch.empty_like(xb)
        seqs = [(s_, lambda a, s_=s_: a[:, s_]) for s_ in range(S)] if blk.temporal else \
               [(t_, lambda a, t_=t_: a[t_]) for t_ in range(T)]
        for idx, take in seqs:
            seq = take(h)
            qkv = seq @ blk.attn.qkv.weight.T + blk.attn.qkv.bias
            heads = []
            for hd in range(nh):
                q = ref_rms(qkv[:, hd * D:(hd + 1) * D], blk.attn.q_norm.weight)
                k = ref_rms(qkv[:, C + hd * D:C + (hd + 1) * D], blk.attn.k_norm.weight)
                v = qkv[:, 2 * C + hd * D:2 * C + (hd + 1) * D]
                if blk.temporal:
                    q, k = ref_rope(q), ref_rope(k)
                heads.append(ref_attention(q, k, v))
            o = torch.cat(heads, -1) @ blk.attn.proj.weight.T + blk.attn.proj.bias
            if blk.temporal:
                att[:, idx] = o
            else:
                att[idx] = o
        x1 = xb.reshape(T * S, C) + gate_msa * att.reshape(T * S, C)
        q = x1 @ blk.cross_attn.q_linear.weight.T + blk.cross_attn.q_linear.bias
        kv = ys[b] @ blk.cross_attn.kv_linear.weight.T + blk.cross_attn.kv_linear.bias
        cross = torch.cat([ref_attention(q[:, i * D:(i + 1) * D], kv[:, i * D:(i + 1) * D],
                                         kv[:, C + i * D:C + (i + 1) * D]) for i in range(nh)], -1)
        x2 = x1 + cross @ blk.cross_attn.proj.weight.T + blk.cross_attn.proj.bias
        h2 = ref_layer_norm(x2) * (1 + scale_mlp) + shift_mlp
        mlp = F.gelu(h2 @ blk.mlp.fc1.weight.T + blk.mlp.fc1.bias, approximate="tanh")
        out[b] = x2 + gate_mlp * (mlp @ blk.mlp.fc2.weight.T + blk.mlp.fc2.bias)
    return out


def ref_mlp_embed(seq, s: torch.Tensor) -> torch.Tensor:
    """Sinusoid (cos first, 256 wide) then Linear, SiLU, Linear."""
    f = torch.exp(-math.log(10000) * torch.arange(128, dtype=torch.float64) / 128)
    emb = torch.cat([torch.cos(s[:, None] * f), torch.sin(s[:, None] * f)], -1)
    h = F.silu(emb @ seq[0].weight.T + seq[0].bias)
    return h @ seq[2].weight.T + seq[2].bias


def ref_forward(model: STDiT3, x, timestep, y, mask, fps: float, height: float, width: float) -> torch.Tensor:
    """The whole STDiT3 forward written out from the notes (float64, explicit patches, packing and unpatchify)."""
    C = model.config.hidden_size
    B, _, T, H, W = x.shape
    Hp, Wp = -(-H // 2), -(-W // 2)
    S = Hp * Wp
    xp = F.pad(x, (0, 2 * Wp - W, 0, 2 * Hp - H))
    wconv = model.x_embedder.proj.weight.reshape(C, -1)
    tokens = torch.empty(B, T * S, C, dtype=x.dtype)
    for b in range(B):
        for t in range(T):
            for r in range(Hp):
                for c in range(Wp):
                    patch = xp[b, :, t, 2 * r:2 * r + 2, 2 * c:2 * c + 2].reshape(-1)
                    tokens[b, (t * Hp + r) * Wp + c] = wconv @ patch + model.x_embedder.proj.bias
    pos = torch.from_numpy(ref_pos_embed(C, Hp, Wp, height, width))[0]
    h = tokens + pos.repeat(T, 1)
    temb = ref_mlp_embed(model.t_embedder.mlp, timestep) + ref_mlp_embed(model.fps_embedder.mlp,
                                                                         torch.full((B,), fps, dtype=x.dtype))
    t_mlp = F.silu(temb) @ model.t_block[1].weight.T + model.t_block[1].bias
    proj = model.y_embedder.y_proj
    ys = []
    for b in range(B):
        yb = y[b, 0][mask[b] != 0]
        ys.append(F.gelu(yb @ proj.fc1.weight.T + proj.fc1.bias, approximate="tanh") @ proj.fc2.weight.T
                  + proj.fc2.bias)
    for sb, tb in zip(model.spatial_blocks, model.temporal_blocks):
        h = ref_block(sb, h, ys, t_mlp, T, S)
        h = ref_block(tb, h, ys, t_mlp, T, S)
    fl = model.final_layer
    shift, scale = (fl.scale_shift_table[0] + temb)[:, None], (fl.scale_shift_table[1] + temb)[:, None]
    tok = (ref_layer_norm(h) * (1 + scale) + shift) @ fl.linear.weight.T + fl.linear.bias  # [B, N, 32]
    out = torch.empty(B, 8, T, 2 * Hp, 2 * Wp, dtype=x.dtype)
    for t in range(T):
        for r in range(Hp):
            for c in range(Wp):
                vec = tok[:, (t * Hp + r) * Wp + c].view(B, 2, 2, 8)  # (hp, wp, channel), channel fastest
                for i in range(2):
                    for j in range(2):
                        out[:, :, t, 2 * r + i, 2 * c + j] = vec[:, i, j]
    return out[:, :, :, :H, :W]


def test_forward_matches_reference_implementation(tiny: STDiT3) -> None:
    """The module forward equals an explicit, loop-based re-derivation of the whole model (float64)."""
    model = copy.deepcopy(tiny).double()
    x, ts, y, mask = make_inputs(t=3, h=5, w=3)
    x, y = x.double(), y.double()
    with torch.no_grad():
        got = model(x, ts, y, mask, fps=24, height=40, width=26)
        want = ref_forward(model, x, ts.double(), y, mask, 24.0, 40, 26)
    assert got.shape == want.shape == (2, 8, 3, 5, 3)
    assert torch.allclose(got.double(), want, atol=1e-5, rtol=1e-5), (got.double() - want).abs().max()


# ---------------------------------------------------------------------------------------------- locality

def block_inputs(model: STDiT3, T: int = 4, S: int = 6, seed: int = 3):
    """Token states, projected caption, t_mlp and RoPE tables for driving one block directly."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(2, T * S, 64, generator=gen)
    y = torch.randn(2, 5, 64, generator=gen)
    _, t_mlp = model.embed_timestep(torch.tensor([300.0, 800.0]), 24.0, 2)
    return x, y, t_mlp, model.rope.cos_sin(T)


def changed_tokens(model: STDiT3, block, t0: int, s0: int, T: int = 4, S: int = 6) -> torch.Tensor:
    """Bool [T, S]: which output tokens of sample 0 move when input token (t0, s0) of sample 0 is perturbed."""
    x, y, t_mlp, rope = block_inputs(model, T, S)
    with torch.no_grad():
        base = block(x, y, t_mlp, None, T, S, rope)
        x2 = x.clone()
        # Not a constant offset: the layer norm would cancel that.
        x2[0, t0 * S + s0] += 3.0 * torch.randn(64, generator=torch.Generator().manual_seed(9))
        moved = block(x2, y, t_mlp, None, T, S, rope)
        assert torch.equal(base[1], moved[1])  # other samples never see it
    return ((moved[0] - base[0]).abs().amax(-1) > 1e-6).view(T, S)


def test_spatial_block_attends_within_frame_only(tiny: STDiT3) -> None:
    """Perturbing token (t=1, s=2) changes every token of frame 1 and no token of any other frame."""
    moved = changed_tokens(tiny, tiny.spatial_blocks[0], 1, 2)
    assert moved[1].all()
    assert not moved[[0, 2, 3]].any()


def test_temporal_block_attends_along_time_only(tiny: STDiT3) -> None:
    """Perturbing token (t=1, s=2) changes position 2 in every frame and no other position."""
    moved = changed_tokens(tiny, tiny.temporal_blocks[0], 1, 2)
    assert moved[:, 2].all()
    assert not moved[:, [0, 1, 3, 4, 5]].any()


def test_temporal_block_is_order_aware_spatial_is_not(tiny: STDiT3) -> None:
    """RoPE makes the temporal block sensitive to frame order; the spatial block is permutation-equivariant in S."""
    T, S = 4, 6
    x, y, t_mlp, rope = block_inputs(tiny, T, S)
    with torch.no_grad():
        perm_t = torch.tensor([2, 0, 3, 1])
        xt = x.view(2, T, S, 64)[:, perm_t].reshape(2, T * S, 64)
        out_t = tiny.temporal_blocks[0](xt, y, t_mlp, None, T, S, rope).view(2, T, S, 64)
        ref_t = tiny.temporal_blocks[0](x, y, t_mlp, None, T, S, rope).view(2, T, S, 64)[:, perm_t]
        assert not torch.allclose(out_t, ref_t, atol=1e-4)
        perm_s = torch.tensor([5, 3, 1, 0, 2, 4])
        xs = x.view(2, T, S, 64)[:, :, perm_s].reshape(2, T * S, 64)
        out_s = tiny.spatial_blocks[0](xs, y, t_mlp, None, T, S, rope).view(2, T, S, 64)
        ref_s = tiny.spatial_blocks[0](x, y, t_mlp, None, T, S, rope).view(2, T, S, 64)[:, :, perm_s]
        assert torch.allclose(out_s, ref_s, atol=1e-5)


# ---------------------------------------------------------------------------------------------- text path

def test_mask_equals_trimmed_caption(tiny: STDiT3) -> None:
    """Masked tokens are ignored: each sample equals a run on its own caption cut to its valid tokens."""
    x, ts, y, mask = make_inputs()
    garbage = y.clone()
    garbage[mask[:, None, :, None].expand_as(y) == 0] = 50.0
    with torch.no_grad():
        out = tiny(x, ts, garbage, mask, fps=24)
        for b in range(2):
            n = int(mask[b].sum())
            alone = tiny(x[b:b + 1], ts[b:b + 1], y[b:b + 1, :, :n], None, fps=24)
            assert torch.allclose(out[b:b + 1], alone, atol=1e-5)
        # A mask with a single row is repeated over the batch (Open-Sora's CFG convention).
        both = tiny(x, ts, y, mask[:1], fps=24)
        alone1 = tiny(x[1:], ts[1:], y[1:, :, :5], None, fps=24)
        assert torch.allclose(both[1:], alone1, atol=1e-5)


def test_null_caption_and_drop(tiny: STDiT3) -> None:
    """y_drop swaps in y_embedding rows; null_caption exposes the same table."""
    x, ts, y, _ = make_inputs()
    null = tiny.null_caption(2, 8)
    assert null.shape == (2, 1, 8, 32) and torch.equal(null[0, 0], tiny.y_embedder.y_embedding)
    with torch.no_grad():
        dropped = tiny(x, ts, y, None, y_drop=torch.tensor([True, False]))
        explicit = tiny(x, ts, torch.cat([null[:1], y[1:]]), None)
        plain = tiny(x, ts, y, None)
    assert torch.allclose(dropped, explicit, atol=1e-6)
    assert not torch.allclose(dropped[:1], plain[:1], atol=1e-4) and torch.allclose(dropped[1:], plain[1:])
    with pytest.raises(ValueError, match="null caption length"):
        tiny.null_caption(1, 9)


def test_defaults_for_fps_and_nominal_size(tiny: STDiT3) -> None:
    """fps defaults to 24 (120 for one frame); height/width default to 8x the latent; both matter."""
    x, ts, y, mask = make_inputs(t=2)
    with torch.no_grad():
        assert torch.equal(tiny(x, ts, y, mask), tiny(x, ts, y, mask, fps=24.0, height=40, width=48))
        assert not torch.allclose(tiny(x, ts, y, mask), tiny(x, ts, y, mask, fps=30))
        assert not torch.allclose(tiny(x, ts, y, mask), tiny(x, ts, y, mask, height=42, width=48))
        one = x[:, :, :1]
        assert torch.equal(tiny(one, ts, y, mask), tiny(one, ts, y, mask, fps=torch.tensor([120.0, 120.0])))


# ---------------------------------------------------------------------------------------------- patch hooks

def fused_kv_by_hand(attn: torch.nn.Module, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Spatial K (RMS-normed, no RoPE) and V [B, heads, N, head_dim] from the K and V thirds of the fused qkv."""
    c, heads = h.shape[-1], attn.num_heads
    w, b = attn.qkv.weight, attn.qkv.bias
    k = (h @ w[c:2 * c].T + b[c:2 * c]).view(*h.shape[:2], heads, c // heads).transpose(1, 2)
    v = (h @ w[2 * c:].T + b[2 * c:]).view(*h.shape[:2], heads, c // heads).transpose(1, 2)
    return ref_rms(k, attn.k_norm.weight).float(), v


def test_attention_replace_hook_and_cache_style_kv(tiny: STDiT3) -> None:
    """attn_replace sees q/k/v; K/V rebuilt from the same latent through the public hooks reproduce the model."""
    x, ts, y, mask = make_inputs()
    seen: list[SelfAttnCall] = []

    def identity(call: SelfAttnCall) -> torch.Tensor:
        seen.append(call)
        return call.block.attn.attend(call.q, call.k, call.v)

    def cache_style(call: SelfAttnCall) -> torch.Tensor:
        # K/V of a "cached" latent (here the same latent, so the result must not change).
        xc = tiny.embed_video(x, call.info["height"], call.info["width"])
        _, t_mlp_c = tiny.embed_timestep(call.info["timestep"], call.info["fps"], x.shape[0])
        hc = call.block.to_attn_layout(call.block.modulated_attn_input(xc, t_mlp_c), call.T, call.S)
        kc, vc = fused_kv_by_hand(call.block.attn, hc)
        assert torch.allclose(kc, call.k, atol=1e-5) and torch.allclose(vc, call.v, atol=1e-5)
        return call.block.attn.attend(call.q, kc, vc)

    with torch.no_grad():
        plain = tiny(x, ts, y, mask, fps=24, height=40, width=48)
        hooked = tiny(x, ts, y, mask, fps=24, height=40, width=48, attn_replace={("spatial_attn", 0): identity})
        cached = tiny(x, ts, y, mask, fps=24, height=40, width=48, attn_replace={("spatial_attn", 0): cache_style})
        zeroed = tiny(x, ts, y, mask, attn_replace={("spatial_attn", 0): lambda c: c.q.new_zeros(6, 9, 64)})
    assert torch.equal(hooked, plain) and torch.allclose(cached, plain, atol=1e-5)
    assert not torch.allclose(zeroed, plain, atol=1e-4)
    assert len(seen) == 1 and seen[0].kind == "spatial" and seen[0].index == 0
    assert seen[0].block is tiny.spatial_blocks[0]
    assert seen[0].q.shape == (2 * 3, 4, 9, 16)  # (B*T, heads, S, head_dim); S = 3x3 patches of a 5x6 latent
    assert seen[0].x_mod.shape == (2, 3 * 9, 64) and seen[0].rope is None


def test_block_patches_follow_comfyuis_dit_contract(tiny: STDiT3) -> None:
    """patches_replace["dit"][("spatial_block", i)] replaces block i: called with the block's arguments and
    {"original_block": fn}; the block's output is the returned dict's "x"."""
    x, ts, y, mask = make_inputs()
    seen: list[dict] = []

    def passthrough(args: dict, extra: dict) -> dict:
        seen.append(args)
        return extra["original_block"](args)

    def zero_out(args: dict, extra: dict) -> dict:
        return {"x": torch.zeros_like(extra["original_block"](args)["x"])}

    def options(patch, key=(SPATIAL_BLOCK, 1)):
        return {"patches_replace": {"dit": {key: patch}}, "mine": 1}

    with torch.no_grad():
        plain = tiny(x, ts, y, mask)
        patched = tiny(x, ts, y, mask, transformer_options=options(passthrough))
        zeroed = tiny(x, ts, y, mask, transformer_options=options(zero_out))
        temporal = tiny(x, ts, y, mask, transformer_options=options(zero_out, (TEMPORAL_BLOCK, 0)))
        foreign = tiny(x, ts, y, mask, transformer_options=options(zero_out, ("double_block", 0)))
    assert torch.equal(patched, plain) and torch.equal(foreign, plain)
    assert not torch.allclose(zeroed, plain, atol=1e-4) and not torch.allclose(temporal, zeroed, atol=1e-4)
    assert len(seen) == 1 and {"x", "y", "t_mlp", "y_mask", "T", "S", "rope", "transformer_options"} <= set(seen[0])
    assert seen[0]["transformer_options"]["mine"] == 1 and seen[0]["x"].shape == (2, 3 * 9, 64)


def test_self_attention_calls_comfyuis_attention_override(tiny: STDiT3) -> None:
    """optimized_attention_override(func, q, k, v, heads, skip_reshape=True, ...) in every self-attention that
    gets it; func is softmax attention with ComfyUI's contract, and the override may change the keys/values."""
    x, ts, y, mask = make_inputs()
    calls: list[tuple] = []

    def identity(func, q, k, v, heads, **kwargs):
        calls.append((q.shape, heads, kwargs.get("skip_reshape")))
        return func(q, k, v, heads, **kwargs)

    def own_keys_of_row_0(func, q, k, v, heads, **kwargs):
        return func(q, k[:1].expand_as(k), v[:1].expand_as(v), heads, **kwargs)

    with torch.no_grad():
        plain = tiny(x, ts, y, mask)
        hooked = tiny(x, ts, y, mask, transformer_options={"optimized_attention_override": identity})
        swapped = tiny(x, ts, y, mask, transformer_options={"optimized_attention_override": own_keys_of_row_0})
    assert torch.equal(hooked, plain)
    assert not torch.allclose(swapped, plain, atol=1e-4)
    assert len(calls) == 2 * len(tiny.spatial_blocks)  # spatial and temporal self-attentions; no cross-attention
    assert calls[0] == ((2 * 3, 4, 9, 16), 4, True)  # spatial: [(B*T), heads, S, head_dim]
    q = torch.randn(2, 5, 8)
    torch.testing.assert_close(sdpa_attention(q, q, q, 2), sdpa_attention(
        q.view(2, 5, 2, 4).transpose(1, 2), q.view(2, 5, 2, 4).transpose(1, 2), q.view(2, 5, 2, 4).transpose(1, 2), 2,
        skip_reshape=True))


# ---------------------------------------------------------------------------------------------- loading

@pytest.fixture(scope="module")
def tiny_file(tiny: STDiT3, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny model saved with official names (config in the metadata)."""
    return save_stdit3(tiny, tmp_path_factory.mktemp("ckpt") / "stdit3_tiny.safetensors")


@pytest.mark.parametrize("dtype,tol", [("fp32", 0.0), ("fp16", 2e-2), ("bf16", 1e-1)])
def test_load_tiny_checkpoint_in_three_dtypes(tiny: STDiT3, tiny_file: Path, dtype: str, tol: float) -> None:
    """Loaded weights have the requested dtype; fp32 reproduces the original exactly, fp16/bf16 closely."""
    names, meta = read_checkpoint_header(tiny_file)
    assert "spatial_blocks.0.attn.qkv.weight" in names and meta["chai_arch"] == "stdit3"
    model = load_stdit3(tiny_file, dtype)
    want = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}[dtype]
    assert {t.dtype for t in model.state_dict().values()} == {want}
    assert model.config == tiny.config and not model.training
    assert not any(p.requires_grad for p in model.parameters())
    x, ts, y, mask = make_inputs()
    with torch.no_grad():
        out, ref = model(x, ts, y, mask), tiny(x, ts, y, mask)
    assert out.dtype == torch.float32
    err = (out - ref).abs().max().item()
    assert err <= tol * max(1.0, ref.abs().max().item()), err


def test_load_without_metadata_infers_config(tiny: STDiT3, tmp_path: Path) -> None:
    """Bare official-style files (no metadata, no rope.freqs, a ComfyUI prefix) load; heads come from q_norm."""
    state = {f"model.diffusion_model.{k}": v.contiguous() for k, v in tiny.state_dict().items() if k != "rope.freqs"}
    path = tmp_path / "bare.safetensors"
    save_file(state, str(path))
    model = load_stdit3(path, "fp32")
    assert model.config == tiny.config
    assert torch.allclose(model.rope.freqs, tiny.rope.freqs)
    pt = tmp_path / "tiny.pt"
    torch.save({"state_dict": tiny.state_dict()}, pt)
    assert load_stdit3(pt).config == tiny.config


def test_infer_config_head_count_rules() -> None:
    """Heads: metadata, else q/k-norm width, else rope.freqs, else hidden/72; conflicts are errors."""
    with torch.device("meta"):
        xl = {k: tuple(v.shape) for k, v in STDiT3().state_dict().items()}
        small = {k: tuple(v.shape) for k, v in STDiT3(STDiT3Config(**TINY, qk_norm=False)).state_dict().items()}
    assert infer_config(xl) == STDiT3Config()
    assert infer_config(small).num_heads == 4  # from rope.freqs [8]
    no_rope = {k: v for k, v in small.items() if k != "rope.freqs"}
    with pytest.raises(ValueError, match="num_heads"):
        infer_config(no_rope)  # 64 is not a multiple of 72 and nothing else says
    meta = {"stdit3_config": json.dumps(STDiT3Config(**{**TINY, "num_heads": 2}, qk_norm=False).to_dict())}
    assert infer_config(no_rope, meta).num_heads == 2
    with pytest.raises(ValueError, match="head_dim"):
        infer_config(small, meta)  # rope.freqs says 16-wide heads
    bad = {"stdit3_config": json.dumps({**STDiT3Config(**TINY).to_dict(), "depth": 3})}
    with pytest.raises(ValueError, match="depth"):
        infer_config(small, bad)


def test_missing_and_unexpected_keys_are_named(tiny: STDiT3) -> None:
    """Key problems list the offending names (capped), and strict=False tolerates extra tensors only."""
    state = dict(tiny.state_dict())
    del state["temporal_blocks.1.mlp.fc2.bias"]
    del state["spatial_blocks.0.attn.k_norm.weight"]
    state["ema_decay"] = torch.zeros(1)
    state["final_layer.scale_shift_table"] = torch.zeros(3, 64)
    with pytest.raises(KeyMismatchError) as info:
        load_stdit3_state_dict(state, name="broken.safetensors")
    msg = str(info.value)
    assert "broken.safetensors" in msg and "2 missing" in msg
    assert "temporal_blocks.1.mlp.fc2.bias" in msg and "spatial_blocks.0.attn.k_norm.weight" in msg
    assert "1 unexpected: ema_decay" in msg and "final_layer.scale_shift_table (expected [2, 64], found [3, 64])" in msg
    assert info.value.missing == ["spatial_blocks.0.attn.k_norm.weight", "temporal_blocks.1.mlp.fc2.bias"]

    extra = dict(tiny.state_dict(), ema_decay=torch.zeros(1))
    with pytest.raises(KeyMismatchError, match="unexpected: ema_decay"):
        load_stdit3_state_dict(extra)
    assert load_stdit3_state_dict(extra, strict=False).config == tiny.config

    many = {k: v for k, v in tiny.state_dict().items() if not k.startswith("temporal_blocks.")}
    with pytest.raises(KeyMismatchError, match=r"missing: .*\.\.\. and \d+ more"):
        load_stdit3_state_dict(many, max_names=3)


@pytest.mark.parametrize("keys,looks_like", [
    (["encoder.conv_in.weight", "decoder.conv_in.weight", "encoder.down.0.block.0.conv1.weight"], "VAE"),
    (["spatial_vae.module.encoder.conv_in.weight", "temporal_vae.encoder.conv_in.conv.weight"], "Open-Sora 1.2 VAE"),
    (["blocks.0.self_attn.q.weight", "patch_embedding.weight", "text_embedding.0.weight"], "Wan"),
    (["model.diffusion_model.input_blocks.0.0.weight", "first_stage_model.encoder.conv_in.weight"],
     "Stable Diffusion UNet"),
    (["blocks.0.attn.qkv.weight", "y_embedder.y_embedding", "x_embedder.proj.weight"], "PixArt"),
    (["blocks.0.attn.qkv.weight", "blocks.0.attn_temp.qkv.weight", "x_embedder.proj.weight"], "STDiT2"),
    (["double_blocks.0.img_attn.qkv.weight"], "Flux"),
    (["spatial_blocks.0.attn.qkv.lora_A.weight"], "LoRA"),
    (["encoder.block.0.layer.0.SelfAttention.q.weight", "shared.weight"], "T5"),
    (["foo.weight"], "unrecognised"),
])
def test_wrong_architecture_is_refused_with_a_description(tmp_path: Path, keys: list[str], looks_like: str) -> None:
    """A checkpoint of another model is refused before any tensor is read, saying what it looks like."""
    path = tmp_path / "other.safetensors"
    save_file({k: torch.zeros(2) for k in keys}, str(path))
    with pytest.raises(WrongArchitectureError) as info:
        load_stdit3(path)
    msg = str(info.value)
    assert "not an Open-Sora 1.2 STDiT3 checkpoint" in msg and looks_like in msg and str(path) in msg


def test_loading_streams_one_tensor_at_a_time(tiny: STDiT3) -> None:
    """With a cast, each stored tensor is released before the next is read (no second copy accumulates)."""
    state = {k: v.clone() for k, v in tiny.state_dict().items()}
    alive: list[weakref.ref] = []
    peak = 0

    def read(name: str) -> torch.Tensor:
        nonlocal peak
        peak = max(peak, sum(r() is not None for r in alive))
        tensor = state.pop(name)  # the source gives up its reference, as a file reader does
        alive.append(weakref.ref(tensor))
        return tensor

    source = TensorSource("stream", {k: tuple(v.shape) for k, v in state.items()}, {}, read)
    model = load_stdit3_from_source(source, "bf16")
    assert peak == 0 and not state
    assert model.spatial_blocks[0].attn.qkv.weight.dtype == torch.bfloat16
