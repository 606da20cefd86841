"""Cache Attention: config, step selection, donor choice, the K/V math and the STDiT3 adapter (tier 1)."""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from comfyui_chai.chai_attention.adapters import UnsupportedModelError, get_adapter, supported_families
from comfyui_chai.chai_attention.adapters.stdit3 import STDiT3Adapter
from comfyui_chai.chai_attention.config import ChaiConfig, parse_cache_steps
from comfyui_chai.chai_attention.donors import Donor, DonorCapture, DonorSet
from comfyui_chai.chai_attention.identity import model_fingerprint
from comfyui_chai.chai_attention.kv import chunk_row_mask, combine_kv
from comfyui_chai.chai_attention.constants import RUN_KEY
from comfyui_chai.chai_attention.hooks import CacheAttentionWrapper, with_block_patch
from comfyui_chai.chai_attention.torch_pipeline import PatchedModel
from comfyui_chai.chai_attention.run import COND, UNCOND, CacheAttentionRun
from comfyui_chai.chai_attention.steps import CacheStepSelector, capture_plan, match_step, select_donor
import hook_doubles as hd
from chai_helpers import VIDEO, tiny_stdit3, toy_text_encode
from comfyui_chai.opensora.comfy_adapter import comfy_forward
from comfyui_chai.opensora.sampler import make_noise, opensora_model_kwargs, sample
from comfyui_chai.opensora.schedule import opensora_sigmas
from sampler_helpers import LatentCapture

PAPER_STEPS = (2, 3, 4)  # the mechanism tests use the paper's cache steps (the default is 5,6)

SHAPE = VIDEO.latent_shape()  # (1, 4, 5, 16, 16)
FAST = opensora_sigmas(8, VIDEO.height, VIDEO.width, VIDEO.num_frames)
FULL = opensora_sigmas(30, VIDEO.height, VIDEO.width, VIDEO.num_frames)


@pytest.fixture(scope="module")
def model():
    return tiny_stdit3()


@pytest.fixture(scope="module")
def adapter(model):
    return get_adapter(model)


def _inputs(batch_halves: int = 2, seed: int = 3):
    z = make_noise(SHAPE, seed=seed)
    y, mask = toy_text_encode("a red fox in the snow")
    y_un = torch.zeros_like(y)
    kw = opensora_model_kwargs(VIDEO.height, VIDEO.width, VIDEO.num_frames, batch_halves, VIDEO.fps)
    ys = torch.cat([y, y_un][:batch_halves])
    return z, ys, mask.repeat(batch_halves, 1), kw


def _run(config: ChaiConfig, donor: torch.Tensor, sigma: float) -> CacheAttentionRun:
    return CacheAttentionRun(config, FAST, DonorSet([Donor(sigma, donor)]))


def _forward(model, z, ys, mask, kw, sigma, replace=None):
    n = ys.shape[0]
    t = torch.full((n,), sigma * 1000.0)
    with torch.no_grad():
        return model(z.expand(n, *z.shape[1:]), t, ys, mask=mask, attn_replace=replace, **kw)


def _chai(model, adapter, z, ys, mask, kw, sigma, run, cond=None):
    """One model call through the Cache Attention hooks (the pure-torch PatchedModel); batch 2 = [cond; uncond],
    batch 1 = cond when ys is `cond` (default: ys itself), else uncond."""
    n = ys.shape[0]
    patched = PatchedModel(model, adapter, run, ys if cond is None else cond, batch=1)
    with torch.no_grad():
        return patched(z.expand(n, *z.shape[1:]), torch.full((n,), sigma * 1000.0), ys, mask=mask, **kw)


def _block0_attention_output(model, fn):
    """(fn(), block 0's spatial self-attention output [(B*T), S, C] in fn's last model call)."""
    seen = []
    handle = model.spatial_blocks[0].attn.proj.register_forward_hook(lambda mod, args, out: seen.append(out))
    try:
        result = fn()
    finally:
        handle.remove()
    return result, seen[-1]


# ------------------------------------------------------------------------------------------------ config

def test_config_defaults_are_the_papers_but_for_the_lab_measured_cache_steps():
    c = ChaiConfig()
    assert (c.full_steps, c.fast_steps, c.cache_steps) == (30, 8, (5, 6))
    assert (c.kv_mode, c.apply_to, c.donor_mapping) == ("replace", "cond", "matched_sigma")
    assert ChaiConfig.from_dict(c.to_dict()) == c


@pytest.mark.parametrize("text, expected", [("2,3,4", (2, 3, 4)), (" 4 2, 3 ", (2, 3, 4)), ("3,3", (3,)),
                                            ("", ()), ("none", ()), (5, (5,)), ([4, 2], (2, 4))])
def test_cache_steps_parse(text, expected):
    assert parse_cache_steps(text) == expected
    assert ChaiConfig(cache_steps=text).cache_steps == expected


@pytest.mark.parametrize("kwargs, message", [
    ({"cache_steps": "0,1"}, "counted from 1"),
    ({"cache_steps": "2,x"}, "whole step numbers"),
    ({"cache_steps": "2.5"}, "whole step numbers"),
    ({"cache_steps": "2,9"}, "beyond the 8 fast steps"),
    ({"fast_steps": 0}, "fast_steps must be a positive"),
    ({"full_steps": True}, "full_steps must be a positive"),
    ({"kv_mode": "add"}, "replace, concat"),
    ({"apply_to": "uncond"}, "cond, both"),
    ({"donor_mapping": "nearest"}, "matched_sigma, same_index, final_clean"),
])
def test_config_rejects_bad_values_with_clear_messages(kwargs, message):
    with pytest.raises(ValueError, match=message):
        ChaiConfig(**kwargs)


# ------------------------------------------------------------------------------------------------ steps

def test_sigma_matching_tolerates_float32_rounding_but_not_off_schedule_sigmas():
    sig = [float(s) for s in FAST]
    for i, s in enumerate(sig[:-1]):
        assert match_step(s, sig) == i
        roundtrip = float(torch.tensor(s * 1000.0, dtype=torch.float32)) / 1000.0
        assert match_step(roundtrip, sig) == i
        assert match_step(s * (1 + 5e-5), sig) == i
        assert match_step(s * (1 + 5e-3), sig) is None
    assert match_step(0.0, sig) is None  # the end point is never a step
    assert match_step(float("nan"), sig) is None
    midpoints = [math.sqrt(a * b) for a, b in zip(sig[:-2], sig[1:-1])]  # dpm2-style intermediate evaluations
    assert all(match_step(m, sig) is None for m in midpoints)


def test_selector_marks_exactly_the_cache_steps_and_heun_correctors_by_noise_level():
    sel = CacheStepSelector(FAST, (2, 3, 4))
    hits = [sel.cache_step_of(float(s)) for s in FAST[:-1]]
    assert hits == [None, 2, 3, 4, None, None, None, None]
    # heun evaluates step i at sigma[i] and its corrector at sigma[i + 1]: the corrector is treated as step i + 1
    heun = [float(FAST[i + d]) for i in range(8) for d in (0, 1) if i + d < 8]
    assert [sel.cache_step_of(s) for s in heun].count(2) == 2
    with pytest.raises(ValueError, match="outside"):
        CacheStepSelector(FAST, (9,))
    with pytest.raises(ValueError, match="strictly decreasing"):
        CacheStepSelector([1.0, 1.0, 0.0], (1,))


def test_capture_plan_matched_sigma_picks_the_nearest_full_sigma():
    plan = capture_plan(FULL, FAST, (2, 3, 4), "matched_sigma")
    full = [float(s) for s in FULL[:-1]]
    for want, idx, sig in zip([float(FAST[k]) for k in (1, 2, 3)], plan.indices, plan.sigmas):
        assert sig == full[idx]
        assert all(abs(full[idx] - want) <= abs(f - want) for f in full)
    assert len(set(plan.indices)) == 3 and not plan.final
    assert list(plan.indices) == sorted(plan.indices)
    same = capture_plan(FULL, FAST, (2, 3, 4), "same_index")
    assert same.indices == (1, 2, 3)
    clean = capture_plan(FULL, FAST, (2, 3, 4), "final_clean")
    assert clean.indices == () and clean.final and clean.final_sigma == 0.0


def test_donor_selection_per_mapping():
    sigmas = [0.9, 0.5, 0.0]
    assert select_donor(sigmas, 0.6, 0, "matched_sigma") == 1
    assert select_donor(sigmas, 0.6, 0, "same_index") == 0
    assert select_donor(sigmas, 0.6, 7, "same_index") == 2
    assert select_donor(sigmas, 0.95, 0, "final_clean") == 2


def test_full_run_capture_records_the_planned_latents_and_their_sigmas():
    plan = capture_plan(FULL, FAST, (2, 3, 4))
    cap, ref = DonorCapture(plan), LatentCapture(plan.indices)
    noise = make_noise((1, 4, 1, 2, 2), seed=0)

    def velocity(x, t, y, **kw):
        return -x

    def both(i, x, s, v):
        cap(i, x, s, v)
        ref(i, x, s, v)

    sample(velocity, noise, torch.zeros(1, 1, 2, 2), None, FULL, 1.0, both)
    donors = cap.donors()
    assert donors.sigmas == tuple(sorted(plan.sigmas, reverse=True))
    for d, i in zip(donors.donors, plan.indices):
        assert torch.equal(d.latent, ref.latents[i])
    tensors, sigmas = donors.to_entry()
    assert sorted(tensors) == ["donor_00", "donor_01", "donor_02"]
    again = DonorSet.from_entry(tensors, sigmas)
    assert again.sigmas == donors.sigmas and all(torch.equal(a.latent, b.latent)
                                                 for a, b in zip(again.donors, donors.donors))
    incomplete = DonorCapture(plan)
    with pytest.raises(RuntimeError, match="missing steps"):
        incomplete.donors()
    with pytest.raises(ValueError, match="not a CHAI donor"):
        DonorSet.from_entry({"x0": noise}, [0.5])
    with pytest.raises(ValueError, match="differ in shape"):
        DonorSet([Donor(0.5, noise), Donor(0.4, noise[..., :1])])


# ------------------------------------------------------------------------------------------------ K/V maths

def _obvious_attention(q, k, v):
    """softmax(q k^T / sqrt(d)) v for one row [heads, N, d]."""
    w = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1]), dim=-1)
    return w @ v


@pytest.mark.parametrize("mode", ["replace", "concat"])
def test_combine_kv_and_the_row_mask_equal_the_obvious_computation(mode):
    gen = torch.Generator().manual_seed(0)
    rows, heads, n, d = 6, 2, 5, 4
    q, k, v = (torch.randn(rows, heads, n, d, generator=gen) for _ in range(3))
    kd, vd = (torch.randn(3, heads, 7, d, generator=gen) for _ in range(2))  # 3 donor frames, tiled to 6 rows
    mask = chunk_row_mask([True, False], rows)
    assert mask.tolist() == [True] * 3 + [False] * 3
    out = F.scaled_dot_product_attention(q, k, v)
    out[mask] = F.scaled_dot_product_attention(q[mask], *combine_kv(k[mask], v[mask], kd, vd, mode))
    for r in range(rows):
        if r < 3:
            kk, vv = (kd[r], vd[r]) if mode == "replace" else (torch.cat([k[r], kd[r]], 1), torch.cat([v[r], vd[r]], 1))
        else:
            kk, vv = k[r], v[r]
        torch.testing.assert_close(out[r], _obvious_attention(q[r], kk, vv), atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match="does not divide"):
        combine_kv(k, v, torch.zeros(4, heads, 7, d), torch.zeros(4, heads, 7, d))
    with pytest.raises(ValueError, match="K/V mode"):
        combine_kv(k, v, kd, vd, "add")


def _record_call(model, z, ys, mask, kw, sigma):
    seen = {}

    def grab(call):
        seen["call"] = call
        return call.block.attn.attend(call.q, call.k, call.v)

    _forward(model, z, ys, mask, kw, sigma, {("spatial_attn", 0): grab})
    return seen["call"]


def _obvious_block0_cache_attention(model, call, donor, mode, patched_chunks, donor_t_mlp=None):
    """Block 0's self-attention output with donor K/V, from the weights, one frame at a time; the donor is
    modulated with donor_t_mlp [6C] (default: the live call's first row)."""
    blk, cfg = model.spatial_blocks[0], model.config
    c, heads, d, eps = cfg.hidden_size, cfg.num_heads, cfg.head_dim, cfg.norm_eps
    w, b = blk.attn.qkv.weight, blk.attn.qkv.bias

    def rms(x, weight):
        return weight * x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + eps)

    def heads_of(x, part):
        rows = slice(part * c, (part + 1) * c)
        return (x @ w[rows].T + b[rows]).view(x.shape[0], heads, d).transpose(0, 1)

    def modulate(tokens, t_mlp_row):
        table = blk.scale_shift_table + t_mlp_row.view(6, c)
        return F.layer_norm(tokens, (c,), eps=eps) * (1 + table[1]) + table[0]

    donor_t_mlp = call.t_mlp[0] if donor_t_mlp is None else donor_t_mlp
    donor_tokens = modulate(model.embed_video(donor, call.info["height"], call.info["width"])[0], donor_t_mlp)
    T, S = call.T, call.S
    outs = []
    for r in range(call.q.shape[0]):
        chunk, frame = divmod(r, T)
        live = call.x_mod[chunk, frame * S:(frame + 1) * S]
        q = rms(heads_of(live, 0), blk.attn.q_norm.weight)
        k, v = rms(heads_of(live, 1), blk.attn.k_norm.weight), heads_of(live, 2)
        if chunk in patched_chunks:
            don = donor_tokens[frame * S:(frame + 1) * S]
            kd, vd = rms(heads_of(don, 1), blk.attn.k_norm.weight), heads_of(don, 2)
            k, v = (kd, vd) if mode == "replace" else (torch.cat([k, kd], 1), torch.cat([v, vd], 1))
        o = _obvious_attention(q, k, v).transpose(0, 1).reshape(S, c)
        outs.append(o @ blk.attn.proj.weight.T + blk.attn.proj.bias)
    return torch.stack(outs)


@pytest.mark.parametrize("mode", ["replace", "concat"])
@pytest.mark.parametrize("apply_to, patched", [("cond", {0}), ("both", {0, 1})])
def test_stdit3_cache_attention_equals_the_obvious_computation(model, adapter, mode, apply_to, patched):
    z, ys, mask, kw = _inputs()
    donor = make_noise(SHAPE, seed=11)
    sigma = float(FAST[2])
    call = _record_call(model, z, ys, mask, kw, sigma)
    run = _run(ChaiConfig(cache_steps=PAPER_STEPS, kv_mode=mode, apply_to=apply_to), donor, sigma)
    _, got = _block0_attention_output(model, lambda: _chai(model, adapter, z, ys, mask, kw, sigma, run))
    with torch.no_grad():
        want = _obvious_block0_cache_attention(model, call, donor, mode, patched)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-4)
    assert [(f.step, f.kind, f.index) for f in run.firings] == [(3, "spatial", 0)]


@pytest.mark.parametrize("mode", ["replace", "concat"])
def test_donor_equal_to_live_latent_leaves_the_model_output_unchanged(model, adapter, mode):
    z, ys, mask, kw = _inputs()
    sigma = float(FAST[1])
    plain = _forward(model, z, ys, mask, kw, sigma)
    run = _run(ChaiConfig(cache_steps=PAPER_STEPS, kv_mode=mode, apply_to="both"), z, sigma)
    patched = _chai(model, adapter, z, ys, mask, kw, sigma, run)
    assert run.fired_steps == (2,)
    torch.testing.assert_close(patched, plain, atol=1e-5, rtol=0)
    other = _run(ChaiConfig(cache_steps=PAPER_STEPS, kv_mode=mode, apply_to="both"), make_noise(SHAPE, seed=5), sigma)
    changed = _chai(model, adapter, z, ys, mask, kw, sigma, other)
    assert (changed - plain).abs().max() > 1e-3  # a different donor does change the output


def test_cond_only_versus_both_on_batched_cfg(model, adapter):
    z, ys, mask, kw = _inputs()
    sigma = float(FAST[3])
    donor = make_noise(SHAPE, seed=7)
    plain = _forward(model, z, ys, mask, kw, sigma)
    paper = ChaiConfig(cache_steps=PAPER_STEPS)
    cond_only = _chai(model, adapter, z, ys, mask, kw, sigma, _run(paper, donor, sigma))
    both = _chai(model, adapter, z, ys, mask, kw, sigma,
                 _run(ChaiConfig(cache_steps=PAPER_STEPS, apply_to="both"), donor, sigma))
    assert torch.equal(cond_only[1], plain[1])  # the uncond half is untouched
    assert (cond_only[0] - plain[0]).abs().max() > 1e-3
    assert (both[1] - plain[1]).abs().max() > 1e-3
    torch.testing.assert_close(both[0], cond_only[0], atol=1e-5, rtol=0)  # rows are independent
    # split calls: a cond call attends to the donor, an uncond call does not unless apply_to == "both"
    run = _run(ChaiConfig(cache_steps=PAPER_STEPS), donor, sigma)
    cond_call = _chai(model, adapter, z, ys[:1], mask[:1], _half(kw), sigma, run)
    uncond_call = _chai(model, adapter, z, ys[1:], mask[1:], _half(kw), sigma, run, cond=ys[:1])
    torch.testing.assert_close(cond_call[0], cond_only[0], atol=1e-5, rtol=0)
    assert torch.equal(uncond_call, _forward(model, z, ys[1:], mask[1:], _half(kw), sigma))
    assert [f.rows for f in run.firings] == [5]  # the cond call's 5 frames only


def _half(kw):
    return {k: v[:1] if isinstance(v, torch.Tensor) else v for k, v in kw.items()}


def test_a_sigma_off_the_schedule_never_triggers(model, adapter):
    z, ys, mask, kw = _inputs()
    donor = make_noise(SHAPE, seed=7)
    run = _run(ChaiConfig(cache_steps=PAPER_STEPS, apply_to="both"), donor, float(FAST[1]))
    mid = math.sqrt(float(FAST[1]) * float(FAST[2]))
    out = _chai(model, adapter, z, ys, mask, kw, mid, run)
    assert torch.equal(out, _forward(model, z, ys, mask, kw, mid))
    assert run.evaluations == 1 and run.firings == []


@pytest.mark.parametrize("batched, apply_to", [(True, "cond"), (False, "cond"), (False, "both")])
def test_patch_fires_exactly_at_the_cache_steps_and_only_in_block_0(model, adapter, batched, apply_to):
    y, mask = toy_text_encode("a red fox in the snow")
    kw = opensora_model_kwargs(VIDEO.height, VIDEO.width, VIDEO.num_frames, 1, VIDEO.fps, mask)
    donors = DonorSet([Donor(float(FAST[k]), make_noise(SHAPE, seed=20 + k)) for k in (1, 2, 3)])
    run = CacheAttentionRun(ChaiConfig(cache_steps=PAPER_STEPS, apply_to=apply_to), FAST, donors)
    inputs = []
    handle = model.register_forward_pre_hook(lambda mod, args: inputs.append(args[0]))
    try:
        patched = PatchedModel(model, adapter, run, y, batch=1)
        sample(patched, make_noise(SHAPE, seed=1), y, model.null_caption(1), FAST, 7.0, None, kw,
               batched_cfg=batched)
    finally:
        handle.remove()
    captures = [i for i, x in enumerate(inputs) if any(torch.equal(x[0], d.latent[0]) for d in donors.donors)]
    evaluations = 8 if batched else 16
    # The live calls, plus one capture pass per cache step: split calls of a step share its donor K/V
    # (run.donor_kv), and with apply_to="cond" the uncond call needs none.
    assert len(inputs) == evaluations + 3 and len(captures) == 3
    assert run.fired_steps == (2, 3, 4)
    assert len(run.firings) == (6 if apply_to == "both" else 3)  # cond-only: split uncond calls never fire
    assert {(f.kind, f.index) for f in run.firings} == {("spatial", 0)}
    # matched_sigma: each step's capture pass ran on the donor taken at its own sigma
    assert [next(i for i, d in enumerate(donors.donors) if torch.equal(inputs[c][0], d.latent[0])) for c in captures] \
        == [0, 1, 2]
    assert run._kv is not None  # the last step's donor K/V kept until the run is released
    run.release()
    assert run._kv is None


def test_final_clean_donor_is_modulated_at_timestep_zero(model, adapter):
    z, ys, mask, kw = _inputs()
    donor, sigma = make_noise(SHAPE, seed=2), float(FAST[1])
    run = CacheAttentionRun(ChaiConfig(cache_steps=PAPER_STEPS, donor_mapping="final_clean"), FAST,
                            DonorSet([Donor(0.0, donor)]))
    plan = run.plan_for(sigma)
    assert plan.modulation_sigma == 0.0 and plan.donor_sigma == 0.0
    call = _record_call(model, z, ys, mask, kw, sigma)
    _, got = _block0_attention_output(model, lambda: _chai(model, adapter, z, ys, mask, kw, sigma, run))
    with torch.no_grad():
        _, t_mlp_zero = model.embed_timestep(0.0, call.info["fps"].reshape(-1)[:1], 1)
        want = _obvious_block0_cache_attention(model, call, donor, "replace", {0}, donor_t_mlp=t_mlp_zero[0])
        at_live_timestep = _obvious_block0_cache_attention(model, call, donor, "replace", {0})
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-4)
    assert (got - at_live_timestep).abs().max() > 1e-3  # timestep zero made a difference
    assert run.fired_steps == (2,)


def test_mismatched_donor_shape_is_a_clear_error(model, adapter):
    z, ys, mask, kw = _inputs()
    run = _run(ChaiConfig(cache_steps=PAPER_STEPS), make_noise((1, 4, 5, 8, 8), seed=1), float(FAST[1]))
    with pytest.raises(ValueError, match="same shape"):
        _chai(model, adapter, z, ys, mask, kw, float(FAST[1]), run)


def test_unsupported_model_error_names_the_supported_families(model):
    assert isinstance(get_adapter(model), STDiT3Adapter)

    class Wrapper:  # a ComfyUI-like ModelPatcher -> BaseModel -> network chain
        def __init__(self, inner):
            self.model = torch.nn.Module()
            self.model.diffusion_model = inner

    assert get_adapter(Wrapper(model)).model is model
    with pytest.raises(UnsupportedModelError, match="supported: stdit3") as err:
        get_adapter(torch.nn.Linear(2, 2))
    assert "Linear" in str(err.value)
    assert any(f.startswith("stdit3") for f in supported_families())


def test_fingerprint_tracks_weights_dtype_and_ids(model):
    fp = model_fingerprint(model)
    assert fp.startswith("STDiT3@") and fp == model_fingerprint(model)
    other = tiny_stdit3(seed=1)
    assert model_fingerprint(other) != fp
    assert model_fingerprint(model, weights_id="file-a") != model_fingerprint(model, weights_id="file-b")
    assert model_fingerprint(model, weights_id="a", dtype=torch.bfloat16) != model_fingerprint(model, weights_id="a")


def _comfy_executor(model):
    """ComfyUI's APPLY_MODEL call shape (x, sigma, c_concat, c_crossattn, control, transformer_options) onto the
    pack's ComfyUI forward of STDiT3 (timestep = 1000 * sigma), as BaseModel runs it."""

    def apply_model(x, sigma, c_concat, c_crossattn, control, transformer_options, **extra):
        with torch.no_grad():
            return comfy_forward(model, x, sigma * 1000.0, c_crossattn, transformer_options)

    return apply_model


def test_the_wrapper_reads_layout_and_run_from_transformer_options_and_sigma_from_the_call(model, adapter):
    z, ys, _, _ = _inputs()
    sigma = float(FAST[1])
    donor = make_noise(SHAPE, seed=7)
    ys_swapped = ys.flip(0)  # [uncond; cond], as ComfyUI may order the chunks
    run = _run(ChaiConfig(cache_steps=PAPER_STEPS), donor, sigma)
    options = with_block_patch({"cond_or_uncond": [UNCOND, COND], RUN_KEY: run}, adapter)
    wrapper, execute = CacheAttentionWrapper(adapter), _comfy_executor(model)
    x, t = z.expand(2, *z.shape[1:]), torch.full((2,), sigma)
    got = wrapper(execute, x, t, None, ys_swapped, None, options)
    plain = execute(x, t, None, ys_swapped, None, {})
    assert run.fired_steps == (2,) and [f.rows for f in run.firings] == [5]
    assert torch.equal(got[0], plain[0])  # the uncond chunk is untouched
    assert (got[1] - plain[1]).abs().max() > 1e-3
    no_run = {k: v for k, v in options.items() if k != RUN_KEY}
    assert torch.equal(wrapper(execute, x, t, None, ys_swapped, None, no_run), plain)
    off_step = wrapper(execute, x, torch.full((2,), 0.999), None, ys_swapped, None, options)
    assert torch.equal(off_step, execute(x, torch.full((2,), 0.999), None, ys_swapped, None, {}))
    assert run.fired_steps == (2,) and len(run.firings) == 1


def test_options_sigma_reads_the_first_sigma_of_tensors_and_sequences():
    from comfyui_chai.chai_attention.steps import options_sigma

    assert options_sigma({"sigmas": torch.tensor([0.5, 0.25])}) == pytest.approx(0.5)
    assert options_sigma({"sigmas": [0.25, 0.1]}) == 0.25
    assert options_sigma({}) is None and options_sigma(None) is None
    assert options_sigma({"sigmas": torch.tensor([])}) is None


def test_comfy_install_chains_another_packs_block_0_attention_patch_and_never_stacks_itself(model, adapter):
    z, ys, _, _ = _inputs()
    sigma = float(FAST[1])
    seen = []

    def theirs(call):  # another pack's ("spatial_attn", 0) patch: it attends (here: plainly) and counts
        seen.append(call.k.clone())
        return call.block.attn.attend(call.q, call.k, call.v)

    patcher = hd.PatcherDouble(hd.BaseModelDouble(hd.SecretDiT()))
    patcher.set_model_patch_replace(theirs, "dit", "spatial_attn", 0)
    adapter.comfy_install(patcher)
    adapter.comfy_install(patcher)  # twice: replaces ours, one wrapper
    group = patcher.model_options["transformer_options"]["patches_replace"]["dit"]
    assert group[("spatial_attn", 0)] is theirs and group[("spatial_block", 0)].previous is None
    (wrapper,) = patcher.wrappers["apply_model"]["chai_cache_attention"]
    donor = make_noise(SHAPE, seed=7)
    run = _run(ChaiConfig(cache_steps=PAPER_STEPS, apply_to="both"), donor, sigma)
    execute = _comfy_executor(model)
    x = z.expand(2, *z.shape[1:])
    at_cache_step = {**patcher.model_options["transformer_options"], "cond_or_uncond": [COND, UNCOND], RUN_KEY: run}
    for options, t, fires in ((at_cache_step, 0.999, False), (at_cache_step, sigma, True)):
        seen.clear()
        got = wrapper(execute, x, torch.full((2,), t), None, ys, None, options)
        assert len(seen) == 1  # the capture pass stops before any attention runs
        if not fires:
            plain = execute(x, torch.full((2,), t), None, ys, None, {})
            assert torch.equal(got, plain)
    # At the cache step their patch attended with the donor's keys, not the live ones.
    assert run.fired_steps == (2,)
    plain_k = []

    def spy(call):
        plain_k.append(call.k)
        return call.block.attn.attend(call.q, call.k, call.v)

    execute(x, torch.full((2,), sigma), None, ys, None, {"patches_replace": {"dit": {("spatial_attn", 0): spy}}})
    assert seen[0].shape == plain_k[0].shape and not torch.equal(seen[0], plain_k[0])
