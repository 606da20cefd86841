"""Wan adapter, tier 1 (no ComfyUI): helper math, recognition, and the patch plumbing on a stand-in network.

ComfyUI's WanModel cannot be imported here, so nothing in this file claims to test Wan itself (tier 2 does that,
tests/tier2/test_comfy_chai_wan.py, on ComfyUI's own classes). The stand-in below only has the *shape* the adapter
relies on: a Conv3d patch embedding, blocks whose first one holds norm1, a modulation parameter and a self_attn with
q/k/v/o and norm_q/norm_k that calls module-level `apply_rope1` and `optimized_attention`, and a block loop that
honours patches_replace["dit"][("double_block", i)]. Its module-level `apply_rope1` and `optimized_attention` take
the arguments of ComfyUI's own (comfy/ldm/flux/math.py, comfy/ldm/modules/attention.py; RoPE tables are 2x2
rotation matrices per channel pair), with toy bodies. A fake patcher stands in for ComfyUI's ModelPatcher (object
patches applied around each call). The references below are re-derived from the math in this file: they use
none of the adapter's helpers.
"""
from __future__ import annotations

import math
from contextlib import contextmanager
from typing import Any, Iterator

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from comfyui_chai.chai_attention.adapters import UnsupportedModelError, get_adapter, supported_families
from comfyui_chai.chai_attention.adapters.wan import CALL_KEY, WanAdapter, WanCall, pad_to_patch, per_token, sinusoid
from comfyui_chai.chai_attention.config import ChaiConfig
from comfyui_chai.chai_attention.donors import Donor, DonorSet
from comfyui_chai.chai_attention.run import CacheAttentionRun

DIM, HEADS, CHANNELS = 16, 2, 4
SHAPE = (1, CHANNELS, 3, 4, 6)  # 3 x 2 x 3 = 18 tokens
SIGMAS = torch.linspace(1.0, 0.0, 9)


# ----------------------------------------------------------------------------------------- the stand-in


def rotation_table(angles: Tensor) -> Tensor:
    """ComfyUI's RoPE table layout from angles [L, d/2]: [1, L, 1, d/2, 2, 2] matrices [[cos, -sin], [sin, cos]]."""
    cos, sin = angles.cos(), angles.sin()
    return torch.stack([cos, -sin, sin, cos], dim=-1).view(1, angles.shape[0], 1, angles.shape[1], 2, 2)


def apply_rope1(x: Tensor, freqs_cis: Tensor) -> Tensor:
    """Stand-in RoPE: each channel pair of x [B, L, n, d] times its 2x2 matrix of freqs_cis [1, L, 1, d/2, 2, 2]."""
    pairs = x.float().unflatten(-1, (-1, 2))
    return torch.einsum("...ij,...j->...i", freqs_cis, pairs).flatten(-2).type_as(x)


def optimized_attention(q: Tensor, k: Tensor, v: Tensor, heads: int, mask: Tensor | None = None,
                        attn_precision: Any = None, skip_reshape: bool = False, skip_output_reshape: bool = False,
                        **kwargs: Any) -> Tensor:
    """Stand-in attention on [B, N, heads*d] tensors (mask and reshape options unused by Wan's self-attention)."""
    def split(t: Tensor) -> Tensor:
        return t.view(t.shape[0], t.shape[1], heads, -1).transpose(1, 2)

    out = F.scaled_dot_product_attention(split(q), split(k), split(v), attn_mask=mask)
    return out.transpose(1, 2).reshape(q.shape[0], q.shape[1], -1)


def spread_over_tokens(e: Tensor, tokens: int) -> Tensor:
    """e [B, F, dim] (F = 1 or one entry per latent frame) -> [B, tokens, dim]: token i is in frame i * F // tokens."""
    return e[:, torch.arange(tokens) * e.shape[1] // tokens]


def wrap_pad(z: Tensor, ph: int, pw: int) -> Tensor:
    """Append the first rows / columns of z [B, C, T, H, W] until H and W are multiples of ph and pw."""
    z = torch.cat([z, z[..., : (-z.shape[-2]) % ph, :]], dim=-2)
    return torch.cat([z, z[..., : (-z.shape[-1]) % pw]], dim=-1)


class StandInAttention(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.num_heads, self.head_dim = HEADS, DIM // HEADS
        self.q, self.k, self.v, self.o = (nn.Linear(DIM, DIM) for _ in range(4))
        self.norm_q, self.norm_k = nn.RMSNorm(DIM), nn.RMSNorm(DIM)

    def forward(self, x: Tensor, freqs: Tensor, transformer_options: dict = {}) -> Tensor:
        b, s, n = x.shape[0], x.shape[1], self.num_heads
        q = apply_rope1(self.norm_q(self.q(x)).view(b, s, n, -1), freqs)
        k = apply_rope1(self.norm_k(self.k(x)).view(b, s, n, -1), freqs)
        out = optimized_attention(q.view(b, s, -1), k.view(b, s, -1), self.v(x), heads=n,
                                  transformer_options=transformer_options)
        return self.o(out)


class StandInBlock(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(DIM, elementwise_affine=False)
        self.modulation = nn.Parameter(torch.randn(1, 6, DIM) / DIM ** 0.5)
        self.self_attn = StandInAttention()
        self.mlp = nn.Linear(DIM, DIM)

    def forward(self, x: Tensor, e: Tensor, freqs: Tensor, transformer_options: dict) -> Tensor:
        parts = [spread_over_tokens(p, x.shape[1]) for p in (self.modulation.unsqueeze(0) + e).unbind(2)]
        y = self.self_attn(torch.addcmul(parts[0], self.norm1(x), 1 + parts[1]), freqs,
                           transformer_options=transformer_options)
        x = torch.addcmul(x, y, parts[2])
        return x + parts[5] * self.mlp(x) + parts[3] + parts[4]


class StandInNet(nn.Module):
    """Wan-shaped toy network; t is [B] (one timestep per sample) or [B, T] (one per latent frame)."""

    def __init__(self) -> None:
        super().__init__()
        self.patch_embedding = nn.Conv3d(CHANNELS, DIM, (1, 2, 2), stride=(1, 2, 2))
        self.blocks = nn.ModuleList([StandInBlock(), StandInBlock()])
        self.time = nn.Linear(1, 6 * DIM)
        self.model_type, self.out_dim = "t2v", CHANNELS

    def forward(self, x: Tensor, t: Tensor, transformer_options: dict) -> Tensor:
        tokens = self.patch_embedding(wrap_pad(x, 2, 2).float()).flatten(2).transpose(1, 2)
        e0 = self.time(t.reshape(x.shape[0], -1, 1) / 1000).unflatten(2, (6, DIM))
        L = tokens.shape[1]
        freqs = rotation_table(torch.arange(L, dtype=torch.float32)[:, None]
                               * torch.linspace(0.1, 1.0, DIM // HEADS // 2))
        replaces = transformer_options.get("patches_replace", {}).get("dit", {})
        for i, block in enumerate(self.blocks):
            def original(args: dict, block: nn.Module = block) -> dict:
                return {"img": block(args["img"], args["vec"], args["pe"], args["transformer_options"])}

            args = {"img": tokens, "vec": e0, "pe": freqs, "transformer_options": transformer_options}
            tokens = replaces[("double_block", i)](args, {"original_block": original})["img"] \
                if ("double_block", i) in replaces else original(args)["img"]
        return tokens


class FakeSampling:
    def timestep(self, sigma: Tensor) -> Tensor:
        return sigma * 1000


class FakePatcher:
    """The slice of ComfyUI's ModelPatcher that comfy_install touches; object patches live only inside calls."""

    def __init__(self, net: nn.Module) -> None:
        self.model = nn.Module()
        self.model.diffusion_model = net
        self.model_options: dict = {"transformer_options": {}}
        self.object_patches: dict[str, Any] = {}

    def get_model_object(self, name: str) -> Any:
        if name in self.object_patches:
            return self.object_patches[name]
        if name == "model_sampling":
            return FakeSampling()
        obj: Any = self.model
        for part in name.split("."):
            obj = getattr(obj, part)
        return obj

    def set_model_patch_replace(self, fn: Any, name: str, block_name: str, number: int) -> None:
        to = self.model_options["transformer_options"]
        to.setdefault("patches_replace", {}).setdefault(name, {})[(block_name, number)] = fn

    def add_object_patch(self, name: str, obj: Any) -> None:
        self.object_patches[name] = obj

    @contextmanager
    def applied(self) -> Iterator[None]:
        saved = []
        for name, value in self.object_patches.items():
            owner_path, _, attr = name.rpartition(".")
            owner = self.get_model_object(owner_path)
            saved.append((owner, attr, owner.__dict__.get(attr)))
            setattr(owner, attr, value)
        try:
            yield
        finally:
            for owner, attr, old in reversed(saved):
                if old is None:
                    delattr(owner, attr)
                else:
                    setattr(owner, attr, old)

    def __call__(self, x: Tensor, sigma: float, cond_or_uncond: list[int], run: Any = None,
                 t: Tensor | None = None) -> Tensor:
        options = {**self.model_options["transformer_options"], "sigmas": torch.full((x.shape[0],), sigma),
                   "cond_or_uncond": cond_or_uncond}
        if run is not None:
            options["chai_run"] = run
        t = torch.full((x.shape[0],), sigma * 1000) if t is None else t
        with self.applied(), torch.no_grad():
            return self.model.diffusion_model(x, t, options)


@pytest.fixture(scope="module")
def net() -> StandInNet:
    torch.manual_seed(0)
    return StandInNet().eval()


def make_run(donor: Tensor, step: int = 2, **config: Any) -> CacheAttentionRun:
    """A run whose donor serves the 1-based `step` of the 8-step schedule."""
    return CacheAttentionRun(ChaiConfig(fast_steps=8, **config), SIGMAS,
                             DonorSet([Donor(float(SIGMAS[step - 1]), donor)]))


def installed(net: StandInNet) -> FakePatcher:
    patcher = FakePatcher(net)
    get_adapter(patcher).comfy_install(patcher)
    return patcher


# ------------------------------------------------------------------------------------------------ helpers


def test_per_token_spreads_one_entry_per_frame_over_its_tokens():
    e = torch.arange(3.0).view(1, 3, 1)
    assert per_token(e[:, :1], 12).shape == (1, 1, 1)  # one entry broadcasts over every token
    assert torch.equal(per_token(e, 3), e)
    assert per_token(e, 12).flatten().tolist() == [0.0] * 4 + [1.0] * 4 + [2.0] * 4
    assert per_token(e, 10).flatten().tolist() == [0.0] * 4 + [1.0] * 4 + [2.0] * 2  # ceil, then cut


def test_pad_to_patch_is_circular_at_the_end_and_a_no_op_when_divisible():
    z = torch.arange(2 * 3 * 5, dtype=torch.float32).view(1, 1, 2, 3, 5)
    assert pad_to_patch(z, (1, 3, 5)) is z
    padded = pad_to_patch(z, (1, 2, 2))
    assert padded.shape == (1, 1, 2, 4, 6)
    assert torch.equal(padded[..., :3, :5], z)
    assert torch.equal(padded[..., 3, :5], z[..., 0, :]) and torch.equal(padded[..., :3, 5], z[..., :, 0])


def test_sinusoid_is_cos_then_sin_of_geometric_frequencies():
    emb = sinusoid(8, torch.tensor([0.0, 500.0]))
    want = [[math.cos(t * 10000 ** (-i / 4)) for i in range(4)] + [math.sin(t * 10000 ** (-i / 4)) for i in range(4)]
            for t in (0.0, 500.0)]
    torch.testing.assert_close(emb, torch.tensor(want), atol=1e-4, rtol=1e-5)


# --------------------------------------------------------------------------------------------- recognition


def test_registry_lists_wan_and_picks_it_by_structure(net):
    assert get_adapter(net).family == "wan"
    assert any(f.startswith("wan (Wan 2.1 / 2.2 text-to-video") for f in supported_families())
    assert isinstance(get_adapter(FakePatcher(net)), WanAdapter)
    with pytest.raises(UnsupportedModelError, match="supported: stdit3 .*; wan "):
        get_adapter(nn.Linear(2, 2))
    headless = StandInNet()
    del headless.blocks[0].self_attn.norm_k
    assert not WanAdapter.recognise(headless)
    assert not WanAdapter.recognise(nn.Sequential(nn.Conv3d(1, 1, 1)))


@pytest.mark.parametrize("change, message", [
    (lambda m: setattr(m, "model_type", "i2v"), "image-to-video"),
    (lambda m: setattr(m, "patch_embedding", nn.Conv3d(CHANNELS + 4, DIM, (1, 2, 2))), "cannot be embedded"),
    (lambda m: setattr(m, "vace_patch_embedding", nn.Conv3d(8, DIM, 1)), "Wan VACE model"),
    (lambda m: setattr(m, "control_adapter", nn.Linear(1, 1)), "Wan Camera model"),
])
def test_unsupported_wan_variants_are_refused_with_what_is_supported(change, message):
    model = StandInNet()
    change(model)
    with pytest.raises(UnsupportedModelError, match=message) as err:
        get_adapter(model)
    assert "Supported: Wan 2.1 T2V" in str(err.value)


def test_check_run_wants_the_models_channels_and_the_sampled_shape(net):
    adapter = WanAdapter(net)
    adapter.check_run(make_run(torch.zeros(SHAPE)), SHAPE)
    with pytest.raises(ValueError, match="same resolution and frame count"):
        adapter.check_run(make_run(torch.zeros(SHAPE)), (2, CHANNELS, 5, 4, 6))
    with pytest.raises(ValueError, match="not 4-channel Wan video latents"):
        adapter.check_run(make_run(torch.zeros(1, 3, 3, 4, 6)))


# ------------------------------------------------------------------------------------- patch and plumbing


def _rotate(x: Tensor, angles: Tensor) -> Tensor:
    """x [L, heads, d] with channel pair j of token i turned by angles[i, j], as complex numbers."""
    z = torch.view_as_complex(x.float().reshape(*x.shape[:-1], -1, 2).contiguous())
    return torch.view_as_real(z * torch.polar(torch.ones_like(angles), angles)[:, None, :]).flatten(-2)


def _patch_tokens(net: StandInNet, latent: Tensor) -> Tensor:
    """latent [1, C, T, H, W] -> [L, dim]: each 1x2x2 patch, frame by frame, row by row, dotted with the weight."""
    weight, bias = net.patch_embedding.weight[:, :, 0], net.patch_embedding.bias  # [dim, C, 2, 2], [dim]
    _, _, frames, height, width = latent.shape
    return torch.stack([(weight * latent[0, :, f, y:y + 2, x:x + 2]).sum(dim=(1, 2, 3)) + bias
                        for f in range(frames) for y in range(0, height, 2) for x in range(0, width, 2)])


def _obvious_cache_attention(net: StandInNet, x_live: Tensor, donor: Tensor, e0: Tensor, angles: Tensor,
                             mode: str) -> Tensor:
    """Block 0's self-attention with donor K/V, written out step by step for one sample."""
    block, attn = net.blocks[0], net.blocks[0].self_attn
    tokens = _patch_tokens(net, donor)  # [L, dim]
    L, d = tokens.shape[0], DIM // HEADS
    frames = e0.shape[1]
    shift = torch.stack([(block.modulation[0, 0] + e0[0, min(i * frames // L, frames - 1), 0]) for i in range(L)])
    scale = torch.stack([(block.modulation[0, 1] + e0[0, min(i * frames // L, frames - 1), 1]) for i in range(L)])
    centred = tokens - tokens.mean(-1, keepdim=True)
    h = centred / torch.sqrt(centred.pow(2).mean(-1, keepdim=True) + 1e-5) * (1 + scale) + shift
    q = _rotate(attn.norm_q(attn.q(x_live[0])).view(L, HEADS, d), angles)
    k_own = _rotate(attn.norm_k(attn.k(x_live[0])).view(L, HEADS, d), angles)
    v_own = attn.v(x_live[0]).view(L, HEADS, d)
    k_don = _rotate(attn.norm_k(attn.k(h)).view(L, HEADS, d), angles)
    v_don = attn.v(h).view(L, HEADS, d)
    k, v = (k_don, v_don) if mode == "replace" else (torch.cat([k_own, k_don]), torch.cat([v_own, v_don]))
    heads = []
    for j in range(HEADS):
        weights = torch.softmax(q[:, j] @ k[:, j].T / math.sqrt(d), dim=-1)
        heads.append(weights @ v[:, j])
    return attn.o(torch.cat(heads, dim=-1))[None]


@pytest.mark.parametrize("mode", ["replace", "concat"])
@pytest.mark.parametrize("frames", [1, 3])  # one e0 per sample, or one per latent frame (Wan 2.2 5B with a mask)
def test_cache_attention_equals_the_obvious_computation(net, mode, frames):
    gen = torch.Generator().manual_seed(1)
    donor = torch.randn(SHAPE, generator=gen)
    x_live = torch.randn(1, 18, DIM, generator=gen)
    e0 = torch.randn(1, frames, 6, DIM, generator=gen)
    angles = torch.rand(18, DIM // HEADS // 2, generator=gen) * 3
    adapter = WanAdapter(net)
    run = make_run(donor, kv_mode=mode)
    call = WanCall(run, run.plan_for(float(SIGMAS[1])), (True,), e0, lambda s: torch.tensor([s * 1000]))
    with torch.no_grad():
        got = adapter.cache_self_attention(x_live, rotation_table(angles), {}, call)
        want = _obvious_cache_attention(net, x_live, donor, e0, angles, mode)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-4)
    assert [(f.step, f.kind, f.index, f.rows) for f in run.firings] == [(2, "self_attn", 0, 1)]


def test_donor_equal_to_live_latent_leaves_the_stand_in_unchanged(net):
    x = torch.randn(SHAPE, generator=torch.Generator().manual_seed(2))
    patcher, sigma = installed(net), float(SIGMAS[1])
    plain = FakePatcher(net)(x, sigma, [0])
    run = make_run(x)
    assert torch.equal(patcher(x, sigma, [0], run), plain)
    assert run.fired_steps == (2,)
    other = make_run(torch.randn(SHAPE, generator=torch.Generator().manual_seed(3)))
    assert (patcher(x, sigma, [0], other) - plain).abs().max() > 1e-3


def test_cond_only_keeps_the_uncond_rows_bit_identical_and_both_changes_them(net):
    gen = torch.Generator().manual_seed(4)
    x, donor = torch.randn(SHAPE, generator=gen), torch.randn(SHAPE, generator=gen)
    xx, sigma = x.repeat(2, 1, 1, 1, 1), float(SIGMAS[2])
    patcher, plain = installed(net), FakePatcher(net)(x.repeat(2, 1, 1, 1, 1), sigma, [1, 0])
    cond_only = patcher(xx, sigma, [1, 0], make_run(donor, step=3))
    assert torch.equal(cond_only[0], plain[0]) and (cond_only[1] - plain[1]).abs().max() > 1e-3
    both = patcher(xx, sigma, [1, 0], make_run(donor, step=3, apply_to="both"))
    assert (both[0] - plain[0]).abs().max() > 1e-3
    uncond_call = make_run(donor, step=3)
    assert torch.equal(patcher(x, sigma, [1], uncond_call), FakePatcher(net)(x, sigma, [1]))
    assert uncond_call.firings == [] and uncond_call.evaluations == 1


def test_only_block_0_only_at_cache_steps_and_original_forward_otherwise(net):
    gen = torch.Generator().manual_seed(5)
    x, donor = torch.randn(SHAPE, generator=gen), torch.randn(SHAPE, generator=gen)
    patcher = installed(net)
    marked: list[int] = []
    for i, block in enumerate(net.blocks):
        block.self_attn.register_forward_pre_hook(
            lambda m, a, kw, i=i: marked.append(i) if CALL_KEY in kw.get("transformer_options", {}) else None,
            with_kwargs=True)
    try:
        run = make_run(donor, cache_steps="2,3,4")
        for k in range(8):
            patcher(x, float(SIGMAS[k]), [0], run)
        patcher(x, float(SIGMAS[1] + SIGMAS[2]) / 2, [0], run)  # between two steps: never a cache step
        assert run.evaluations == 9 and run.fired_steps == (2, 3, 4) and marked == [0, 0, 0]
        assert {(f.kind, f.index) for f in run.firings} == {("self_attn", 0)}
        assert torch.equal(patcher(x, float(SIGMAS[1]), [0]), FakePatcher(net)(x, float(SIGMAS[1]), [0]))  # no run
    finally:
        for block in net.blocks:
            block.self_attn._forward_pre_hooks.clear()
    assert "forward" not in net.blocks[0].self_attn.__dict__  # the fake patcher restored the module


def test_install_chains_a_previous_block_replace_and_never_stacks_itself(net):
    patcher = FakePatcher(net)
    calls: list[bool] = []

    def previous(args: dict, extra: dict) -> dict:
        calls.append(CALL_KEY in args["transformer_options"])
        return extra["original_block"](args)

    patcher.set_model_patch_replace(previous, "dit", "double_block", 0)
    adapter = get_adapter(patcher)
    adapter.comfy_install(patcher)
    adapter.comfy_install(patcher)
    forward = patcher.object_patches["diffusion_model.blocks.0.self_attn.forward"]
    assert forward.chai_wan_original.__func__ is StandInAttention.forward
    x = torch.randn(SHAPE, generator=torch.Generator().manual_seed(6))
    run = make_run(torch.randn(SHAPE, generator=torch.Generator().manual_seed(7)))
    patcher(x, float(SIGMAS[1]), [0], run)
    assert calls == [True] and len(run.firings) == 1  # one CHAI layer, then the earlier patch, then the block
    with pytest.raises(ValueError, match="another model"):
        WanAdapter(StandInNet()).comfy_install(patcher)


def test_a_donor_of_another_shape_is_a_clear_error_inside_the_patch(net):
    patcher = installed(net)
    x = torch.randn(SHAPE, generator=torch.Generator().manual_seed(8))
    with pytest.raises(ValueError, match="live latent's shape"):
        patcher(x, float(SIGMAS[1]), [0], make_run(torch.randn(1, CHANNELS, 3, 4, 4)))


def test_final_clean_modulates_the_donor_at_its_own_sigma(net):
    gen = torch.Generator().manual_seed(9)
    x, donor = torch.randn(SHAPE, generator=gen), torch.randn(SHAPE, generator=gen)
    net.freq_dim = 8
    net.time_embedding = nn.Linear(8, DIM)
    net.time_projection = nn.Sequential(nn.SiLU(), nn.Linear(DIM, 6 * DIM))
    try:
        patcher, sigma = installed(net), float(SIGMAS[2])
        run = CacheAttentionRun(ChaiConfig(fast_steps=8, donor_mapping="final_clean"), SIGMAS,
                                DonorSet([Donor(0.0, donor)]))
        got = patcher(x, sigma, [0], run)
        assert [f.step for f in run.firings] == [3]
        own = patcher(x, sigma, [0], make_run(donor, step=3))
        assert (got - own).abs().max() > 1e-4
        adapter = WanAdapter(net)
        for sigma in (0.0, 0.3):  # the donor's own sigma here, and one that turns every frequency
            t = sigma * 1000
            freq_input = torch.tensor([[math.cos(t * 10000 ** (-i / 4)) for i in range(4)]
                                       + [math.sin(t * 10000 ** (-i / 4)) for i in range(4)]])
            with torch.no_grad():
                e0 = adapter.time_modulation(sigma, lambda s: torch.tensor([s * 1000]), torch.zeros(1, 1, 6, DIM))
                want = net.time_projection(net.time_embedding(freq_input)).view(1, 1, 6, DIM)
            torch.testing.assert_close(e0, want, atol=1e-4, rtol=1e-4)
    finally:
        del net.freq_dim, net.time_embedding, net.time_projection
