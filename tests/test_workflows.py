"""The shipped workflows: UI files agree with their API twins, links are well typed, the graphs are the intended ones.

Also the UI -> API converter itself (tests/workflow_api.py) on small synthetic graphs.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from workflow_api import (FRONTEND_ONLY, SUBGRAPH_INPUT, SUBGRAPH_OUTPUT, WIDGET_TYPES, WorkflowError, ui_to_api,
                          widget_layout)
from comfyui_chai.toyworld.model import DEFAULT_CFG

REPO = Path(__file__).resolve().parents[1]
SPEC_DOC = json.loads((REPO / "tests" / "workflows" / "node_specs.json").read_text())["nodes"]
TEMPLATE_FILES = json.loads((REPO / "tests" / "workflows" / "template_files.json").read_text())
SPECS = {kind: spec["widgets"] for kind, spec in SPEC_DOC.items()}
NAMES = ["chai_opensora_t2v", "chai_wan21_t2v", "chai_opensora_warmup", "chai_toy_t2v", "chai_wan22_a14b_t2v",
         "chai_wan22_5b_i2v", "chai_hunyuan_video_t2v", "chai_ltxv_t2v", "chai_toy_one_node",
         "chai_wan22_a14b_4step"]
CHAI_IDS = {"CHAI_CacheOpen", "CHAI_EntityExtract", "CHAI_CacheLookup", "CHAI_Sampler", "CHAI_CacheWrite",
            "CHAI_CacheStats", "CHAI_PromptList", "CHAI_OpenSoraModelLoader", "CHAI_OpenSoraTextEncode",
            "CHAI_OpenSoraEmptyLatent", "CHAI_OpenSoraScheduler", "CHAI_OpenSoraModelSampling",
            "CHAI_OpenSoraVAELoader", "CHAI_OpenSoraVAEDecode", "CHAI_OpenSoraVAEEncode",
            "CHAI_ToyTextEncode", "CHAI_ToyEmptyLatent", "CHAI_ToyDecode", "CHAI_Apply", "CHAI_ApplyTrace"}


def load(name: str) -> tuple[dict, dict]:
    ui = json.loads((REPO / "workflows" / f"{TEMPLATE_FILES[name]}.json").read_text())
    api = json.loads((REPO / "tests" / "workflows" / f"{name}_api.json").read_text())
    return ui, api


def by_type(api: dict, kind: str) -> list[tuple[str, dict]]:
    return [(k, v) for k, v in api.items() if v["class_type"] == kind]


def only(api: dict, kind: str) -> tuple[str, dict]:
    found = by_type(api, kind)
    assert len(found) == 1, f"expected one {kind}, found {len(found)}"
    return found[0]


@pytest.mark.parametrize("name", NAMES)
def test_ui_workflow_converts_to_its_api_twin(name):
    ui, api = load(name)
    assert ui["version"] == 0.4 and ui["nodes"] and ui["links"]
    assert ui["last_node_id"] == max(n["id"] for n in ui["nodes"])
    assert ui["last_link_id"] == max(link[0] for link in ui["links"])
    assert ui_to_api(ui, SPECS) == api


def graphs(ui: dict) -> list[tuple[str, dict, dict]]:
    """(API id prefix, graph, subgraph definitions by id) for the root graph and every subgraph instance in it."""
    subs = {s["id"]: s for s in ui.get("definitions", {}).get("subgraphs", [])}
    out = [("", ui, subs)]
    for node in ui["nodes"]:
        if node["type"] in subs:
            out.append((f"{node['id']}:", subs[node["type"]], subs))
    return out


def link_tuples(graph: dict) -> list[tuple]:
    return [tuple(link) if isinstance(link, list) else
            (link["id"], link["origin_id"], link["origin_slot"], link["target_id"], link["target_slot"], link["type"])
            for link in graph["links"]]


@pytest.mark.parametrize("name", NAMES)
def test_links_are_well_typed_and_every_required_socket_is_connected(name):
    ui, api = load(name)
    for prefix, graph, subs in graphs(ui):
        nodes = {n["id"]: n for n in graph["nodes"]}
        for link_id, src, slot, dst, dst_slot, kind in link_tuples(graph):
            if src == SUBGRAPH_INPUT:
                boundary = graph["inputs"][slot]
                assert boundary["type"] == kind and link_id in boundary["linkIds"]
            else:
                output = nodes[src]["outputs"][slot]
                assert output["type"] == kind and link_id in output["links"], (name, src, slot)
            if dst == SUBGRAPH_OUTPUT:
                boundary = graph["outputs"][dst_slot]
                assert boundary["type"] == kind and boundary["linkIds"] == [link_id]
                continue
            target = nodes[dst]
            entry = target["inputs"][dst_slot]
            assert entry["link"] == link_id
            if target["type"] in subs:
                declared = {i["name"]: i["type"] for i in subs[target["type"]]["inputs"]}
            else:
                declared = dict((n, t) for n, t in SPEC_DOC[target["type"]]["inputs"])
            assert declared[entry["name"]] == kind, (name, target["type"], entry["name"], kind)
        for node in graph["nodes"]:
            if node["type"] in FRONTEND_ONLY or node["type"] in subs:
                continue
            assert node["type"] in SPEC_DOC, node["type"]
            if node["type"].startswith("CHAI_"):
                assert node["type"] in CHAI_IDS, node["type"]  # only released ids
            spec = SPEC_DOC[node["type"]]
            optional_sockets = {"hit", "clip", "audio", "model_2", "positive", "start_image"}
            if node["type"] == "CHAI_Apply":
                optional_sockets |= {"cache", "entities"}  # CHAI Apply stores the run itself when given them
            for input_name, kind in spec["inputs"]:
                if kind in WIDGET_TYPES or input_name in optional_sockets:
                    continue
                assert input_name in api[f"{prefix}{node['id']}"]["inputs"], (name, node["type"], input_name)


def test_opensora_workflow_shares_one_prompt_and_decodes_to_a_saved_video():
    _, api = load("chai_opensora_t2v")
    prompt_id, _ = only(api, "PrimitiveStringMultiline")
    _, text = only(api, "CHAI_OpenSoraTextEncode")
    ents_id, ents = only(api, "CHAI_EntityExtract")
    assert text["inputs"]["prompt"] == [prompt_id, 0] and ents["inputs"]["prompt"] == [prompt_id, 0]
    lookup_id, lookup = only(api, "CHAI_CacheLookup")
    sampler_id, sampler = only(api, "CHAI_Sampler")
    assert sampler["inputs"]["hit"] == [lookup_id, 0]
    inputs = sampler["inputs"]
    assert inputs["model"] == lookup["inputs"]["model"] and inputs["latent"] == lookup["inputs"]["latent"]
    assert inputs["scheduler"] == "opensora" and inputs["sampler_name"] == "euler"
    assert (inputs["full_steps"], inputs["fast_steps"], inputs["cache_steps"]) == (30, 8, "5,6")
    _, write = only(api, "CHAI_CacheWrite")
    assert write["inputs"]["trace"] == [sampler_id, 1] and write["inputs"]["entities"] == [ents_id, 0]
    assert write["inputs"]["cache"] == lookup["inputs"]["cache"]
    decode_id, decode = only(api, "CHAI_OpenSoraVAEDecode")
    assert decode["inputs"]["samples"] == [sampler_id, 0]
    video_id, video = only(api, "CreateVideo")
    assert video["inputs"]["images"] == [decode_id, 0] and video["inputs"]["fps"] == [decode_id, 1]
    _, save = only(api, "SaveVideo")
    assert save["inputs"]["video"] == [video_id, 0]
    _, clip = only(api, "CLIPLoader")
    assert clip["inputs"]["type"] == "pixart"


def test_wan_workflow_uses_comfyui_native_loaders():
    _, api = load("chai_wan21_t2v")
    for kind in ("UNETLoader", "CLIPLoader", "VAELoader", "VAEDecode", "CreateVideo", "SaveVideo",
                 "EmptyHunyuanLatentVideo", "ModelSamplingSD3"):
        only(api, kind)
    _, clip = only(api, "CLIPLoader")
    assert clip["inputs"]["type"] == "wan"
    _, unet = only(api, "UNETLoader")
    assert "1.3B" in unet["inputs"]["unet_name"]
    sampler_id, sampler = only(api, "CHAI_Sampler")
    assert sampler["inputs"]["scheduler"] == "simple" and sampler["inputs"]["sampler_name"] == "uni_pc"
    prompt_id, _ = only(api, "PrimitiveStringMultiline")
    encoders = dict(by_type(api, "CLIPTextEncode"))
    assert sum(e["inputs"]["text"] == [prompt_id, 0] for e in encoders.values()) == 1
    assert only(api, "CHAI_EntityExtract")[1]["inputs"]["prompt"] == [prompt_id, 0]
    assert only(api, "VAEDecode")[1]["inputs"]["samples"] == [sampler_id, 0]


def test_hunyuan_video_workflow_uses_comfyui_native_nodes_as_its_own_template_does():
    _, api = load("chai_hunyuan_video_t2v")
    for kind in ("UNETLoader", "DualCLIPLoader", "VAELoader", "VAEDecodeTiled", "CreateVideo", "SaveVideo",
                 "EmptyHunyuanLatentVideo", "ModelSamplingSD3", "FluxGuidance", "ConditioningZeroOut"):
        only(api, kind)
    _, clip = only(api, "DualCLIPLoader")
    assert clip["inputs"]["type"] == "hunyuan_video"
    shift_id, shift = only(api, "ModelSamplingSD3")
    assert shift["inputs"]["shift"] == 7.0 and shift["inputs"]["model"] == [only(api, "UNETLoader")[0], 0]
    sampler_id, sampler = only(api, "CHAI_Sampler")
    inputs = sampler["inputs"]
    # Guidance-distilled: the guidance travels in the conditioning (FluxGuidance), cfg 1 skips the negative.
    guidance_id, guidance = only(api, "FluxGuidance")
    assert inputs["cfg"] == 1.0 and inputs["positive"] == [guidance_id, 0] and guidance["inputs"]["guidance"] == 6.0
    assert inputs["model"] == [shift_id, 0] == only(api, "CHAI_CacheLookup")[1]["inputs"]["model"]
    assert (inputs["full_steps"], inputs["fast_steps"], inputs["cache_steps"]) == (30, 8, "5,6")
    prompt_id, _ = only(api, "PrimitiveStringMultiline")
    assert only(api, "CLIPTextEncode")[1]["inputs"]["text"] == [prompt_id, 0]
    assert only(api, "CHAI_EntityExtract")[1]["inputs"]["prompt"] == [prompt_id, 0]
    assert only(api, "VAEDecodeTiled")[1]["inputs"]["samples"] == [sampler_id, 0]


def test_ltxv_workflow_uses_comfyui_native_nodes_as_its_own_template_does():
    _, api = load("chai_ltxv_t2v")
    for kind in ("CheckpointLoaderSimple", "CLIPLoader", "LTXVConditioning", "EmptyLTXVLatentVideo",
                 "ModelSamplingLTXV", "VAEDecode", "CreateVideo", "SaveVideo"):
        only(api, kind)
    _, clip = only(api, "CLIPLoader")
    assert clip["inputs"]["type"] == "ltxv"
    ckpt_id, _ = only(api, "CheckpointLoaderSimple")
    latent_id, _ = only(api, "EmptyLTXVLatentVideo")
    shift_id, shift = only(api, "ModelSamplingLTXV")
    assert shift["inputs"]["model"] == [ckpt_id, 0] and shift["inputs"]["latent"] == [latent_id, 0]
    cond_id, _ = only(api, "LTXVConditioning")
    sampler_id, sampler = only(api, "CHAI_Sampler")
    inputs = sampler["inputs"]
    assert inputs["positive"] == [cond_id, 0] and inputs["negative"] == [cond_id, 1]
    assert inputs["model"] == [shift_id, 0] == only(api, "CHAI_CacheLookup")[1]["inputs"]["model"]
    assert inputs["latent"] == [latent_id, 0] and inputs["scheduler"] == "simple"
    prompt_id, _ = only(api, "PrimitiveStringMultiline")
    encoders = dict(by_type(api, "CLIPTextEncode"))
    assert sum(e["inputs"]["text"] == [prompt_id, 0] for e in encoders.values()) == 1
    assert only(api, "CHAI_EntityExtract")[1]["inputs"]["prompt"] == [prompt_id, 0]
    _, decode = only(api, "VAEDecode")
    assert decode["inputs"] == {"samples": [sampler_id, 0], "vae": [ckpt_id, 2]}


def test_warmup_workflow_runs_every_prompt_through_the_miss_path():
    _, api = load("chai_opensora_warmup")
    list_id, prompts = only(api, "CHAI_PromptList")
    lines = [line for line in prompts["inputs"]["prompts"].splitlines() if line and not line.startswith("#")]
    assert len(lines) >= 5
    assert only(api, "CHAI_OpenSoraTextEncode")[1]["inputs"]["prompt"] == [list_id, 0]
    assert only(api, "CHAI_EntityExtract")[1]["inputs"]["prompt"] == [list_id, 0]
    _, sampler = only(api, "CHAI_Sampler")
    assert "hit" not in sampler["inputs"] and not by_type(api, "CHAI_CacheLookup")
    only(api, "CHAI_CacheWrite")


def test_toy_workflow_runs_chai_on_the_shipped_model_and_saves_a_video():
    ui, api = load("chai_toy_t2v")
    assert any(n["type"] == "MarkdownNote" and "toyworld_stdit3" in n["widgets_values"][0] for n in ui["nodes"])
    _, loader = only(api, "CHAI_OpenSoraModelLoader")
    assert (REPO / "toyworld" / "weights" / loader["inputs"]["model_name"]).is_file()
    prompt_id, prompt = only(api, "PrimitiveStringMultiline")
    assert "beach" in prompt["inputs"]["value"]
    text_id, text = only(api, "CHAI_ToyTextEncode")
    ents_id, ents = only(api, "CHAI_EntityExtract")
    # entities come from what the toy encoder read of the prompt (its first 20 words: its "kept prompt")
    assert text["inputs"]["prompt"] == [prompt_id, 0] and ents["inputs"]["prompt"] == [text_id, 2]
    cache_id, cache = only(api, "CHAI_CacheOpen")
    assert cache["inputs"]["name"] == "toyworld" and cache["inputs"]["embedder"] == "minilm"
    lookup_id, lookup = only(api, "CHAI_CacheLookup")
    sampler_id, sampler = only(api, "CHAI_Sampler")
    inputs = sampler["inputs"]
    assert inputs["hit"] == [lookup_id, 0] and inputs["latent"] == lookup["inputs"]["latent"]
    assert inputs["model"] == lookup["inputs"]["model"] == text["inputs"]["model"]
    assert inputs["positive"] == [text_id, 0] and inputs["negative"] == [text_id, 1]
    assert inputs["cfg"] == DEFAULT_CFG and inputs["sampler_name"] == "euler" and inputs["scheduler"] == "opensora"
    assert (inputs["full_steps"], inputs["fast_steps"], inputs["cache_steps"]) == (30, 8, "5,6")
    assert only(api, "CHAI_ToyEmptyLatent")[0] == inputs["latent"][0]
    _, write = only(api, "CHAI_CacheWrite")
    assert write["inputs"] == {"cache": [cache_id, 0], "entities": [ents_id, 0], "trace": [sampler_id, 1]}
    decode_id, decode = only(api, "CHAI_ToyDecode")
    assert decode["inputs"] == {"samples": [sampler_id, 0], "upscale": 8}
    video_id, video = only(api, "CreateVideo")
    assert video["inputs"]["images"] == [decode_id, 0] and video["inputs"]["fps"] == [decode_id, 1]
    assert only(api, "SaveVideo")[1]["inputs"]["video"] == [video_id, 0]


def test_wan22_a14b_workflow_is_the_two_sampler_graph_with_chai_apply_on_the_high_noise_expert():
    _, api = load("chai_wan22_a14b_t2v")
    apply_id, apply = only(api, "CHAI_Apply")
    lookup_id, lookup = only(api, "CHAI_CacheLookup")
    high, low = apply["inputs"]["model"], apply["inputs"]["model_2"]
    assert high != low and lookup["inputs"]["model"] == high and lookup["inputs"]["model_2"] == low
    assert apply["inputs"]["hit"] == [lookup_id, 0] and apply["inputs"]["boundary"] == 0.875
    # CHAI Apply patches the high-noise expert only: at 8 steps of Wan's shift-8 schedule sigma falls below 0.875
    # after step 5, so this graph keeps the paper's 2,3,4 where the pack's default 5,6 would reach the second expert
    assert apply["inputs"]["cache_steps"] == "2,3,4" and apply["inputs"]["fast_steps"] == 8
    first, second = sorted(by_type(api, "KSamplerAdvanced"), key=lambda kv: kv[1]["inputs"]["add_noise"] != "enable")
    assert first[1]["inputs"]["model"] == [apply_id, 0] and second[1]["inputs"]["model"] == low
    for _, ks in (first, second):
        assert ks["inputs"]["steps"] == [apply_id, 2]
    assert first[1]["inputs"]["end_at_step"] == [apply_id, 3] and second[1]["inputs"]["start_at_step"] == [apply_id, 3]
    assert second[1]["inputs"]["latent_image"] == [first[0], 0]
    assert first[1]["inputs"]["return_with_leftover_noise"] == "enable"
    assert second[1]["inputs"]["add_noise"] == "disable"
    trace_id, trace = only(api, "CHAI_ApplyTrace")
    assert trace["inputs"] == {"chai": [apply_id, 4], "samples": [second[0], 0]}
    assert only(api, "CHAI_CacheWrite")[1]["inputs"]["trace"] == [trace_id, 0]


def test_wan22_4step_workflow_is_comfys_lora_template_on_chai_sampler_with_both_experts():
    _, api = load("chai_wan22_a14b_4step")
    sampler_id, sampler = only(api, "CHAI_Sampler")
    inputs = sampler["inputs"]
    # the distilled path: 4 full steps at cfg 1, no cache steps; a re-rolled prompt restarts after the first step
    assert (inputs["full_steps"], inputs["cache_steps"], inputs["cfg"], inputs["reuse"]) == (4, "", 1.0, "restart")
    assert inputs["restart_sigma"] == 0.9  # nearest of shift 5's 4-step sigmas: 0.9375, after the first step
    loras = by_type(api, "LoraLoaderModelOnly")
    assert sorted(n["inputs"]["lora_name"] for _, n in loras) == [
        "wan2.2_t2v_lightx2v_4steps_lora_v1.1_high_noise.safetensors",
        "wan2.2_t2v_lightx2v_4steps_lora_v1.1_low_noise.safetensors"]
    assert all(n["inputs"]["strength_model"] == 1.0 for _, n in loras)
    lora_ids = {i for i, _ in loras}
    shifts = by_type(api, "ModelSamplingSD3")
    assert {n["inputs"]["model"][0] for _, n in shifts} == lora_ids and {n["inputs"]["shift"] for _, n in shifts} == {5.0}
    assert inputs["model_2"] != inputs["model"] and {inputs["model"][0], inputs["model_2"][0]} == {i for i, _ in shifts}
    _, lookup = only(api, "CHAI_CacheLookup")
    assert (lookup["inputs"]["model"], lookup["inputs"]["model_2"]) == (inputs["model"], inputs["model_2"])
    assert not by_type(api, "KSamplerAdvanced") and only(api, "VAEDecode")[1]["inputs"]["samples"] == [sampler_id, 0]
    assert only(api, "CHAI_CacheWrite")[1]["inputs"]["trace"] == [sampler_id, 1]


def test_wan22_5b_image_workflow_feeds_sampler_custom_advanced_and_ties_donors_to_the_image():
    _, api = load("chai_wan22_5b_i2v")
    apply_id, apply = only(api, "CHAI_Apply")
    latent_id, latent = only(api, "Wan22ImageToVideoLatent")
    image_id, _ = only(api, "LoadImage")
    assert latent["inputs"]["start_image"] == [image_id, 0] and apply["inputs"]["latent"] == [latent_id, 0]
    _, lookup = only(api, "CHAI_CacheLookup")
    assert lookup["inputs"]["positive"] == apply["inputs"]["positive"] and "model_2" not in apply["inputs"]
    guider_id, guider = only(api, "CFGGuider")
    assert guider["inputs"]["model"] == [apply_id, 0] and guider["inputs"]["positive"] == apply["inputs"]["positive"]
    custom_id, custom = only(api, "SamplerCustomAdvanced")
    assert custom["inputs"]["sigmas"] == [apply_id, 1] and custom["inputs"]["guider"] == [guider_id, 0]
    assert only(api, "KSamplerSelect")[1]["inputs"]["sampler_name"] == apply["inputs"]["sampler_name"]
    assert only(api, "CHAI_ApplyTrace")[1]["inputs"]["samples"] == [custom_id, 0]


# ------------------------------------------------------------------------------------------- the converter

def _node(node_id, kind, widgets, inputs=(), mode=0, outputs=()):
    return {"id": node_id, "type": kind, "mode": mode, "widgets_values": list(widgets),
            "inputs": [dict(i) for i in inputs], "outputs": [dict(o) for o in outputs]}


SAMPLER_SPEC = {"Sampler": [["seed", True], ["cfg", False], ["name", False]], "Source": [], "Sink": [["x", False]]}


def test_converter_handles_control_values_primitives_reroutes_notes_and_muted_nodes():
    ui = {"nodes": [
        _node(1, "Source", []),
        _node(2, "Reroute", [], inputs=[{"name": "", "link": 1}]),
        _node(3, "Sampler", [7, "randomize", 4.5, "euler"],
              inputs=[{"name": "model", "link": 2}, {"name": "cfg", "link": 3, "widget": {"name": "cfg"}}]),
        _node(4, "PrimitiveNode", [6.0]),
        _node(5, "Note", ["hello"]),
        _node(6, "Sink", ["muted"], mode=2),
    ], "links": [[1, 1, 0, 2, 0, "MODEL"], [2, 2, 0, 3, 0, "MODEL"], [3, 4, 0, 3, 1, "FLOAT"]]}
    api = ui_to_api(ui, SAMPLER_SPEC)
    assert set(api) == {"1", "3"}
    assert api["3"]["inputs"] == {"seed": 7, "cfg": 6.0, "name": "euler", "model": ["1", 0]}


def test_converter_refuses_wrong_widget_counts_unknown_types_and_bypass():
    with pytest.raises(WorkflowError, match="widget values"):
        ui_to_api({"nodes": [_node(1, "Sampler", [7, 4.5, "euler"])], "links": []}, SAMPLER_SPEC)
    with pytest.raises(WorkflowError, match="no widget spec"):
        ui_to_api({"nodes": [_node(1, "Mystery", [])], "links": []}, SAMPLER_SPEC)
    with pytest.raises(WorkflowError, match="bypass"):
        ui_to_api({"nodes": [_node(1, "Sink", [1], mode=4)], "links": []}, SAMPLER_SPEC)


def test_widget_layout_follows_input_types():
    layout = widget_layout({
        "required": {"model": ("MODEL",), "seed": ("INT", {"control_after_generate": True}),
                     "mode": (["a", "b"],), "policy": ("COMBO", {"options": ["x"]}),
                     "text": ("STRING", {"forceInput": True})},
        "optional": {"hit": ("CHAI_HIT",), "strength": ("FLOAT", {})}})
    assert layout == [["seed", True], ["mode", False], ["policy", False], ["strength", False]]


def test_workflow_files_are_what_the_generator_writes():
    import subprocess
    import sys

    done = subprocess.run([sys.executable, str(REPO / "scripts" / "make_chai_workflows.py"), "--check"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr


LOADERS = {"CHAI_OpenSoraModelLoader": "diffusion_models", "UNETLoader": "diffusion_models",
           "CLIPLoader": "text_encoders", "DualCLIPLoader": "text_encoders", "CHAI_OpenSoraVAELoader": "vae",
           "VAELoader": "vae", "CheckpointLoaderSimple": "checkpoints", "LoraLoaderModelOnly": "loras"}


@pytest.mark.parametrize("name", ["chai_opensora_t2v", "chai_wan21_t2v", "chai_opensora_warmup",
                                  "chai_wan22_a14b_t2v", "chai_wan22_5b_i2v", "chai_hunyuan_video_t2v",
                                  "chai_ltxv_t2v", "chai_wan22_a14b_4step"])
def test_every_model_loader_carries_its_file_folder_and_download_link_and_the_note_says_where_it_goes(name):
    ui, _ = load(name)
    note = next(n for n in ui["nodes"] if n["type"] == "MarkdownNote")["widgets_values"][0]
    loaders = [n for n in ui["nodes"] if n["type"] in LOADERS]
    assert loaders
    for node in loaders:
        models = node["properties"]["models"]
        # The frontend matches each entry to a widget by file name and downloads into models/<directory>
        # (DualCLIPLoader: one entry per file widget).
        assert [m["name"] for m in models] == node["widgets_values"][:len(models)], node["type"]
        assert len(models) == (2 if node["type"] == "DualCLIPLoader" else 1)
        for model in models:
            assert model["directory"] == LOADERS[node["type"]]
            assert model["url"].startswith("https://huggingface.co/") and model["url"].endswith(".safetensors")
            assert f"`{model['name']}` in `models/{model['directory']}/`" in note and model["url"] in note


@pytest.mark.parametrize("name", ["chai_toy_t2v", "chai_toy_one_node"])
def test_the_toy_workflow_needs_no_download(name):
    ui, _ = load(name)
    assert not [n for n in ui["nodes"] if n.get("properties", {}).get("models")]


def test_template_files_are_readable_titles_and_the_only_workflows_shipped():
    # The template browser shows a custom node template's file name as its title and, with '-' and '_' as
    # spaces, as its description: the names carry no '-' or '_' and say what the workflow does.
    assert sorted(TEMPLATE_FILES) == sorted(NAMES)
    assert sorted(p.stem for p in (REPO / "workflows").glob("*.json")) == sorted(TEMPLATE_FILES.values())
    # The card shows the title in at most two lines of a 16rem card and cuts the rest: 36 characters fit (the
    # browser test measures the cards).
    for title in TEMPLATE_FILES.values():
        assert title.startswith("CHAI ") and "-" not in title and "_" not in title and len(title) <= 36, title
    assert "any CPU" in TEMPLATE_FILES["chai_toy_t2v"] and "warm up" in TEMPLATE_FILES["chai_opensora_warmup"]


TITLE_HEIGHT = 30  # the frontend draws a node's title bar above its pos


@pytest.mark.parametrize("name", NAMES)
def test_no_node_overlaps_another_so_reports_stay_readable(name):
    ui, _ = load(name)
    boxes = [(n["id"], n["pos"][0], n["pos"][1] - TITLE_HEIGHT, n["pos"][0] + n["size"][0], n["pos"][1] + n["size"][1])
             for n in ui["nodes"]]
    overlapping = [(a[0], b[0]) for i, a in enumerate(boxes) for b in boxes[i + 1:]
                   if a[1] < b[3] and b[1] < a[3] and a[2] < b[4] and b[2] < a[4]]
    assert not overlapping, overlapping
