"""Template-browser pictures: one <name>.jpg per shipped workflow, as scripts/make_template_thumbnails.py draws
them (the toy workflow's is its real output), and the pack's category title for the browser."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

REPO = Path(__file__).resolve().parents[1]
WORKFLOWS = REPO / "workflows"


@pytest.fixture(scope="module")
def rendered():
    sys.path.insert(0, str(REPO / "scripts"))
    try:
        import make_template_thumbnails
    finally:
        sys.path.remove(str(REPO / "scripts"))
    return make_template_thumbnails.render()


def test_every_workflow_has_a_jpeg_thumbnail_next_to_it():
    names = sorted(p.stem for p in WORKFLOWS.glob("*.json"))
    assert len(names) == 10
    for name in names:
        with Image.open(WORKFLOWS / f"{name}.jpg") as im:
            assert im.format == "JPEG" and im.size == (512, 384), name


def test_thumbnails_on_disk_are_what_the_script_draws_and_the_toy_one_is_the_toy_workflows_clip(rendered):
    assert {p.name for p in rendered} == {p.name for p in WORKFLOWS.glob("*.jpg")}
    for path, image in rendered.items():
        with Image.open(path) as on_disk:
            diff = np.abs(np.asarray(on_disk.convert("RGB"), dtype=np.float32) - np.asarray(image, dtype=np.float32))
        assert diff.mean() < 4.0, (path.name, diff.mean())  # JPEG rounding only
    # The toy picture holds frames, not a drawing: many colours, and the frames differ (the ball moves).
    files = json.loads((REPO / "tests" / "workflows" / "template_files.json").read_text())
    toy = np.asarray(rendered[WORKFLOWS / f"{files['chai_toy_t2v']}.jpg"])
    first, last = toy[56:172, 8:124], toy[192:308, 392:508]
    assert len(np.unique(toy.reshape(-1, 3), axis=0)) > 200 and np.abs(first.astype(int) - last).mean() > 5


def test_the_pack_has_one_name_wherever_the_frontend_shows_it():
    # The template browser heads the pack's list with its folder name (the repository's name, no locale key is
    # read there); the sidebar entry (a locale key) and the Registry's DisplayName must say the same.
    import tomllib

    titles = json.loads((REPO / "locales" / "en" / "main.json").read_text())["templateWorkflows"]["category"]
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    folder = pyproject["project"]["urls"]["Repository"].rstrip("/").rsplit("/", 1)[-1]
    assert folder == "ComfyUI-CHAI"
    assert titles["ComfyUI-CHAI"] == titles["comfyui-chai"] == pyproject["tool"]["comfy"]["DisplayName"] == folder
