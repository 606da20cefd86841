#!/usr/bin/env bash
# Static checks, run by .ci/run before the tests: pyflakes-class errors (ruff's F rules) over the whole tree and
# the type checker (mypy, configured in pyproject.toml) over the product packages. Both come from the test venv
# (scripts/setup_venv.sh pins them).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="$(cd "${VENV:-.venv}" && pwd)"
repo="$PWD"
echo "[static] ruff $("$VENV/bin/ruff" --version | cut -d' ' -f2): F rules"
"$VENV/bin/ruff" check --no-cache --select F --quiet .
# mypy resolves the pack by its import name, comfyui_chai, as ComfyUI imports it: a folder holding one link.
root="$(mktemp -d)"
trap 'rm -rf "$root"' EXIT
ln -s "$PWD" "$root/comfyui_chai"
echo "[static] mypy $("$VENV/bin/mypy" --version | cut -d' ' -f2): nodes, chai_attention, cache_store, opensora, toyworld"
(cd "$root" && "$VENV/bin/mypy" --config-file "$repo/pyproject.toml" --cache-dir "$VENV/.mypy_cache" \
  -p comfyui_chai.nodes -p comfyui_chai.chai_attention -p comfyui_chai.cache_store -p comfyui_chai.opensora \
  -p comfyui_chai.toyworld)
echo "[static] ok"
