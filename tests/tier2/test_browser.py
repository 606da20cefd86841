"""Tier 2 (browser): the stock ComfyUI frontend shows the CHAI reports on the nodes.

A real ComfyUI server (COMFYUI_DIR, CPU; the `comfy_server` fixture) with only this pack is driven by Playwright
in Debian's chromium: the shipped toy workflow is loaded into the canvas and queued three times with a fixed
seed: a miss, a hit on its own entry, then the same prompt unchanged, which ComfyUI serves from its output
cache and the nodes say so. A second page that never saw a run then queues it too. The test reads the nodes'
widgets and their text boxes as the page has them; on a failure it saves a screenshot (its path is in the
failure message). It skips unless Playwright is importable and a chromium executable exists (CHAI_CHROMIUM or
/usr/bin/chromium): Playwright's own browser download is not used.
"""
from __future__ import annotations

import json
import os
import shutil
import uuid
from contextlib import contextmanager
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
CACHED_NOTE = "(from ComfyUI's output cache: nothing ran this time; this is the last run's report)"
TITLE_HEIGHT = 30


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


def _shown(page, node_id: int) -> str:
    """The text of the node's report box as drawn on the page (its textarea), which must be visible."""
    element = page.evaluate_handle("(id) => app.graph.getNodeById(id).widgets.find((w) => w.name === "
                                   "'chai_report').element", node_id).as_element()
    assert element is not None and element.is_visible(), f"node {node_id}'s report box is not visible"
    return element.input_value()


def _status(page, node_id: int) -> str:
    """The one-line status the core frontend shows on the node (its progress-text line)."""
    return page.evaluate("(id) => app.graph.getNodeById(id).widgets.find((w) => w.name === "
                         "'$$node-text-preview')?.value ?? ''", node_id)


def _ready(page, url: str) -> None:
    """Open the frontend and wait until its start-up has opened a workflow tab: a graph loaded before that would
    land in a tab the start-up then replaces (a new user gets a blank workflow and the template browser)."""
    page.goto(url)
    page.wait_for_function("() => window.app?.graph && window.app.extensionManager?.workflow?.activeWorkflow",
                           timeout=TIMEOUT_S * 1000)


def _open(browser, url: str, workflow: dict):
    page = browser.new_page(viewport={"width": 1600, "height": 1000})
    _ready(page, url)
    page.evaluate("(wf) => app.loadGraphData(wf)", workflow)
    return page


def _queue_and_wait(page) -> None:
    """Queue the canvas's prompt and wait until the server says it is done (and the history is written)."""
    page.evaluate("() => { const api = window.comfyAPI.api.api; window.__chaiDone = false; "
                  "const done = ({ detail }) => { if (detail === null) { window.__chaiDone = true; "
                  "api.removeEventListener('executing', done); } }; api.addEventListener('executing', done); "
                  "return app.queuePrompt(0); }")
    page.wait_for_function("() => window.__chaiDone", timeout=TIMEOUT_S * 1000)


@contextmanager
def _screenshot_on_failure(page, path: Path):
    try:
        yield
    except (Exception, pytest.fail.Exception) as exc:
        try:
            page.screenshot(path=str(path), full_page=True)
        except Exception:  # the page may be gone; the failure itself is what matters
            raise exc
        raise AssertionError(f"{exc}\n(screenshot: {path})") from exc


def test_the_frontend_shows_each_report_and_status_on_its_node_and_marks_cached_ones(comfy_server, tmp_path):
    workflow = json.loads((REPO / "workflows" / f"{TEMPLATE_FILES['chai_toy_t2v']}.json").read_text())
    ids = {n["type"]: n["id"] for n in workflow["nodes"]}
    next(n for n in workflow["nodes"] if n["type"] == "CHAI_Sampler")["widgets_values"][1] = "fixed"  # same seed
    # A cache of its own: a miss first, whatever else this server has run.
    next(n for n in workflow["nodes"] if n["type"] == "CHAI_CacheOpen")["widgets_values"][0] = \
        f"browser-{uuid.uuid4().hex[:8]}"
    lookup, sampler, write, stats = (ids[k] for k in ("CHAI_CacheLookup", "CHAI_Sampler", "CHAI_CacheWrite",
                                                      "CHAI_CacheStats"))
    with playwright_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"])
        try:
            page = _open(browser, comfy_server.url, workflow)
            with _screenshot_on_failure(page, tmp_path / "browser_failure.png"):
                _queue_and_wait(page)
                first_stats = _wait_for(page, stats, "1 entries · ", start=True)  # taken after the write
                first = _wait_for(page, lookup, "MISS · the cache is empty\nCHAI lookup: miss", start=True)
                assert _wait_for(page, sampler, "MISS · 30 steps · ", start=True)
                assert _widget(page, write).startswith("stored · 1 entries"), first_stats
                assert list((comfy_server.base / "output" / "video").glob("CHAI_toy_*.mp4"))  # the saved video
                label = page.evaluate("(id) => app.graph.getNodeById(id).widgets.find((w) => w.name === "
                                      "'threshold').label", lookup)
                assert label == "threshold (0 = auto)"  # from locales/en/nodeDefs.json
                # The one-line status reaches the node without the extension too (the core progress-text line).
                assert _status(page, lookup) == first.split("\n")[0]
                assert _shown(page, lookup) == first
                # The report box is not an input: the queued prompt does not carry it (else the node's cache key
                # would change with every report and an unchanged prompt would always run again).
                queued = page.evaluate("async () => (await app.graphToPrompt()).output")
                assert "chai_report" not in queued[str(lookup)]["inputs"], queued[str(lookup)]

                _queue_and_wait(page)  # the same prompt: a hit on its own entry, by design
                second = _wait_for(page, lookup, "same prompt as its donor")
                assert second.startswith("HIT ") and "note: this prompt is already in the cache" in second, second
                second_sampler = _wait_for(page, sampler, "HIT ", start=True)
                assert not second.startswith(CACHED_NOTE)

                _queue_and_wait(page)  # nothing changed: ComfyUI serves lookup, sampler and write from its cache
                for node, report in ((lookup, second), (sampler, second_sampler)):
                    shown = _wait_for(page, node, CACHED_NOTE, start=True)
                    assert shown == f"{CACHED_NOTE}\n{report}"
                    assert _shown(page, node) == shown
                    assert _status(page, node) == "cached · " + report.split("\n")[0]
                assert _wait_for(page, write, CACHED_NOTE, start=True)
                assert not _widget(page, stats).startswith(CACHED_NOTE)  # the stats always run

                # The report boxes never push a node under another one.
                boxes = page.evaluate("() => app.graph._nodes.map((n) => [n.id, n.pos[0], n.pos[1], "
                                      "n.pos[0] + n.size[0], n.pos[1] + n.size[1]])")
                boxes = [(i, x0, y0 - TITLE_HEIGHT, x1, y1) for i, x0, y0, x1, y1 in boxes]
                assert not [(a[0], b[0]) for k, a in enumerate(boxes) for b in boxes[k + 1:]
                            if a[1] < b[3] and b[1] < a[3] and a[2] < b[4] and b[2] < a[4]], boxes

                # The report box is not a widget value: a saved workflow keeps the node's widgets_values.
                saved = page.evaluate("() => app.graph.serialize()")
                node = next(n for n in saved["nodes"] if n["id"] == lookup)
                # (The core frontend does save its own progress-text line after the inputs' values; the input
                # values stay first and in order, which is what loading a workflow reads.)
                assert node["widgets_values"][0] == 0.0
                assert not [v for v in node["widgets_values"] if isinstance(v, str) and "CHAI lookup:" in v]

            # A page that never saw these nodes run: ComfyUI sends no report for a cached node that is not an
            # output node, so the extension reads the reports from the prompt's history entry.
            fresh = _open(browser, comfy_server.url, workflow)
            with _screenshot_on_failure(fresh, tmp_path / "browser_failure_fresh_page.png"):
                _queue_and_wait(fresh)
                for node, report in ((lookup, second), (sampler, second_sampler)):
                    assert _wait_for(fresh, node, CACHED_NOTE, start=True) == f"{CACHED_NOTE}\n{report}"
        finally:
            browser.close()


def test_every_shipped_workflow_loads_with_every_node_resolved_and_converts_to_its_api_twin(comfy_server):
    """The stock frontend loads each workflows/*.json with every node on the canvas and of a registered type (the
    pack's, the core's or the frontend's own, such as MarkdownNote), and its own UI -> API conversion
    (app.graphToPrompt, what queueing sends) equals the twin the other tests validate and run."""
    load = ("async (wf) => { await app.loadGraphData(wf); return app.graph.nodes.map((n) => "
            "[n.id, n.type, !!LiteGraph.registered_node_types[n.type]]); }")
    with playwright_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"])
        try:
            page = browser.new_page()
            _ready(page, comfy_server.url)
            known = set(page.evaluate("async () => Object.keys(await (await fetch('/object_info')).json())"))
            for key, title in TEMPLATE_FILES.items():
                workflow = json.loads((REPO / "workflows" / f"{title}.json").read_text())
                twin = json.loads((REPO / "tests" / "workflows" / f"{key}_api.json").read_text())
                # A subgraph node's type is its definition's id (the frontend registers it on load); the nodes
                # inside must be known like the others.
                subgraphs = {d["id"]: d for d in workflow.get("definitions", {}).get("subgraphs", [])}
                kinds = {n["type"] for g in [workflow, *subgraphs.values()] for n in g["nodes"]} - set(subgraphs)
                assert kinds - known <= {"MarkdownNote"}, key
                loaded = page.evaluate(load, workflow)
                assert sorted((i, t) for i, t, _ in loaded) == sorted((n["id"], n["type"]) for n in workflow["nodes"])
                assert [t for _, t, registered in loaded if not registered] == [], key
                prompt = page.evaluate("async () => (await app.graphToPrompt()).output")
                got = {k: (v["class_type"], v["inputs"]) for k, v in prompt.items()}
                want = {k: (v["class_type"], v["inputs"]) for k, v in twin.items()}
                assert got == want, key
            # The check can fail: a node type nobody registered is reported.
            workflow["nodes"][-1]["type"] = "CHAI_NoSuchNode"
            assert [t for _, t, registered in page.evaluate(load, workflow) if not registered] == ["CHAI_NoSuchNode"]
        finally:
            browser.close()


def _toy_workflow(cache: str) -> tuple[dict, dict]:
    """The shipped toy workflow with a fixed seed and a cache of its own; and its node ids by type."""
    workflow = json.loads((REPO / "workflows" / f"{TEMPLATE_FILES['chai_toy_t2v']}.json").read_text())
    next(n for n in workflow["nodes"] if n["type"] == "CHAI_Sampler")["widgets_values"][1] = "fixed"
    next(n for n in workflow["nodes"] if n["type"] == "CHAI_CacheOpen")["widgets_values"][0] = cache
    return workflow, {n["type"]: n["id"] for n in workflow["nodes"]}


def _set_widget(page, node_id: int, name: str, value) -> None:
    page.evaluate("([id, name, value]) => { app.graph.getNodeById(id).widgets.find((w) => w.name === name)"
                  ".value = value; }", [node_id, name, value])


def test_a_stopped_run_marks_the_nodes_that_did_not_finish_instead_of_showing_the_last_reports(comfy_server,
                                                                                                tmp_path):
    workflow, ids = _toy_workflow(f"browser-stop-{uuid.uuid4().hex[:8]}")
    lookup, sampler, write = (ids[k] for k in ("CHAI_CacheLookup", "CHAI_Sampler", "CHAI_CacheWrite"))
    prompt = next(n["id"] for n in workflow["nodes"] if n["type"] == "PrimitiveStringMultiline")
    with playwright_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"])
        try:
            page = _open(browser, comfy_server.url, workflow)
            with _screenshot_on_failure(page, tmp_path / "browser_failure_stop.png"):
                _queue_and_wait(page)  # a miss that stores the beach
                _wait_for(page, write, "stored · 1 entries", start=True)
                _queue_and_wait(page)  # a hit on it
                _wait_for(page, sampler, "HIT ", start=True)
                assert _widget(page, write).startswith("nothing stored (fast run)")
                # Another scene (a miss, so the sampler runs its full schedule, made long), stopped as the
                # sampler starts: the lookup reports its new miss, the sampler and the write never finish.
                _set_widget(page, prompt, "value", "a blue kite flying up over a snowy field")
                _set_widget(page, sampler, "full_steps", 1000)
                page.evaluate("() => { const api = window.comfyAPI.api.api; window.__chaiStopped = false; "
                              f"const stop = ({{ detail }}) => {{ if (String(detail) === '{sampler}') {{ "
                              "api.removeEventListener('executing', stop); api.interrupt(); } }; "
                              "api.addEventListener('executing', stop); "
                              "api.addEventListener('execution_interrupted', () => { window.__chaiStopped = true; "
                              "}); return app.queuePrompt(0); }")
                page.wait_for_function("() => window.__chaiStopped", timeout=TIMEOUT_S * 1000)
                assert _wait_for(page, lookup, "MISS ", start=True)
                for node in (sampler, write):
                    shown = _wait_for(page, node, "interrupted · this node did not finish", start=True)
                    assert "an earlier run's report, not the last run's" in shown.split("\n")[1], shown
                    assert _status(page, node) == "interrupted · this node did not finish in the last run"
                    assert _shown(page, node) == shown
                # The next complete run shows its own reports again, unmarked.
                _set_widget(page, sampler, "full_steps", 30)
                _queue_and_wait(page)
                assert _wait_for(page, sampler, "MISS · 30 steps", start=True)
                assert _wait_for(page, write, "stored · 2 entries", start=True)
        finally:
            browser.close()


def test_the_template_browser_shows_whole_titles_under_the_packs_one_name(comfy_server, tmp_path):
    with playwright_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"])
        try:
            page = browser.new_page(viewport={"width": 1600, "height": 1000})
            _ready(page, comfy_server.url)
            with _screenshot_on_failure(page, tmp_path / "browser_failure_templates.png"):
                page.evaluate("() => app.extensionManager.command.execute('Comfy.BrowseTemplates')")
                # The sidebar entry of the pack (its locale title), then the header of its list.
                entry = page.get_by_text("ComfyUI-CHAI", exact=True).first
                entry.wait_for(timeout=TIMEOUT_S * 1000)
                entry.click()
                cards = page.locator("[data-testid^='template-workflow-']")
                cards.first.wait_for(timeout=TIMEOUT_S * 1000)
                header = page.evaluate("() => [...document.querySelectorAll('h2')].map((h) => h.textContent.trim())")
                assert "ComfyUI-CHAI" in header, header
                titles = page.evaluate(
                    "() => [...document.querySelectorAll(\"[data-testid^='template-workflow-'] h3\")].map((h) => "
                    "[h.textContent.trim(), h.scrollHeight <= h.clientHeight + 1])")
                assert sorted(t for t, _ in titles) == sorted(TEMPLATE_FILES.values()), titles
                assert [t for t, whole in titles if not whole] == [], titles
        finally:
            browser.close()
