"""Tier 2: Cache Attention on ComfyUI's own Wan models (tiny, random weights, built at test time).

ComfyUI's WanModel is built at a tiny config (dim 256, so its loader reads 2 heads of 128; 2 blocks), its state
dict randomised and saved under the official key names, and the file loaded through ComfyUI's loader
(comfy.sd.load_diffusion_model), which detects WAN21 (16-channel latent) or WAN22 (Wan 2.2 5B, 48 channels).
The CHAI patch goes on a ModelPatcher clone through WanAdapter.comfy_install (public hooks only: a block-0 DiT
replace and an APPLY_MODEL wrapper); sampling runs through comfy.sample.sample with the run in
transformer_options["chai_run"]; single evaluations go through BaseModel.apply_model with the patcher's wrappers
merged into the options, as ComfyUI's sampler does.
"""
from __future__ import annotations

import os
from typing import Any

import pytest
from comfy_test_nodes import wan_random_state

if not os.environ.get("COMFYUI_DIR"):
    pytest.skip("tier 2 needs a ComfyUI checkout: set COMFYUI_DIR (see tests/tier2/conftest.py)",
                allow_module_level=True)

import torch  # noqa: E402

DIM = 256
SHAPE_21 = (1, 16, 3, 8, 8)  # 3 x 4 x 4 = 48 tokens
SHAPE_22 = (1, 48, 3, 8, 8)
STEPS = 8
CFG = 3.0
TEXT_TOKENS = 6


def _tiny_wan(wan: Any, ops: Any, channels: int, layers: int = 2, **kw: Any) -> torch.nn.Module:
    return wan.WanModel(model_type=kw.pop("model_type", "t2v"), dim=DIM, ffn_dim=128, num_heads=DIM // 128,
                        num_layers=layers, in_dim=kw.pop("in_dim", channels), out_dim=channels,
                        operations=ops.disable_weight_init, **kw)


@pytest.fixture(scope="module")
def env(comfy, tmp_path_factory) -> dict[str, Any]:
    """Tiny Wan 2.1 and Wan 2.2 5B checkpoints loaded through ComfyUI, text features, the fast schedule."""
    from comfy import ops as comfy_ops, samplers as comfy_samplers, sd as comfy_sd  # `comfy` is the harness
    from comfy.ldm.wan import model as wan
    from safetensors.torch import save_file

    torch.set_num_threads(1)
    folder = tmp_path_factory.mktemp("wan")
    gen = torch.Generator().manual_seed(0)
    paths = {}
    for name, channels in (("wan21", 16), ("wan22", 48)):
        paths[name] = folder / f"tiny_{name}.safetensors"
        save_file(wan_random_state(_tiny_wan(wan, comfy_ops, channels), gen), str(paths[name]))
    p21 = comfy_sd.load_diffusion_model(str(paths["wan21"]))
    p22 = comfy_sd.load_diffusion_model(str(paths["wan22"]))
    sigmas = comfy_samplers.calculate_sigmas(p21.get_model_object("model_sampling"), "simple", STEPS)
    out = {
        "wan": wan, "paths": paths, "p21": p21, "p22": p22, "sigmas": sigmas,
        "cond": torch.randn(1, TEXT_TOKENS, 4096, generator=gen),
        "uncond": 0.1 * torch.randn(1, TEXT_TOKENS, 4096, generator=gen),
        "wan_mod": comfy.pack_module("chai_attention.adapters.wan"),
        "hooks": comfy.pack_module("chai_attention.hooks"),
        "adapters": comfy.pack_module("chai_attention.adapters"),
        "config": comfy.pack_module("chai_attention.config"),
        "run": comfy.pack_module("chai_attention.run"),
        "donors": comfy.pack_module("chai_attention.donors"),
    }
    yield out
    out.clear()


def make_run(env: dict, donors: dict[int, torch.Tensor], **config: Any):
    """A CacheAttentionRun on the fast schedule with donor latents {0-based step: latent}."""
    cfg = env["config"].ChaiConfig(**{"cache_steps": (2, 3, 4), "fast_steps": STEPS, **config})
    d = env["donors"]
    return env["run"].CacheAttentionRun(cfg, env["sigmas"], d.DonorSet(
        [d.Donor(float(env["sigmas"][i]), z) for i, z in donors.items()]))


def patched(env: dict, patcher: Any) -> Any:
    """A clone of `patcher` with the Wan Cache Attention patch installed."""
    clone = patcher.clone()
    env["adapters"].get_adapter(clone).comfy_install(clone)
    return clone


def evaluate(patcher: Any, x: torch.Tensor, sigma: float, context: torch.Tensor, cond_or_uncond: list[int],
             run: Any = None, **kwargs: Any) -> torch.Tensor:
    """One model evaluation as the sampler makes it (denoised output), after ComfyUI loads the patcher."""
    import comfy.model_management

    comfy.model_management.load_models_gpu([patcher])
    s = torch.full((x.shape[0],), float(sigma))
    options = {**patcher.model_options["transformer_options"], "sigmas": s, "cond_or_uncond": list(cond_or_uncond),
               "wrappers": patcher.wrappers}  # merged as comfy.sampler_helpers does for a sampling run
    if run is not None:
        options["chai_run"] = run
    with torch.no_grad():
        return patcher.model.apply_model(x, s, c_crossattn=context, transformer_options=options, **kwargs)


def sample(env: dict, patcher: Any, run: Any = None, cfg: float = CFG, shape=SHAPE_21, seed: int = 1,
           steps: dict | None = None) -> torch.Tensor:
    """comfy.sample.sample (euler, simple schedule) with the run in transformer_options["chai_run"];
    `steps` collects {i: (x entering step i, denoised)} from the sampler callback."""
    import comfy.sample

    latent = torch.zeros(shape)
    noise = comfy.sample.prepare_noise(latent, seed)
    positive, negative = [[env["cond"], {}]], [[env["uncond"], {}]]
    options = patcher.model_options["transformer_options"]
    if run is not None:
        options["chai_run"] = run

    def callback(i: int, denoised: torch.Tensor, x: torch.Tensor, total: int) -> None:
        if steps is not None:
            steps[i] = (x.clone(), denoised.clone())

    try:
        return comfy.sample.sample(patcher, noise, STEPS, cfg, "euler", "simple", positive, negative, latent,
                                   callback=callback, disable_pbar=True, seed=seed)
    finally:
        options.pop("chai_run", None)


def both_halves(env: dict) -> torch.Tensor:
    """Text features of a batched [cond, uncond] evaluation."""
    return torch.cat([env["cond"], env["uncond"]])


def chai_state_on_shared_model(patcher: Any) -> list[str]:
    """Modules of the shared network whose forward is patched right now (CHAI installs no object patch at all)."""
    return [name for name, m in patcher.model.diffusion_model.named_modules() if "forward" in m.__dict__]


# ---------------------------------------------------------------------------------------------------------------


def test_registry_picks_wan_for_comfy_wan21_and_wan22_and_refuses_other_variants(env):
    adapters, wan_mod, wan = env["adapters"], env["wan_mod"], env["wan"]
    import comfy.ops

    for key, base in (("p21", "WAN21"), ("p22", "WAN22")):
        patcher = env[key]
        assert type(patcher.model).__name__ == base
        adapter = adapters.get_adapter(patcher)
        assert isinstance(adapter, wan_mod.WanAdapter)
        assert adapter.model is patcher.model.diffusion_model
        assert adapter.block_key == ("double_block", 0) and adapter.attention_index == 0  # blocks[0].self_attn
    assert any(f.startswith("wan (Wan 2.1 / 2.2") for f in adapters.supported_families())
    i2v = _tiny_wan(wan, comfy.ops, 16, layers=1, model_type="i2v", in_dim=36)  # accepted: image channels
    assert isinstance(adapters.get_adapter(i2v), wan_mod.WanAdapter)
    fun = _tiny_wan(wan, comfy.ops, 16, layers=1, in_dim=48)  # Fun-Control style: control-video channels
    with pytest.raises(adapters.UnsupportedModelError, match="not an image-to-video mask and image") as err:
        adapters.get_adapter(fun)
    assert "Supported: Wan 2.1 T2V" in str(err.value)
    vace = wan.VaceWanModel(dim=DIM, ffn_dim=128, num_heads=2, num_layers=1, vace_layers=1, vace_in_dim=96,
                            operations=comfy.ops.disable_weight_init)
    with pytest.raises(adapters.UnsupportedModelError, match="VaceWanModel is a Wan VACE model"):
        adapters.get_adapter(vace)


def test_install_patches_only_the_clone_through_public_hooks_and_does_not_stack(env):
    import comfy.patcher_extension

    p21, wan_mod, hooks = env["p21"], env["wan_mod"], env["hooks"]
    assert hooks.APPLY_MODEL == comfy.patcher_extension.WrappersMP.APPLY_MODEL
    assert hooks.DIFFUSION_MODEL == comfy.patcher_extension.WrappersMP.DIFFUSION_MODEL
    clone = patched(env, p21)
    assert "patches_replace" not in p21.model_options["transformer_options"]
    assert p21.object_patches == {} and clone.object_patches == {}
    assert hooks.WRAPPER_KEY not in p21.wrappers.get(hooks.APPLY_MODEL, {})
    dit = clone.model_options["transformer_options"]["patches_replace"]["dit"]
    assert set(dit) == {("double_block", 0)} and isinstance(dit[("double_block", 0)], hooks.BlockPatch)
    wan_mod.WanAdapter(clone).comfy_install(clone)  # installing again replaces, never stacks
    again = clone.model_options["transformer_options"]["patches_replace"]["dit"][("double_block", 0)]
    assert again.previous is None and len(clone.wrappers[hooks.APPLY_MODEL][hooks.WRAPPER_KEY]) == 1
    assert chai_state_on_shared_model(p21) == []


@pytest.mark.parametrize("mode", ["replace", "concat"])
def test_donor_equal_to_live_latent_leaves_the_output_unchanged(env, mode):
    p21, sigma = env["p21"], float(env["sigmas"][1])
    x = torch.randn(SHAPE_21, generator=torch.Generator().manual_seed(5))
    clone = patched(env, p21)
    # One cond row: the donor's tokens go through exactly the live path, bit for bit.
    plain = evaluate(p21, x, sigma, env["cond"], [0])
    run = make_run(env, {1: x}, kv_mode=mode)
    out = evaluate(clone, x, sigma, env["cond"], [0], run)
    assert [(f.step, f.kind, f.index, f.rows) for f in run.firings] == [(2, "self_attn", 0, 1)]
    if mode == "replace":
        assert torch.equal(out, plain)
    else:  # own plus an identical copy of every key: the same softmax average up to rounding
        torch.testing.assert_close(out, plain, atol=1e-5, rtol=1e-5)
    # Batched CFG, both halves on the donor: donor K/V are computed once at batch 1 (rounding only).
    xx = x.repeat(2, 1, 1, 1, 1)
    plain2 = evaluate(p21, xx, sigma, both_halves(env), [0, 1])
    run = make_run(env, {1: x}, kv_mode=mode, apply_to="both")
    out2 = evaluate(clone, xx, sigma, both_halves(env), [0, 1], run)
    torch.testing.assert_close(out2, plain2, atol=1e-5, rtol=1e-5)
    assert [f.rows for f in run.firings] == [2]


def test_cfg_halves_cond_only_by_default_both_on_request_batched_or_split(env):
    p21, sigma = env["p21"], float(env["sigmas"][2])
    gen = torch.Generator().manual_seed(6)
    x, donor = torch.randn(SHAPE_21, generator=gen), torch.randn(SHAPE_21, generator=gen)
    xx = x.repeat(2, 1, 1, 1, 1)
    clone = patched(env, p21)
    cond_rows = []
    for layout in ([0, 1], [1, 0]):
        ctx = both_halves(env) if layout == [0, 1] else both_halves(env).flip(0)
        plain = evaluate(p21, xx, sigma, ctx, layout)
        run = make_run(env, {2: donor})
        cond_only = evaluate(clone, xx, sigma, ctx, layout, run)
        c, u = layout.index(0), layout.index(1)
        assert torch.equal(cond_only[u], plain[u])  # the uncond half is bit-identical
        assert (cond_only[c] - plain[c]).abs().max() > 1e-3
        assert [(f.rows, f.total_rows) for f in run.firings] == [(1, 2)]
        both = evaluate(clone, xx, sigma, ctx, layout, make_run(env, {2: donor}, apply_to="both"))
        assert (both[u] - plain[u]).abs().max() > 1e-3
        torch.testing.assert_close(both[c], cond_only[c], atol=1e-5, rtol=1e-5)
        cond_rows.append(cond_only[c:c + 1])
    torch.testing.assert_close(cond_rows[0], cond_rows[1], atol=1e-5, rtol=1e-5)  # same row, either order
    # Split calls (one half per model call, as ComfyUI does when memory is short).
    run = make_run(env, {2: donor})
    cond_call = evaluate(clone, x, sigma, env["cond"], [0], run)
    uncond_call = evaluate(clone, x, sigma, env["uncond"], [1], run)
    assert torch.equal(uncond_call, evaluate(p21, x, sigma, env["uncond"], [1]))
    torch.testing.assert_close(cond_call, cond_rows[0], atol=1e-5, rtol=1e-5)
    assert [f.rows for f in run.firings] == [1] and run.evaluations == 2
    both_run = make_run(env, {2: donor}, apply_to="both")
    assert not torch.equal(evaluate(clone, x, sigma, env["uncond"], [1], both_run),
                           evaluate(p21, x, sigma, env["uncond"], [1]))
    assert [f.rows for f in both_run.firings] == [1]


def test_no_run_a_non_cache_step_or_an_off_schedule_sigma_leave_the_model_untouched(env):
    p21, sigmas = env["p21"], env["sigmas"]
    gen = torch.Generator().manual_seed(7)
    x, donor = torch.randn(SHAPE_21, generator=gen), torch.randn(SHAPE_21, generator=gen)
    clone = patched(env, p21)
    run = make_run(env, {1: donor, 2: donor, 3: donor})
    off = (float(sigmas[1]) * float(sigmas[2])) ** 0.5
    for sigma, r in ((float(sigmas[0]), run), (float(sigmas[4]), run), (off, run), (float(sigmas[1]), None)):
        assert torch.equal(evaluate(clone, x, sigma, env["cond"], [0], r), evaluate(p21, x, sigma, env["cond"], [0]))
    assert run.evaluations == 3 and run.firings == []


def test_patch_fires_only_in_block_0_and_exactly_at_the_configured_steps(env):
    p21, hooks = env["p21"], env["hooks"]
    blocks = p21.model.diffusion_model.blocks
    gen = torch.Generator().manual_seed(8)
    seen: list[tuple[int, str, bool]] = []

    def spy(index: int):
        def hook(module, args, kwargs):
            options = kwargs.get("transformer_options") or {}
            seen.append((index, type(options.get(hooks.PASS_KEY)).__name__,
                         isinstance(options.get("optimized_attention_override"), hooks.AttentionOverride)))
        return hook

    handles = [b.self_attn.register_forward_pre_hook(spy(i), with_kwargs=True) for i, b in enumerate(blocks)]
    try:
        for steps, cfg in (("2,3,4", CFG), ("3,5", 1.0)):
            seen.clear()
            donors = {i: torch.randn(SHAPE_21, generator=gen) for i in range(STEPS)}
            run = make_run(env, donors, cache_steps=steps)
            sample(env, patched(env, p21), run, cfg=cfg)
            want = tuple(int(s) for s in steps.split(","))
            assert run.fired_steps == want and run.evaluations == STEPS
            rows = 1 if cfg == 1.0 else 2  # cfg 1 skips the uncond half; otherwise both halves in one call
            assert [(f.step, f.kind, f.index, f.rows, f.total_rows) for f in run.firings] == [
                (s, "self_attn", 0, 1, rows) for s in want]
            # Per cache step a capture pass (block 0 only: it stops there) and a live pass; nothing elsewhere.
            assert len(seen) == STEPS * len(blocks) + len(want)
            overridden = [(i, kind) for i, kind, on in seen if on]
            assert overridden == [(0, "CapturePass"), (0, "LivePass")] * len(want)
    finally:
        for h in handles:
            h.remove()


def test_sampling_with_the_live_latents_as_donors_reproduces_the_plain_run(env):
    p21 = env["p21"]
    for cfg in (1.0, CFG):
        steps: dict = {}
        plain = sample(env, p21, cfg=cfg, steps=steps)
        run = make_run(env, {i: steps[i][0] for i in (1, 2, 3)}, apply_to="both")
        out = sample(env, patched(env, p21), run, cfg=cfg)
        assert run.fired_steps == (2, 3, 4)
        if cfg == 1.0:
            assert torch.equal(out, plain)
        else:
            torch.testing.assert_close(out, plain, atol=1e-4, rtol=1e-4)


def test_a_different_donor_changes_the_output_only_from_the_cache_step_on(env):
    p21 = env["p21"]
    plain_steps: dict = {}
    plain = sample(env, p21, steps=plain_steps)
    gen = torch.Generator().manual_seed(9)
    chai_steps: dict = {}
    run = make_run(env, {2: torch.randn(SHAPE_21, generator=gen)}, cache_steps="3")
    out = sample(env, patched(env, p21), run, steps=chai_steps)
    assert run.fired_steps == (3,)
    for i in (0, 1):  # steps 1 and 2: identical latents and predictions
        assert torch.equal(chai_steps[i][0], plain_steps[i][0]) and torch.equal(chai_steps[i][1], plain_steps[i][1])
    assert torch.equal(chai_steps[2][0], plain_steps[2][0])  # step 3 starts from the same latent...
    assert (chai_steps[2][1] - plain_steps[2][1]).abs().max() > 1e-3  # ...and predicts differently
    assert (out - plain).abs().max() > 1e-3


def test_the_original_model_is_bit_identical_after_chai_and_after_an_error_inside_the_patch(env):
    import comfy.sd

    p21 = env["p21"]
    never_saw_chai = comfy.sd.load_diffusion_model(str(env["paths"]["wan21"]))
    baseline = sample(env, never_saw_chai, seed=3)
    del never_saw_chai
    gen = torch.Generator().manual_seed(10)
    run = make_run(env, {i: torch.randn(SHAPE_21, generator=gen) for i in (1, 2, 3)})
    chai = sample(env, patched(env, p21), run, seed=3)
    assert run.fired_steps == (2, 3, 4) and (chai - baseline).abs().max() > 1e-3
    assert torch.equal(sample(env, p21, seed=3), baseline)
    assert chai_state_on_shared_model(p21) == []
    # A donor of another shape makes the patch raise inside block 0 at the first cache step.
    bad = make_run(env, {1: torch.randn(1, 16, 3, 8, 6, generator=gen)})
    with pytest.raises(ValueError, match="live latent's shape"):
        sample(env, patched(env, p21), bad, seed=3)
    assert bad.evaluations == 2 and bad.firings == []
    assert torch.equal(sample(env, p21, seed=3), baseline)
    assert chai_state_on_shared_model(p21) == []
    assert p21.object_patches_backup == {}


def test_check_run_refuses_donors_of_another_shape_or_channel_count(env):
    adapter = env["adapters"].get_adapter(env["p21"])
    run = make_run(env, {1: torch.zeros(1, 16, 3, 8, 8)})
    adapter.check_run(run, SHAPE_21)
    with pytest.raises(ValueError, match="same resolution and frame count"):
        adapter.check_run(run, (1, 16, 5, 8, 8))
    with pytest.raises(ValueError, match="not 16-channel Wan video latents"):
        adapter.check_run(make_run(env, {1: torch.zeros(1, 48, 3, 8, 8)}))


def test_final_clean_donor_is_modulated_through_the_models_own_time_embedding(env):
    p21, sigmas, hooks = env["p21"], env["sigmas"], env["hooks"]
    seen: list[tuple[str, torch.Tensor]] = []
    spy_clone = p21.clone()

    def spy(args, extra):  # installed first: CHAI's block patch chains to it
        seen.append((type(args["transformer_options"].get(hooks.PASS_KEY)).__name__, args["vec"]))
        return extra["original_block"](args)

    spy_clone.set_model_patch_replace(spy, "dit", "double_block", 0)
    x = torch.randn(SHAPE_21, generator=torch.Generator().manual_seed(11))
    evaluate(spy_clone, x, 0.0, env["cond"], [0])  # the model's own time embedding at sigma 0
    at_zero = seen[-1][1]
    donor = torch.randn(SHAPE_21, generator=torch.Generator().manual_seed(12))
    d = env["donors"]
    env["adapters"].get_adapter(spy_clone).comfy_install(spy_clone)
    fc = env["run"].CacheAttentionRun(env["config"].ChaiConfig(cache_steps=(2, 3, 4), fast_steps=STEPS,
                                                               donor_mapping="final_clean"),
                                      sigmas, d.DonorSet([d.Donor(0.0, donor)]))
    seen.clear()
    out_fc = evaluate(spy_clone, x, float(sigmas[2]), env["cond"], [0], fc)
    assert [kind for kind, _ in seen] == ["CapturePass", "LivePass"]
    assert torch.equal(seen[0][1], at_zero) and not torch.equal(seen[1][1], at_zero)
    own = make_run(env, {2: donor})
    out_own = evaluate(spy_clone, x, float(sigmas[2]), env["cond"], [0], own)
    assert [f.step for f in fc.firings] == [3] and (out_fc - out_own).abs().max() > 1e-4


def test_wan22_5b_text_to_video_and_per_frame_timesteps(env):
    p22, sigma = env["p22"], float(env["sigmas"][1])
    gen = torch.Generator().manual_seed(13)
    x, donor = torch.randn(SHAPE_22, generator=gen), torch.randn(SHAPE_22, generator=gen)
    vecs: list[tuple[int, ...]] = []
    clone = p22.clone()

    def spy(args, extra):  # installed first: CHAI's replace chains to it
        vecs.append((tuple(args["vec"].shape), env["hooks"].PASS_KEY in args["transformer_options"]))
        return extra["original_block"](args)

    clone.set_model_patch_replace(spy, "dit", "double_block", 0)
    env["adapters"].get_adapter(clone).comfy_install(clone)
    mask = torch.ones(1, 1, 3, 8, 8)
    mask[:, :, 0] = 0  # a kept first frame, as Wan22ImageToVideoLatent sets: one timestep per latent frame
    for extra, vec_shape in (({}, (1, 1, 6, DIM)), ({"denoise_mask": mask}, (1, 3, 6, DIM))):
        vecs.clear()
        plain = evaluate(p22, x, sigma, env["cond"], [0], **extra)
        same = evaluate(clone, x, sigma, env["cond"], [0], make_run(env, {1: x}), **extra)
        assert torch.equal(same, plain)
        other = evaluate(clone, x, sigma, env["cond"], [0], make_run(env, {1: donor}), **extra)
        assert (other - plain).abs().max() > 1e-3
        assert vecs == [(vec_shape, True)] * 4  # capture and live pass of each CHAI evaluation


def test_another_packs_attention_override_keeps_seeing_every_attention_call(env):
    """An optimized_attention_override already on the MODEL (as attention-kernel packs set) is chained: it gets
    every attention call of the live pass, block 0's self-attention with the donor's keys included."""
    p21, sigma = env["p21"], float(env["sigmas"][1])
    gen = torch.Generator().manual_seed(14)
    x, donor = torch.randn(SHAPE_21, generator=gen), torch.randn(SHAPE_21, generator=gen)
    seen: list[tuple[int, ...]] = []

    def theirs(func, *args, **kwargs):
        seen.append(tuple(args[1].shape))
        return func(*args, **kwargs)

    base = p21.clone()
    base.model_options["transformer_options"]["optimized_attention_override"] = theirs
    plain = evaluate(base, x, sigma, env["cond"], [0])
    calls = len(seen)  # 2 blocks x (self + cross)
    assert calls == 4
    seen.clear()
    run = make_run(env, {1: donor})
    out = evaluate(patched(env, base), x, sigma, env["cond"], [0], run)
    assert len(seen) == calls and run.fired_steps == (2,)  # the capture pass stops before attending
    assert (out - plain).abs().max() > 1e-3
