"""Tier 2: CHAI_CacheOpen and CHAI_CacheStats loaded and executed by a real ComfyUI (see conftest.py)."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

if not os.environ.get("COMFYUI_DIR"):
    pytest.skip("tier 2 needs a ComfyUI checkout: set COMFYUI_DIR (see tests/tier2/conftest.py)",
                allow_module_level=True)

PACK_NODES = {"CHAI_CacheOpen": "CHAI Cache", "CHAI_CacheStats": "CHAI Cache Stats"}
MB = 10**6


def open_node(name: object, budget_gb: float = 0.5, policy: str = "lru", embedder: str = "minilm") -> dict:
    """API-format CHAI_CacheOpen node (`name` may be a link, ["node id", output index])."""
    return {"class_type": "CHAI_CacheOpen",
            "inputs": {"name": name, "budget_gb": budget_gb, "policy": policy, "embedder": embedder}}


def stats_prompt(name: str, action: str = "show", budget_gb: float = 0.5) -> dict:
    """CHAI_CacheOpen -> CHAI_CacheStats(action)."""
    return {"1": open_node(name, budget_gb),
            "2": {"class_type": "CHAI_CacheStats", "inputs": {"cache": ["1", 0], "action": action}}}


def report_of(result, node_id: str = "2") -> str:
    """The text the stats node showed in the UI."""
    assert result.success, result.error
    (text,) = result.outputs[node_id]["text"]
    return text


def fill(comfy, name: str, count: int, budget_gb: float = 0.5, mb_each: int = 4) -> None:
    """Insert `count` entries of about `mb_each` MB into the cache the node opened (same process-wide handle)."""
    import torch

    types = comfy.pack_module("cache_store.types")
    entities = comfy.pack_module("cache_store.entities.extract")
    config = comfy.pack_module("cache_store.config")
    cache = comfy.pack_module("cache_store.service").open_cache(
        str(comfy.cache_root), name, budget_bytes=config.budget_from_gb(budget_gb), policy="lru",
        embedder="minilm")
    for i in range(count):
        vec = torch.zeros(1, 8)
        vec[0, i % 8] = 1.0
        ents = types.EmbeddedEntities((entities.Entity(f"thing{i}", "object", f"thing{i}"),), vec.numpy(),
                                      "tier2-onehot@1")
        n = mb_each * MB // 4 // 3
        cache.store.insert(f"prompt {i}", ents, "model-fp", {f"step{s}": torch.full((n,), float(i)) for s in (2, 3, 4)},
                           [0.9, 0.8, 0.7])


def test_pack_registers_public_node_ids_with_category_and_tooltips(comfy):
    assert not [line for line in comfy.load_log if "Cannot import" in line and "ComfyUI-CHAI" in line]
    assert Path(comfy.nodes.LOADED_MODULE_DIRS["ComfyUI-CHAI"]).resolve() == Path(__file__).resolve().parents[2]
    for node_id, display in PACK_NODES.items():
        cls = comfy.nodes.NODE_CLASS_MAPPINGS[node_id]
        assert comfy.nodes.NODE_DISPLAY_NAME_MAPPINGS[node_id] == display
        assert cls.CATEGORY == "CHAI"
        inputs = cls.INPUT_TYPES()
        declared = {**inputs.get("required", {}), **inputs.get("optional", {})}
        assert declared
        for input_name, spec in declared.items():
            options = spec[1] if len(spec) > 1 else {}
            assert len(options.get("tooltip") or "") > 20, f"{node_id}.{input_name} lacks a useful tooltip"
    open_inputs = comfy.nodes.NODE_CLASS_MAPPINGS["CHAI_CacheOpen"].INPUT_TYPES()["required"]
    assert list(open_inputs) == ["name", "budget_gb", "policy", "embedder"]
    assert open_inputs["name"][1]["default"] == "default"
    assert open_inputs["budget_gb"][1]["default"] == 2.0
    assert open_inputs["budget_gb"][1]["min"] == 0.01
    assert open_inputs["policy"][0] == ["lru", "lfu"] or open_inputs["policy"][1].get("options") == ["lru", "lfu"]
    assert tuple(comfy.nodes.NODE_CLASS_MAPPINGS["CHAI_CacheOpen"].RETURN_TYPES) == ("CHAI_CACHE",)
    stats = comfy.nodes.NODE_CLASS_MAPPINGS["CHAI_CacheStats"]
    assert list(stats.INPUT_TYPES()["required"]) == ["cache", "action"]
    assert tuple(stats.RETURN_TYPES) == ("STRING",)
    assert stats.OUTPUT_NODE is True


def test_chai_cache_folder_is_registered_with_the_yaml_path_first(comfy):
    paths = comfy.folder_paths.get_folder_paths("chai_cache")
    assert Path(paths[0]) == comfy.cache_root
    assert Path(paths[-1]) == comfy.default_cache_dir


def test_open_then_show_reports_an_empty_cache_in_the_configured_folder(comfy):
    result = comfy.run(stats_prompt("tier2show"))
    report = report_of(result)
    assert "CHAI cache 'tier2show'" in report
    assert "entries: 0" in report
    assert (comfy.cache_root / "tier2show").is_dir()
    if not comfy.default_cache_dir_existed:
        assert not comfy.default_cache_dir.exists(), "the default models/chai_cache was used despite the yaml"


def test_stats_node_reruns_on_every_queue_while_open_stays_cached(comfy):
    prompt = stats_prompt("tier2rerun")
    report_of(comfy.run(prompt))
    fill(comfy, "tier2rerun", 1)
    again = comfy.run(prompt)
    (cached,) = again.events("execution_cached")
    assert "1" in cached["nodes"] and "2" not in cached["nodes"]
    assert "entries: 1" in report_of(again)
    assert "'prompt 0'" in report_of(again)


@pytest.mark.parametrize("bad", ["../evil", "a/b", "..", ".hidden", ""])
def test_invalid_cache_name_is_rejected_with_a_clear_message_and_creates_nothing(comfy, bad):
    before = sorted(p.relative_to(comfy.work_dir) for p in comfy.work_dir.rglob("*"))
    result = comfy.run(stats_prompt(bad))
    assert not result.valid
    (error,) = result.node_errors["1"]["errors"]
    assert "invalid cache name" in error["details"]
    after = sorted(p.relative_to(comfy.work_dir) for p in comfy.work_dir.rglob("*"))
    assert after == before
    assert not (comfy.work_dir / "evil").exists()


def test_invalid_name_from_a_linked_input_fails_at_run_time_with_the_message(comfy):
    # A linked name bypasses validate_inputs (ComfyUI passes only widget values), so execute must catch it.
    prompt = {"0": {"class_type": "PrimitiveString", "inputs": {"value": "../evil"}},
              "1": open_node(["0", 0]),
              "2": {"class_type": "CHAI_CacheStats", "inputs": {"cache": ["1", 0], "action": "show"}}}
    if "PrimitiveString" not in comfy.nodes.NODE_CLASS_MAPPINGS:
        pytest.skip("this ComfyUI has no PrimitiveString node")
    before = sorted(p.relative_to(comfy.work_dir) for p in comfy.work_dir.rglob("*"))
    result = comfy.run(prompt)
    assert result.valid and not result.success
    assert result.error["node_id"] == "1"
    assert result.error["exception_message"].startswith("CHAI Cache: invalid cache name '../evil'")
    assert result.error["exception_type"].endswith("ChaiNodeError")
    assert sorted(p.relative_to(comfy.work_dir) for p in comfy.work_dir.rglob("*")) == before


def test_clear_removes_every_entry(comfy):
    fill(comfy, "tier2clear", 3)
    report = report_of(comfy.run(stats_prompt("tier2clear", "clear")))
    assert "cleared 3 entries" in report
    assert "entries: 0" in report
    assert not list((comfy.cache_root / "tier2clear").rglob("*.safetensors"))


def test_prune_to_a_lowered_budget_evicts_least_recently_used(comfy):
    fill(comfy, "tier2prune", 4, budget_gb=0.5, mb_each=4)
    report = report_of(comfy.run(stats_prompt("tier2prune", "prune to budget", budget_gb=0.01)))
    assert "pruned 2 entries to fit the budget" in report, report
    assert "entries: 2" in report
    assert "'prompt 3'" in report and "'prompt 0'" not in report
    files = list((comfy.cache_root / "tier2prune").rglob("*.safetensors"))
    assert sum(f.stat().st_size for f in files) <= 0.01 * 10**9


@pytest.mark.parametrize("field, value", [("policy", "fifo"), ("embedder", "clip")])
def test_unknown_open_choice_is_refused_before_running_on_that_input_alone(comfy, field, value):
    # A V3 combo is not checked by this ComfyUI; the pack's combos are typed with their options so it is.
    prompt = stats_prompt("tier2choice")
    prompt["1"]["inputs"][field] = value
    result = comfy.run(prompt)
    assert not result.valid
    (error,) = result.node_errors["1"]["errors"]
    assert error["type"] == "value_not_in_list" and error["extra_info"]["input_name"] == field
    assert f"'{value}' not in" in error["details"]
    assert not (comfy.cache_root / "tier2choice").exists()


def test_every_chai_combo_is_checked_against_its_options_at_validation(comfy):
    # Every enumeration of the pack is a combo that ComfyUI validates (the V1 form: the options are the type).
    combos = 0
    for node_id, cls in comfy.nodes.NODE_CLASS_MAPPINGS.items():
        if not node_id.startswith("CHAI_"):
            continue
        inputs = cls.INPUT_TYPES()
        for name, spec in {**inputs.get("required", {}), **inputs.get("optional", {})}.items():
            if spec[0] == "COMBO" or isinstance(spec[0], list):
                assert isinstance(spec[0], list) and spec[0] == spec[1]["options"], f"{node_id}.{name}"
                # Newer ComfyUI looks each V3 input type up in a dict of dynamic input types (docs/comfyui-compat.md).
                assert spec[0] not in {"COMFY_AUTOGROW_V3": None}, f"{node_id}.{name}"
                combos += 1
    assert combos >= 12


def test_no_validate_inputs_reads_a_combo_or_a_bounded_number_it_does_not_check(comfy):
    # ComfyUI neither list-checks nor min/max-checks an input that a node's validate_inputs reads, and repeats a
    # failure message under every input read there: so only inputs the node checks itself may be read, and each
    # validate_inputs reads one input (a failure is reported once).
    import inspect

    from comfy_api.internal import first_real_override

    checked_here = {("CHAI_Sampler", "cache_steps"), ("CHAI_Apply", "cache_steps"), ("CHAI_CacheOpen", "name")}
    read = set()
    for node_id, cls in comfy.nodes.NODE_CLASS_MAPPINGS.items():
        validate = first_real_override(cls, "validate_inputs") if node_id.startswith("CHAI_") else None
        if validate is not None:
            params = set(inspect.signature(validate).parameters)
            assert len(params) == 1, (node_id, params)
            read |= {(node_id, p) for p in params}
    assert read == checked_here, read ^ checked_here


@pytest.mark.parametrize("field, value", [("resolution", "1080p"), ("aspect_ratio", "4:3"), ("frames", "3s")])
def test_an_unknown_latent_preset_is_reported_on_that_input_alone(comfy, field, value):
    latent = {"resolution": "240p", "aspect_ratio": "9:16 (240x426 HxW at 240p, landscape)",
              "frames": "2s (51 frames)", "custom_height": 240, "custom_width": 426, "custom_frames": 51,
              "fps": 24.0, "batch_size": 1}
    latent[field] = value
    result = comfy.run({"1": {"class_type": "CHAI_OpenSoraEmptyLatent", "inputs": latent},
                        "2": {"class_type": "PreviewAny", "inputs": {"source": ["1", 0]}}})
    (error,) = result.node_errors["1"]["errors"]
    assert error["type"] == "value_not_in_list" and error["extra_info"]["input_name"] == field, error


def test_unknown_stats_action_is_refused_before_running(comfy):
    prompt = stats_prompt("tier2action", action="delete")
    result = comfy.run(prompt)
    assert not result.valid
    (error,) = result.node_errors["2"]["errors"]
    assert error["type"] == "value_not_in_list" and "'delete' not in" in error["details"]
    assert not (comfy.cache_root / "tier2action").exists()


def test_budget_below_the_minimum_is_refused(comfy):
    result = comfy.run(stats_prompt("tier2budget", budget_gb=0.001))
    assert not result.valid
    assert result.node_errors["1"]["errors"][0]["type"] == "value_smaller_than_min"


def test_the_pack_serves_its_web_extension_that_shows_reports_on_the_nodes(comfy):
    # ComfyUI serves WEB_DIRECTORY at /extensions/<pack>/; the frontend loads every .js file in it.
    web = [Path(d) for name, d in comfy.nodes.EXTENSION_WEB_DIRS.items() if "ComfyUI-CHAI" in name]
    assert len(web) == 1 and web[0].resolve() == (Path(__file__).resolve().parents[2] / "web").resolve()
    script = (web[0] / "chai_reports.js").read_text()
    assert 'registerExtension' in script and '"execution_cached"' in script and 'startsWith("CHAI_")' in script


def test_every_input_display_name_is_in_the_locale_the_frontend_labels_widgets_from(comfy):
    # The frontend labels a widget from locales (nodeDefs.<node>.inputs.<input>.name), not from the input's
    # display_name: e.g. "threshold (0 = auto)" shows only through locales/en/nodeDefs.json.
    import json

    locale = json.loads((Path(__file__).resolve().parents[2] / "locales" / "en" / "nodeDefs.json").read_text())
    named = {}
    for node_id, cls in comfy.nodes.NODE_CLASS_MAPPINGS.items():
        if node_id.startswith("CHAI_"):
            inputs = cls.INPUT_TYPES()
            for name, spec in {**inputs.get("required", {}), **inputs.get("optional", {})}.items():
                shown = spec[1].get("display_name") if len(spec) > 1 else None
                if shown and shown != name:
                    named[(node_id, name)] = shown
    assert named, "expected at least the lookup's threshold label"
    for (node_id, name), shown in named.items():
        assert locale[node_id]["inputs"][name]["name"] == shown, (node_id, name)
