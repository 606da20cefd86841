"""Tier 2: the one-node toy workflow (the "CHAI" subgraph in front of a KSamplerAdvanced) run in a real ComfyUI from
its API twin, whose node ids are the frontend's expanded subgraph ids ("<instance>:<inner>"): a miss is stored by
CHAI Apply's MODEL when the sampler finishes, then a prompt sharing the scene hits it and runs the fast schedule."""
from __future__ import annotations

import json
import os
import uuid
from pathlib import Path
from typing import Any

import pytest
from comfy_test_nodes import capture_node, matching_env

if not os.environ.get("COMFYUI_DIR"):
    pytest.skip("tier 2 needs a ComfyUI checkout: set COMFYUI_DIR (see tests/tier2/conftest.py)",
                allow_module_level=True)


REPO = Path(__file__).resolve().parents[2]
MISS_PROMPT = "a red ball bouncing across a sunny beach"
HIT_PROMPT = "a blue kite drifting left across a sandy beach"
CAPTURED: dict[str, dict[str, Any]] = {}
_Capture = capture_node(CAPTURED, {"images": ("IMAGE",), "hit": ("CHAI_HIT",), "chai": ("CHAI_APPLIED",),
                                   "cache": ("CHAI_CACHE",)})


@pytest.fixture(scope="module")
def env(comfy):
    with matching_env():
        comfy.nodes.NODE_CLASS_MAPPINGS["CHAI_Test_SubgraphCapture"] = _Capture
        yield
        CAPTURED.clear()
        comfy.nodes.NODE_CLASS_MAPPINGS.pop("CHAI_Test_SubgraphCapture", None)


def workflow(cache: str, prompt: str) -> dict:
    """The API twin with its own cache name and prompt, and a capture of the lookup, the trace and the frames."""
    api = json.loads((REPO / "tests" / "workflows" / "chai_toy_one_node_api.json").read_text())
    ids = {v["class_type"]: k for k, v in api.items()}
    assert ":" in ids["CHAI_Apply"], "the CHAI nodes are inside the subgraph"
    api[ids["CHAI_CacheOpen"]]["inputs"]["name"] = cache
    api[ids["PrimitiveStringMultiline"]]["inputs"]["value"] = prompt
    api[ids["KSamplerAdvanced"]]["inputs"]["noise_seed"] = 7
    api["cap"] = {"class_type": "CHAI_Test_SubgraphCapture",
                  "inputs": {"key": "wf", "images": [ids["CHAI_ToyDecode"], 0], "hit": [ids["CHAI_CacheLookup"], 0],
                             "chai": [ids["CHAI_Apply"], 4], "cache": [ids["CHAI_CacheOpen"], 0]}}
    return api


def test_the_one_node_workflow_misses_then_hits_through_its_subgraph_ids(comfy, env):
    cache = f"toyworld-subgraph-{uuid.uuid4().hex[:8]}"
    for prompt in (MISS_PROMPT, HIT_PROMPT):
        result = comfy.run(workflow(cache, prompt))
        assert result.valid, (result.validation_error, result.node_errors)
        assert result.success, result.error
        got = CAPTURED["wf"]
        applied = got["chai"]
        if prompt == MISS_PROMPT:
            assert not got["hit"].hit and applied.plan.mode == "full"
            # no Cache Write in the graph: the MODEL stored the run when the sampler finished
            assert applied.stored.startswith("stored entry "), applied.stored
            assert [e.prompt for e in got["cache"].store.entries()] == [MISS_PROMPT]
        else:
            assert got["hit"].hit and got["hit"].donor_prompt == MISS_PROMPT, got["hit"].report
            assert applied.plan.mode == "fast" and applied.steps <= 8
            assert applied.stored.startswith("fast run: nothing stored"), applied.stored
            assert len(got["cache"].store.entries()) == 1
        assert got["images"].shape == (8, 128, 128, 3)
