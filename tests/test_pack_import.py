"""The pack's entry point imports the way ComfyUI imports it, cheaply and without ComfyUI present."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

# Runs in a fresh interpreter so that modules imported by other tests cannot hide an eager import.
_PROBE = r"""
import asyncio, importlib.util, inspect, json, sys
repo = sys.argv[1]
# ComfyUI names the module after the pack's folder path (often hyphenated), dots replaced.
name = (repo + "/custom_nodes/ComfyUI-CHAI").replace(".", "_x_")
before = set(sys.modules)
spec = importlib.util.spec_from_file_location(name, repo + "/__init__.py")
module = importlib.util.module_from_spec(spec)
sys.modules[name] = module
spec.loader.exec_module(module)
after_root = set(sys.modules) - before
nodes_pkg = importlib.import_module(name + ".nodes")
paths = importlib.import_module(name + ".nodes.paths")
after_nodes = set(sys.modules) - before
print(json.dumps({
    "is_package": module.__path__ == [repo],
    "entrypoint_is_async": inspect.iscoroutinefunction(getattr(module, "comfy_entrypoint", None)),
    "has_v1_mappings": hasattr(module, "NODE_CLASS_MAPPINGS"),
    "node_list": callable(getattr(nodes_pkg, "node_list", None)),
    "folder_key": paths.FOLDER_KEY,
    "root_modules": sorted(m.split(".")[0] for m in after_root),
    "nodes_modules": sorted({m.split(".")[0] for m in after_nodes}),
}))
"""

HEAVY = {"torch", "numpy", "spacy", "hnswlib", "comfy", "comfy_api", "comfy_execution", "folder_paths",
         "nodes", "safetensors", "tokenizers", "filelock"}


@pytest.fixture(scope="module")
def info() -> dict:
    """What the probe saw when importing the pack in a fresh interpreter."""
    out = subprocess.run([sys.executable, "-c", _PROBE, str(REPO)], capture_output=True, text=True,
                         timeout=120, cwd=REPO.parent)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_root_init_imports_like_comfyui_does_and_exposes_a_v3_entrypoint(info):
    assert info["is_package"]
    assert info["entrypoint_is_async"]
    # ComfyUI looks for comfy_entrypoint only when NODE_CLASS_MAPPINGS is absent.
    assert not info["has_v1_mappings"]
    assert info["node_list"]
    assert info["folder_key"] == "chai_cache"


def test_importing_the_pack_pulls_in_no_heavy_or_comfyui_module(info):
    assert not HEAVY & set(info["root_modules"]), info["root_modules"]
    assert not HEAVY & set(info["nodes_modules"]), info["nodes_modules"]
