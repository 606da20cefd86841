"""Tier 2 (server): which CHAI nodes a real ComfyUI server runs when the same prompt is queued again.

The toy workflow's API twin is queued over HTTP like any client does, and the server's websocket says which nodes
ran (`executing`) and which it served from its output cache (`execution_cached`); `/history` has each node's
report. The behaviour under test (README, "What you see on the nodes"): the lookup re-runs when the cache it
reads gained or lost entries since its last run, and only then; otherwise ComfyUI serves it, the sampler and
the write from its own cache.
"""
from __future__ import annotations

import asyncio
import json
import os
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest

if not os.environ.get("COMFYUI_DIR"):
    pytest.skip("tier 2 needs a ComfyUI checkout: set COMFYUI_DIR (see tests/tier2/conftest.py)",
                allow_module_level=True)
aiohttp = pytest.importorskip("aiohttp", reason="aiohttp (a ComfyUI requirement) is not installed")

REPO = Path(__file__).resolve().parents[2]
TIMEOUT_S = 300


@dataclass
class Queued:
    """One queued prompt as the server reported it."""

    ran: list[str]  # node ids, in the order they ran
    cached: list[str]
    reports: dict[str, str]  # node id -> its text UI output from /history (status line first)
    files: dict[str, list[str]]  # node id -> the files it saved (subfolder/filename under output/)


def queue(url: str, prompt: dict) -> Queued:
    """Queue `prompt`, follow the websocket until it is done, then read its history entry."""

    async def go() -> Queued:
        client = uuid.uuid4().hex
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=TIMEOUT_S)) as session:
            async with session.ws_connect(f"{url}/ws?clientId={client}") as ws:
                async with session.post(f"{url}/prompt", json={"prompt": prompt, "client_id": client}) as r:
                    body = await r.json()
                    assert r.status == 200, body
                prompt_id, ran, cached = body["prompt_id"], [], []
                while True:
                    msg = await ws.receive(timeout=TIMEOUT_S)
                    if msg.type != aiohttp.WSMsgType.TEXT:
                        continue  # binary previews
                    event = json.loads(msg.data)
                    data = event.get("data") or {}
                    if data.get("prompt_id") != prompt_id:
                        continue
                    assert event["type"] != "execution_error", data.get("exception_message")
                    if event["type"] == "execution_cached":
                        cached = list(data["nodes"])
                    elif event["type"] == "executing":
                        if data.get("node") is None:
                            break  # done; the history entry is written before this message
                        ran.append(data["node"])
            async with session.get(f"{url}/history/{prompt_id}") as r:
                outputs = (await r.json())[prompt_id]["outputs"]
        reports = {node: "\n".join(out["text"]) for node, out in outputs.items() if out.get("text")}
        files = {node: [f"{i['subfolder']}/{i['filename']}".lstrip("/") for i in out["images"]]
                 for node, out in outputs.items() if out.get("images")}
        return Queued(ran, cached, reports, files)

    return asyncio.run(go())


def frames(path: Path) -> list[bytes]:
    """The decoded frames of an animated WEBP (its metadata names the prompt, so the files differ)."""
    from PIL import Image, ImageSequence

    with Image.open(path) as image:
        return [frame.convert("RGB").tobytes() for frame in ImageSequence.Iterator(image)]


def toy_prompt(cache: str, stats_action: str = "show") -> tuple[dict, dict[str, str]]:
    """The toy workflow's API twin (fixed seed) on its own cache; node ids by class."""
    prompt = json.loads((REPO / "tests" / "workflows" / "chai_toy_t2v_api.json").read_text())
    ids = {node["class_type"]: key for key, node in prompt.items()}
    prompt[ids["CHAI_CacheOpen"]]["inputs"]["name"] = cache
    prompt[ids["CHAI_CacheStats"]]["inputs"]["action"] = stats_action
    return prompt, ids


def test_a_requeue_runs_the_lookup_only_when_its_cache_changed(comfy_server):
    cache = f"server-{uuid.uuid4().hex[:8]}"
    prompt, ids = toy_prompt(cache)
    lookup, sampler, write, stats = (ids[k] for k in ("CHAI_CacheLookup", "CHAI_Sampler", "CHAI_CacheWrite",
                                                      "CHAI_CacheStats"))
    chai = {lookup, sampler, write, stats}

    first = queue(comfy_server.url, prompt)
    assert chai <= set(first.ran), first
    assert first.reports[lookup].startswith("MISS · the cache is empty"), first.reports[lookup]
    assert first.reports[sampler].startswith("MISS · 30 steps · ")
    assert first.reports[write].startswith("stored · 1 entries")

    # The write changed the cache: the lookup runs again and finds the prompt's own entry (a new fast video).
    second = queue(comfy_server.url, prompt)
    assert chai <= set(second.ran), second
    assert ids["CHAI_CacheOpen"] in second.cached and ids["CHAI_EntityExtract"] in second.cached
    assert second.reports[lookup].startswith("HIT ") and "same prompt as its donor" in second.reports[lookup]
    assert second.reports[sampler].startswith("HIT ") and " · 8 steps · " in second.reports[sampler]
    assert second.reports[write].startswith("nothing stored (fast run) · 1 entries")

    # Nothing changed since (a fast run stores nothing; refreshing a donor's recency changes no lookup): ComfyUI
    # serves lookup, sampler, write and the saved video from its cache; only the stats (always fresh) run.
    third = queue(comfy_server.url, prompt)
    assert third.ran == [stats], third
    assert {lookup, sampler, write, ids["SaveVideo"]} <= set(third.cached)
    for node in (lookup, sampler, write):  # the history keeps the report of the run that made the output
        assert third.reports[node] == second.reports[node]

    # A new seed (the template's default is 'randomize'): the lookup is served from ComfyUI's cache and the
    # sampler makes another fast video from the hit it returned, the same video a fresh lookup gives.
    prompt[sampler]["inputs"]["seed"] = 43
    reseeded = queue(comfy_server.url, prompt)
    assert lookup in reseeded.cached and lookup not in reseeded.ran, reseeded
    assert {sampler, write} <= set(reseeded.ran)
    assert reseeded.reports[sampler].startswith("HIT ") and " · 8 steps · " in reseeded.reports[sampler]
    fresh_prompt = json.loads(json.dumps(prompt))
    fresh_prompt[lookup]["inputs"]["threshold"] = 0.65  # what 0 (auto) means for MiniLM: same hit, new lookup
    fresh = queue(comfy_server.url, fresh_prompt)
    assert lookup in fresh.ran and fresh.reports[lookup].split("\n")[0] == reseeded.reports[lookup].split("\n")[0]
    webp = ids["SaveAnimatedWEBP"]
    (a,), (b,) = reseeded.files[webp], fresh.files[webp]
    output = comfy_server.base / "output"
    assert a != b and len(frames(output / a)) == 8 and frames(output / a) == frames(output / b)
    assert frames(output / a) != frames(output / second.files[webp][0])  # seed 42's video
    prompt[sampler]["inputs"]["seed"] = 42

    # The same graph with Cache Stats set to 'clear': only the stats run, and they empty the cache.
    queue(comfy_server.url, prompt)  # back to the 3rd queue's prompt (ComfyUI keeps one output per node)
    cleared = queue(comfy_server.url, toy_prompt(cache, "clear")[0])
    assert cleared.ran == [stats], cleared
    assert cleared.reports[stats].startswith("cleared 1 entries")

    # The prompt is unchanged, but the cache it reads is not: the lookup runs (a miss now), and so does the rest.
    after_clear = queue(comfy_server.url, prompt)
    assert chai <= set(after_clear.ran), after_clear
    assert after_clear.reports[lookup].startswith("MISS · the cache is empty"), after_clear.reports[lookup]
    assert after_clear.reports[write].startswith("stored · 1 entries")
