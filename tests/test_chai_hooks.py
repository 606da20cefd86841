"""Cache Attention through public hooks only (chai_attention.hooks) on a model double whose q/k/v projections,
RoPE, modulation and time embedding are private and refuse to run outside its own forward (tests/hook_doubles.py).

The claims: the live attention of block 0 receives exactly the K/V the model itself computed on the donor latent;
nothing else changes; other packs' block patch and attention override keep being called; installs neither stack
nor touch the unpatched model.
"""
from __future__ import annotations

import copy

import pytest
import torch

import hook_doubles as hd
from comfyui_chai.chai_attention import hooks
from comfyui_chai.chai_attention.config import ChaiConfig
from comfyui_chai.chai_attention.donors import Donor, DonorSet
from comfyui_chai.chai_attention.run import CacheAttentionRun

PAPER_STEPS = (2, 3, 4)  # the mechanism tests use the paper's cache steps (the default is 5,6)

SIGMAS = torch.linspace(1.0, 0.0, 9)  # 8 fast steps
TOKENS = 6


class Adapter(hooks.HookAdapter):
    """The double's hook points: block 0's first attention call (the defaults)."""


def make_run(donor: torch.Tensor, steps: tuple[int, ...] = (2, 3, 4), **config) -> CacheAttentionRun:
    donors = DonorSet([Donor(float(SIGMAS[s - 1]), donor) for s in steps])
    return CacheAttentionRun(ChaiConfig(fast_steps=8, cache_steps=steps, **config), SIGMAS, donors)


def installed(patcher: hd.PatcherDouble) -> hd.PatcherDouble:
    clone = patcher.clone()
    hooks.install(clone, Adapter())
    return clone


@pytest.fixture
def setup():
    gen = torch.Generator().manual_seed(3)
    patcher = hd.make_patcher()
    x = torch.randn(1, hd.CHANNELS, TOKENS, generator=gen)
    donor = torch.randn(1, hd.CHANNELS, TOKENS, generator=gen)
    cond = torch.randn(1, 4, hd.TEXT_DIM, generator=gen)
    uncond = torch.randn(1, 4, hd.TEXT_DIM, generator=gen)
    hd.ATTENDED.clear()
    return patcher, x, donor, cond, uncond


def test_the_double_refuses_to_run_its_pieces_outside_its_own_forward(setup):
    patcher, x, *_ = setup
    net = patcher.model.diffusion_model
    with pytest.raises(hd.ForeignComputation):
        net._block(0, torch.zeros(1, TOKENS, hd.DIM), torch.zeros(1, 4, hd.DIM), torch.zeros(1, hd.DIM),
                   torch.zeros(TOKENS, hd.DIM // 2), {})
    assert not [n for n in vars(net) if isinstance(getattr(net, n), (torch.nn.Module, torch.Tensor))]


def test_live_attention_receives_the_kv_the_model_computed_on_the_donor(setup):
    patcher, x, donor, cond, _ = setup
    net = patcher.model.diffusion_model
    sigma = float(SIGMAS[1])
    # What the model itself computes for the donor latent at this sigma (its own forward, nothing of ours).
    patcher.evaluate(donor, sigma, cond, [0])
    want_k, want_v = net.kv_log[-1]
    net.kv_log.clear(), net.forward_t.clear(), hd.ATTENDED.clear()
    run = make_run(donor)
    clone = installed(patcher)
    out = clone.evaluate(x, sigma, cond, [0], chai_run=run)
    # Capture pass: block 0 computed the donor's K/V and stopped (no attention ran); live pass: K/V of x.
    assert len(net.kv_log) == 2 and torch.equal(net.kv_log[0][0], want_k)
    live_k = net.kv_log[1][0]
    assert len(hd.ATTENDED) == 4  # one pass: block 0 self + cross, block 1 self + cross
    q, k, v = hd.ATTENDED[0]
    assert torch.equal(k, want_k) and torch.equal(v, want_v) and not torch.equal(k, live_k)
    assert [(f.step, f.kind, f.index, f.rows, f.total_rows) for f in run.firings] == [(2, "self_attn", 0, 1, 1)]
    assert (out - patcher.evaluate(x, sigma, cond, [0])).abs().max() > 1e-4
    assert net.forward_t == [pytest.approx(sigma * 1000)] * 3  # capture, live, and the plain evaluation


def test_donor_equal_to_the_live_latent_reproduces_the_plain_output_bit_for_bit(setup):
    patcher, x, _, cond, uncond = setup
    sigma = float(SIGMAS[2])
    plain = patcher.evaluate(x, sigma, cond, [0])
    assert torch.equal(installed(patcher).evaluate(x, sigma, cond, [0], chai_run=make_run(x)), plain)
    xx, both = x.repeat(2, 1, 1), torch.cat([cond, uncond])
    plain2 = patcher.evaluate(xx, sigma, both, [0, 1])
    run = make_run(x, apply_to="both")
    assert torch.equal(installed(patcher).evaluate(xx, sigma, both, [0, 1], chai_run=run), plain2)
    assert [f.rows for f in run.firings] == [2]


def test_cond_only_keeps_the_uncond_rows_bit_identical_in_either_order(setup):
    patcher, x, donor, cond, uncond = setup
    sigma = float(SIGMAS[3])
    xx = x.repeat(2, 1, 1)
    clone = installed(patcher)
    for layout, ctx in (([0, 1], torch.cat([cond, uncond])), ([1, 0], torch.cat([uncond, cond]))):
        plain = patcher.evaluate(xx, sigma, ctx, layout)
        run = make_run(donor)
        out = clone.evaluate(xx, sigma, ctx, layout, chai_run=run)
        c, u = layout.index(0), layout.index(1)
        assert torch.equal(out[u], plain[u]) and (out[c] - plain[c]).abs().max() > 1e-4
        assert [(f.rows, f.total_rows) for f in run.firings] == [(1, 2)]


def test_concat_attends_to_own_and_donor_tokens(setup):
    patcher, x, donor, cond, _ = setup
    net = patcher.model.diffusion_model
    run = make_run(donor, kv_mode="concat")
    installed(patcher).evaluate(x, float(SIGMAS[1]), cond, [0], chai_run=run)
    donor_k, live_k = net.kv_log[0][0], net.kv_log[1][0]
    _, k, _ = hd.ATTENDED[0]
    assert k.shape[1] == 2 * TOKENS and torch.equal(k, torch.cat([live_k, donor_k], dim=1))


def test_no_run_a_non_cache_step_or_the_uncond_call_alone_run_the_model_once_untouched(setup):
    patcher, x, donor, cond, uncond = setup
    net = patcher.model.diffusion_model
    clone = installed(patcher)
    run = make_run(donor)
    cases = ((float(SIGMAS[0]), cond, [0], run), (float(SIGMAS[5]), cond, [0], run),
             (float(SIGMAS[1]), uncond, [1], run), (float(SIGMAS[1]), cond, [0], None))
    for sigma, ctx, layout, r in cases:
        net.forward_t.clear()
        extra = {"chai_run": r} if r is not None else {}
        assert torch.equal(clone.evaluate(x, sigma, ctx, layout, **extra), patcher.evaluate(x, sigma, ctx, layout))
        assert len(net.forward_t) == 2  # ours and the reference: no capture pass
    assert run.firings == [] and run.evaluations == 3


def test_existing_block_patch_and_attention_override_are_chained_not_replaced(setup):
    patcher, x, donor, cond, _ = setup
    net = patcher.model.diffusion_model
    sigma = float(SIGMAS[1])
    seen_blocks, seen_attention = [], []

    def their_block(args, extra):
        seen_blocks.append(args["transformer_options"].get("their_flag"))
        return extra["original_block"]({**args, "img": args["img"] * 1.5})

    def their_override(func, *args, **kwargs):
        seen_attention.append(args[1].shape[1])
        return func(*args, **kwargs)

    theirs = patcher.clone()
    theirs.set_model_patch_replace(their_block, "dit", "double_block", 0)
    theirs.model_options["transformer_options"].update(their_flag="on", optimized_attention_override=their_override)
    patcher.evaluate(donor, sigma, cond, [0], **theirs.model_options["transformer_options"])
    want_k = net.kv_log[-1][0]  # the donor's K/V with *their* block patch in the path
    plain_theirs = theirs.evaluate(x, sigma, cond, [0])
    seen_blocks.clear(), seen_attention.clear(), hd.ATTENDED.clear()
    ours = installed(theirs)
    hooks.install(ours, Adapter())  # twice: our patch is replaced, theirs stays underneath exactly once
    run = make_run(donor)
    out = ours.evaluate(x, sigma, cond, [0], chai_run=run)
    # Their block patch ran in the capture and the live pass; their override saw all 4 live attention calls.
    assert seen_blocks == ["on", "on"] and len(seen_attention) == 4
    assert torch.equal(hd.ATTENDED[0][1], want_k) and run.fired_steps == (2,)
    assert (out - plain_theirs).abs().max() > 1e-4
    # Outside cache steps both run exactly as without CHAI.
    seen_blocks.clear()
    assert torch.equal(ours.evaluate(x, float(SIGMAS[6]), cond, [0], chai_run=run),
                       theirs.evaluate(x, float(SIGMAS[6]), cond, [0]))
    assert seen_blocks == ["on", "on"]


def test_capture_pass_skips_other_diffusion_model_wrappers_but_the_live_pass_keeps_them(setup):
    patcher, x, donor, cond, _ = setup
    calls = []

    def step_cache(executor, *args, **kwargs):
        calls.append(float(args[1].reshape(-1)[0]))
        return executor(*args, **kwargs)

    clone = installed(patcher)
    clone.add_wrapper_with_key("diffusion_model", "step_cache", step_cache)
    clone.evaluate(x, float(SIGMAS[1]), cond, [0], chai_run=make_run(donor))
    assert len(calls) == 1


def test_install_touches_only_the_clone_survives_clone_and_never_stacks(setup):
    patcher, x, donor, cond, _ = setup

    def theirs(args, extra):
        return extra["original_block"](args)

    base = patcher.clone()
    base.set_model_patch_replace(theirs, "dit", "double_block", 0)
    clone = base.clone()
    assert hooks.install(clone, Adapter()) is None
    assert base.model_options["transformer_options"]["patches_replace"]["dit"][("double_block", 0)] is theirs
    assert base.wrappers == {}
    patch = clone.model_options["transformer_options"]["patches_replace"]["dit"][("double_block", 0)]
    assert isinstance(patch, hooks.BlockPatch) and patch.previous is theirs
    again = clone.clone()  # ModelPatcher.clone deep-copies model_options: our objects are shared, not copied
    assert again.model_options["transformer_options"]["patches_replace"]["dit"][("double_block", 0)] is patch
    assert copy.deepcopy(patch) is patch
    run = make_run(donor)
    again.evaluate(x, float(SIGMAS[1]), cond, [0], chai_run=run)
    assert run.fired_steps == (2,)
    hooks.install(clone, Adapter())  # twice: ours replaced, theirs still underneath once, one wrapper
    patch = clone.model_options["transformer_options"]["patches_replace"]["dit"][("double_block", 0)]
    assert isinstance(patch, hooks.BlockPatch) and patch.previous is theirs
    assert [len(w) for w in clone.wrappers["apply_model"].values()] == [1]


def test_with_block_patch_fills_a_plain_options_dict_without_changing_it(setup):
    def theirs(args, extra):
        return extra["original_block"](args)

    options = {"patches_replace": {"dit": {("double_block", 0): theirs, ("double_block", 1): theirs}}, "k": 1}
    patched = hooks.with_block_patch(options, Adapter())
    assert options["patches_replace"]["dit"][("double_block", 0)] is theirs  # the input is not changed
    ours = patched["patches_replace"]["dit"][("double_block", 0)]
    assert isinstance(ours, hooks.BlockPatch) and ours.previous is theirs
    assert patched["patches_replace"]["dit"][("double_block", 1)] is theirs and patched["k"] == 1
    twice = hooks.with_block_patch(patched, Adapter())["patches_replace"]["dit"][("double_block", 0)]
    assert twice.previous is theirs  # never stacked on itself
    assert hooks.with_block_patch({}, Adapter())["patches_replace"]["dit"][("double_block", 0)].previous is None


def test_a_donor_of_another_shape_is_refused_before_the_model_runs(setup):
    patcher, x, _, cond, _ = setup
    net = patcher.model.diffusion_model
    run = make_run(torch.randn(1, hd.CHANNELS, TOKENS + 2))
    net.forward_t.clear()
    with pytest.raises(ValueError, match="live latent's shape"):
        installed(patcher).evaluate(x, float(SIGMAS[1]), cond, [0], chai_run=run)
    assert net.forward_t == [] and run.firings == []


class RefusingAdapter(Adapter):
    """Refuses model calls that carry a reference latent (as HunyuanVideo's adapter does)."""

    def check_call(self, extra):
        if extra.get("ref_latent") is not None:
            raise ValueError("image-to-video call refused")


def test_a_call_the_adapter_refuses_fails_before_the_model_runs_and_only_under_a_chai_run(setup):
    patcher, x, donor, cond, _ = setup
    seen = []

    def executor(*args, **kwargs):
        seen.append(sorted(kwargs))
        return args[0]

    wrapper = hooks.CacheAttentionWrapper(RefusingAdapter())
    t = torch.full((1,), float(SIGMAS[0]))  # not even a cache step: the first evaluation of the run refuses
    run = make_run(donor)
    with pytest.raises(ValueError, match="image-to-video"):
        wrapper(executor, x, t, None, cond, None, {"chai_run": run, "cond_or_uncond": [0]}, ref_latent=x)
    assert seen == [] and run.firings == []
    wrapper(executor, x, t, None, cond, None, {"chai_run": run, "cond_or_uncond": [0]}, ref_latent=None)
    wrapper(executor, x, t, None, cond, None, {"cond_or_uncond": [0]}, ref_latent=x)  # no CHAI run: not ours
    assert seen == [["ref_latent"], ["ref_latent"]]


def test_final_clean_donors_are_modulated_at_the_donors_own_sigma(setup):
    patcher, x, donor, cond, _ = setup
    net = patcher.model.diffusion_model
    run = CacheAttentionRun(ChaiConfig(cache_steps=PAPER_STEPS, fast_steps=8, donor_mapping="final_clean"), SIGMAS,
                            DonorSet([Donor(0.0, donor)]))
    net.forward_t.clear()
    installed(patcher).evaluate(x, float(SIGMAS[1]), cond, [0], chai_run=run)
    assert net.forward_t == [0.0, pytest.approx(float(SIGMAS[1]) * 1000)]


def test_rope_positions_are_the_models_own_with_the_options_rope_nodes_set(setup):
    patcher, x, donor, cond, _ = setup
    net = patcher.model.diffusion_model
    sigma = float(SIGMAS[1])
    scaled = {"rope_options": {"scale": 0.5}}
    patcher.evaluate(donor, sigma, cond, [0], **scaled)
    want_k = net.kv_log[-1][0]
    hd.ATTENDED.clear()
    run = make_run(donor)
    installed(patcher).evaluate(x, sigma, cond, [0], chai_run=run, **scaled)
    assert torch.equal(hd.ATTENDED[0][1], want_k) and run.fired_steps == (2,)
    # The positional check itself: other positions in the donor pass are refused.
    pe = torch.zeros(TOKENS, 2)
    donor_kv = hooks.DonorKV(want_k, want_k, None, 1, {"pe": pe})
    with pytest.raises(ValueError, match="other positions"):
        Adapter().check_donor(donor_kv, {"pe": pe + 1})
    Adapter().check_donor(donor_kv, {"pe": pe.clone()})


def test_attention_call_binds_positional_and_keyword_qkv():
    def attn(query, key, value, heads, mask=None, skip_reshape=False, **kwargs):
        return query

    q, k, v = (torch.full((2, 3, 4), float(i)) for i in range(3))
    call = hooks.AttentionCall.bind(attn, (q, k), {"value": v, "heads": 2, "skip_reshape": True, "extra": 1})
    assert call.k is k and call.v is v and call.token_dim == 2 and call.mask is None
    changed = call.replace(k=v, mask=torch.ones(1))
    args, kwargs = changed.args_kwargs()
    assert args[1] is v and kwargs["extra"] == 1 and changed.mask is not None and call.k is k
    rows = call.rows(torch.tensor([False, True]))
    assert rows.q.shape[0] == 1


def test_the_guiders_prompt_is_the_cond_chunk_whatever_its_index(setup):
    """DualCFGGuider batches [negative, middle, positive] as chunks 0, 1, 2: 'cond' must mean the positive one."""
    patcher, x, donor, cond, uncond = setup
    run = make_run(donor)

    class Guider:
        model_options = {"transformer_options": {"chai_run": run}}
        conds = {"negative": [{"uuid": "n"}], "middle": [{"uuid": "m"}], "positive": [{"uuid": "p"}]}

    class Executor:
        class_obj = Guider()

        def __call__(self, *args, **kwargs):
            return "sampled"

    assert hooks.GuiderPrompts()(Executor()) == "sampled" and run.prompt_ids == {"p"}
    xxx, ctx = x.repeat(3, 1, 1), torch.cat([uncond, cond * 0.5, cond])
    plain = patcher.evaluate(xxx, float(SIGMAS[1]), ctx, [0, 1, 2])
    out = installed(patcher).evaluate(xxx, float(SIGMAS[1]), ctx, [0, 1, 2], chai_run=run, uuids=["n", "m", "p"])
    assert torch.equal(out[:2], plain[:2]) and (out[2] - plain[2]).abs().max() > 1e-4
    assert [(f.rows, f.total_rows) for f in run.firings] == [(1, 3)]
    # Without ids (or before a guider told the run) index 0 is the cond chunk, ComfyUI's CFGGuider convention.
    assert make_run(donor).chunk_flags([0, 1]) == [True, False]
    assert run.chunk_flags([0, 1], ["x", "p"]) == [False, True]
