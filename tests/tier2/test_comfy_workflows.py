"""Tier 2: the shipped workflows against a real ComfyUI: node specs, UI -> API with live definitions, validation."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

if not os.environ.get("COMFYUI_DIR"):
    pytest.skip("tier 2 needs a ComfyUI checkout: set COMFYUI_DIR (see tests/tier2/conftest.py)",
                allow_module_level=True)

from workflow_api import ui_to_api, widget_layout  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
SPEC_DOC = json.loads((REPO / "tests" / "workflows" / "node_specs.json").read_text())["nodes"]
TEMPLATE_FILES = json.loads((REPO / "tests" / "workflows" / "template_files.json").read_text())
NAMES = ["chai_opensora_t2v", "chai_wan21_t2v", "chai_opensora_warmup", "chai_toy_t2v", "chai_wan22_a14b_t2v",
         "chai_wan22_5b_i2v", "chai_hunyuan_video_t2v", "chai_ltxv_t2v", "chai_toy_one_node",
         "chai_wan22_a14b_4step"]
FILE_INPUTS = {"model_name", "clip_name", "clip_name1", "clip_name2", "vae_name", "unet_name", "ckpt_name", "image",
               "lora_name"}


def live_spec(comfy, kind: str) -> dict:
    cls = comfy.nodes.NODE_CLASS_MAPPINGS[kind]
    types = cls.INPUT_TYPES()
    names = getattr(cls, "RETURN_NAMES", None) or cls.RETURN_TYPES
    return {"widgets": widget_layout(types),
            "inputs": [[n, s[0] if isinstance(s[0], str) else "COMBO"] for section in ("required", "optional")
                       for n, s in types.get(section, {}).items()],
            "outputs": [[n, t] for n, t in zip(names, cls.RETURN_TYPES)]}


def test_node_specs_match_the_live_node_definitions(comfy):
    for kind, spec in SPEC_DOC.items():
        assert kind in comfy.nodes.NODE_CLASS_MAPPINGS, kind
        assert live_spec(comfy, kind) == spec, kind


@pytest.mark.parametrize("name", NAMES)
def test_ui_workflow_converted_with_live_definitions_equals_the_twin(comfy, name):
    ui = json.loads((REPO / "workflows" / f"{TEMPLATE_FILES[name]}.json").read_text())
    api = json.loads((REPO / "tests" / "workflows" / f"{name}_api.json").read_text())
    graphs = [ui, *ui.get("definitions", {}).get("subgraphs", [])]  # the nodes inside subgraphs too
    kinds = {n["type"] for g in graphs for n in g["nodes"]}
    specs = {k: live_spec(comfy, k)["widgets"] for k in kinds if k in comfy.nodes.NODE_CLASS_MAPPINGS}
    assert ui_to_api(ui, specs) == api


@pytest.mark.parametrize("name", NAMES)
def test_api_twin_validates_with_only_missing_model_files(comfy, name):
    api = json.loads((REPO / "tests" / "workflows" / f"{name}_api.json").read_text())
    ok, error, outputs, node_errors = comfy.validate(api)
    problems = [(node_id, e["type"], e.get("extra_info", {}).get("input_name"))
                for node_id, info in node_errors.items() for e in info["errors"]]
    # A missing model file is not in its loader's list; a missing image fails LoadImage's own check.
    assert all(kind in ("value_not_in_list", "custom_validation_failed") and field in FILE_INPUTS
               for _, kind, field in problems), problems
    if ok:
        assert outputs
    else:
        assert problems, error  # nothing failed but the missing files


def test_workflows_are_listed_by_the_template_browser(comfy):
    """ComfyUI's own GET /workflow_templates handler lists the pack's workflows/ files."""
    from aiohttp import web

    from app.custom_node_manager import CustomNodeManager

    routes = web.RouteTableDef()
    CustomNodeManager().add_routes(routes, web.Application(), [])
    handler = next(r.handler for r in routes if getattr(r, "path", None) == "/workflow_templates")
    response = comfy.loop.run_until_complete(handler(None))
    listed = json.loads(response.body)
    assert sorted(listed["ComfyUI-CHAI"]) == sorted(TEMPLATE_FILES[name] for name in NAMES)


def test_converter_handles_a_workflow_saved_by_the_real_frontend(comfy):
    """ComfyUI's own Wan 2.1 template (written by the frontend) converts and validates like our twins."""
    templates = pytest.importorskip("comfyui_workflow_templates", reason="workflow templates package not installed")
    path = Path(templates.__file__).parent / "templates" / "text_to_video_wan.json"
    if not path.is_file():
        pytest.skip(f"{path.name} is not in this templates package")
    ui = json.loads(path.read_text())
    kinds = {n["type"] for n in ui["nodes"]} & set(comfy.nodes.NODE_CLASS_MAPPINGS)
    api = ui_to_api(ui, {k: live_spec(comfy, k)["widgets"] for k in kinds})
    sampler = next(v for v in api.values() if v["class_type"] == "KSampler")
    assert sampler["inputs"]["sampler_name"] == "uni_pc" and sampler["inputs"]["steps"] == 30
    assert isinstance(sampler["inputs"]["seed"], int) and sampler["inputs"]["denoise"] == 1
    ok, error, outputs, node_errors = comfy.validate(api)
    problems = [(e["type"], e.get("extra_info", {}).get("input_name"))
                for info in node_errors.values() for e in info["errors"]]
    assert problems and all(kind == "value_not_in_list" and field in FILE_INPUTS for kind, field in problems), problems


def test_template_browser_finds_a_thumbnail_per_workflow_and_the_category_title(comfy):
    """The frontend asks /api/workflow_templates/<pack>/<name>.jpg; ComfyUI serves the pack's workflows/ there,
    and its /i18n handler carries the pack's category title."""
    from aiohttp import web

    from app.custom_node_manager import CustomNodeManager

    app = web.Application()
    routes = web.RouteTableDef()
    CustomNodeManager().add_routes(routes, app, [("ComfyUI-CHAI", str(REPO))])
    statics = {r.canonical: Path(r.get_info()["directory"]) for r in app.router.resources()
               if isinstance(r, web.StaticResource)}
    folder = statics["/api/workflow_templates/ComfyUI-CHAI"]
    for name in NAMES:
        title = TEMPLATE_FILES[name]
        assert (folder / f"{title}.jpg").is_file() and (folder / f"{title}.json").is_file(), title
    # The frontend requests the picture by its (URL-quoted) name: spaces, commas and brackets must be served.
    from urllib.parse import quote

    from aiohttp.test_utils import TestClient, TestServer

    async def fetch(path: str) -> tuple[int, str, int]:
        async with TestClient(TestServer(app)) as client:
            response = await client.get(path)
            return response.status, response.content_type, len(await response.read())

    for name in NAMES:
        status, kind, size = comfy.loop.run_until_complete(
            fetch(f"/api/workflow_templates/ComfyUI-CHAI/{quote(TEMPLATE_FILES[name])}.jpg"))
        assert (status, kind) == (200, "image/jpeg") and size > 10_000, (name, status, kind)
    titles = CustomNodeManager().build_translations()["en"]["templateWorkflows"]["category"]
    assert titles["ComfyUI-CHAI"] == "ComfyUI-CHAI"
