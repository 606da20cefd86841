"""One CHAI node for the common case: the CHAI subgraph between loader and sampler (its CHAI Apply stores the run
when the sampler finishes), the toy template that uses it, the "CHAI Store" blueprint for graphs another sampler
finishes, the blueprint files in subgraphs/, and the converter's subgraph expansion.

The layout checked is frontend 1.27.10's (the one ComfyUI v0.3.64 ships): its workflow schema's subgraph
definition (version 1, state, inputNode -10 / outputNode -20, uuid slot ids with linkIds, links as objects) and
its SubgraphNode, which rebuilds an instance's inputs from the definition's inputs in order and gives each input
that feeds an inner widget a widget of its own (widgets_values in input order). Tier 2's browser test loads the
template in the real frontend and compares its own API conversion with the twin.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from workflow_api import SUBGRAPH_INPUT, SUBGRAPH_OUTPUT, WorkflowError, ui_to_api, widget_inputs

REPO = Path(__file__).resolve().parents[1]
TEMPLATE_FILES = json.loads((REPO / "tests" / "workflows" / "template_files.json").read_text())
UI = json.loads((REPO / "workflows" / f"{TEMPLATE_FILES['chai_toy_one_node']}.json").read_text())
API = json.loads((REPO / "tests" / "workflows" / "chai_toy_one_node_api.json").read_text())
DEFS = {s["name"]: s for s in UI["definitions"]["subgraphs"]}  # the template's: "CHAI" only
BLUEPRINTS = {p.stem: json.loads(p.read_text()) for p in sorted((REPO / "subgraphs").glob("*.json"))}
ALL = {**{name: doc["definitions"]["subgraphs"][0] for name, doc in BLUEPRINTS.items()}, **DEFS}
UUID = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")


def instance(name: str) -> dict:
    """The template's instance of a subgraph, or the blueprint's own node for one the template does not use."""
    if name not in DEFS:
        return BLUEPRINTS[name]["nodes"][0]
    return next(n for n in UI["nodes"] if n["type"] == DEFS[name]["id"])


def inner(name: str) -> dict[str, tuple[str, dict]]:
    """class_type -> (api id, entry) of the nodes inside one subgraph instance."""
    prefix = f"{instance(name)['id']}:"
    return {v["class_type"]: (k, v) for k, v in API.items() if k.startswith(prefix)}


def test_the_template_has_no_chai_cache_node_outside_its_one_subgraph_node():
    assert set(DEFS) == {"CHAI"}
    root_chai = {n["type"] for n in UI["nodes"] if n["type"].startswith("CHAI_")}
    assert root_chai == {"CHAI_OpenSoraModelLoader", "CHAI_ToyTextEncode", "CHAI_ToyEmptyLatent", "CHAI_ToyDecode"}
    assert set(inner("CHAI")) == {"CHAI_CacheOpen", "CHAI_EntityExtract", "CHAI_CacheLookup", "CHAI_Apply"}
    assert {v["class_type"] for v in API.values()} & {"CHAI_ApplyTrace", "CHAI_CacheWrite"} == set()
    store = BLUEPRINTS["CHAI Store"]["definitions"]["subgraphs"][0]
    assert {n["type"] for n in store["nodes"]} == {"CHAI_ApplyTrace", "CHAI_CacheWrite", "CHAI_CacheStats"}


def test_chai_sits_between_the_loader_and_an_ordinary_sampler_and_stores_the_run_itself():
    ids = {v["class_type"]: k for k, v in API.items()}
    chai = inner("CHAI")
    apply_id, apply = chai["CHAI_Apply"]
    lookup_id, lookup = chai["CHAI_CacheLookup"]
    cache_id, cache = chai["CHAI_CacheOpen"]
    ents_id, ents = chai["CHAI_EntityExtract"]
    loader, latent, text = ids["CHAI_OpenSoraModelLoader"], ids["CHAI_ToyEmptyLatent"], ids["CHAI_ToyTextEncode"]
    assert apply["inputs"]["model"] == lookup["inputs"]["model"] == [loader, 0]
    assert apply["inputs"]["latent"] == lookup["inputs"]["latent"] == [latent, 0]
    assert apply["inputs"]["hit"] == [lookup_id, 0] and ents["inputs"]["prompt"] == [text, 2]
    assert lookup["inputs"]["cache"] == [cache_id, 0] and lookup["inputs"]["entities"] == [ents_id, 0]
    # CHAI Apply gets the cache and the entities: its MODEL stores the run when the sampler finishes
    assert apply["inputs"]["cache"] == [cache_id, 0] and apply["inputs"]["entities"] == [ents_id, 0]
    # the instance's widgets, not the definition's defaults, reach the inner nodes
    assert cache["inputs"]["name"] == "toyworld" and (apply["inputs"]["sampler_name"], apply["inputs"]["scheduler"],
                                                      apply["inputs"]["full_steps"]) == ("euler", "simple", 30)
    ks_id, ks = ids["KSamplerAdvanced"], API[ids["KSamplerAdvanced"]]["inputs"]
    assert (ks["model"], ks["latent_image"], ks["steps"], ks["start_at_step"]) == (
        [apply_id, 0], [apply_id, 6], [apply_id, 2], [apply_id, 7])
    assert ks["add_noise"] == "enable" and ks["sampler_name"] == apply["inputs"]["sampler_name"]
    assert ks["scheduler"] == apply["inputs"]["scheduler"]
    assert API[ids["CHAI_ToyDecode"]]["inputs"]["samples"] == [ks_id, 0]


@pytest.mark.parametrize("name", ["CHAI", "CHAI Store"])
def test_definitions_follow_the_frontend_1_27_subgraph_layout(name):
    sub = ALL[name]
    assert UUID.match(sub["id"]) and sub["version"] == 1 and sub["name"] == name and isinstance(sub["revision"], int)
    assert set(sub["state"]) == {"lastGroupId", "lastNodeId", "lastLinkId", "lastRerouteId"}
    assert sub["inputNode"]["id"] == SUBGRAPH_INPUT and sub["outputNode"]["id"] == SUBGRAPH_OUTPUT
    assert all(len(io["bounding"]) == 4 for io in (sub["inputNode"], sub["outputNode"]))
    links = {link["id"]: link for link in sub["links"]}
    assert all(set(link) == {"id", "origin_id", "origin_slot", "target_id", "target_slot", "type"}
               for link in sub["links"])
    for side, end, slot_key in (("inputs", "origin", "origin_slot"), ("outputs", "target", "target_slot")):
        boundary = SUBGRAPH_INPUT if side == "inputs" else SUBGRAPH_OUTPUT
        for i, slot in enumerate(sub[side]):
            assert UUID.match(slot["id"]) and slot["linkIds"], (name, slot["name"])
            for link_id in slot["linkIds"]:
                link = links[link_id]
                assert link[f"{end}_id"] == boundary and link[slot_key] == i and link["type"] == slot["type"]
        boundary_links = [k for k, v in links.items() if v[f"{end}_id"] == boundary]
        assert sorted(boundary_links) == sorted(x for s in sub[side] for x in s["linkIds"])
    assert sub["state"]["lastNodeId"] == max(n["id"] for n in sub["nodes"])
    assert sub["state"]["lastLinkId"] == max(links)
    root_ids = {n["id"] for n in UI["nodes"]}
    other_ids = {n["id"] for s in ALL.values() if s is not sub for n in s["nodes"]}
    assert not ({n["id"] for n in sub["nodes"]} & (root_ids | other_ids)), "inner ids are unique in the workflow"


@pytest.mark.parametrize("name", ["CHAI", "CHAI Store"])
def test_an_instance_lists_every_subgraph_input_in_order_and_one_value_per_widget_input(name):
    node, sub = instance(name), ALL[name]
    assert [(i["name"], i["type"]) for i in node["inputs"]] == [(i["name"], i["type"]) for i in sub["inputs"]]
    assert [(o["name"], o["type"]) for o in node["outputs"]] == [(o["name"], o["type"]) for o in sub["outputs"]]
    widgets = widget_inputs(sub)
    assert [i["name"] for i in node["inputs"] if "widget" in i] == widgets
    assert len(node["widgets_values"]) == len(widgets)
    # socket inputs come first: an older serialisation that lists only them still lines up by index
    kinds = ["widget" in i for i in node["inputs"]]
    assert kinds == sorted(kinds)


def test_chai_exposes_the_settings_a_user_matches_to_the_sampler():
    assert widget_inputs(DEFS["CHAI"]) == ["prompt", "cache_name", "sampler_name", "scheduler", "full_steps",
                                          "fast_steps"]
    assert [o["name"] for o in DEFS["CHAI"]["outputs"]] == ["MODEL", "LATENT", "steps", "start_at_step", "SIGMAS",
                                                           "chai", "cache", "entities"]
    assert [i["name"] for i in ALL["CHAI Store"]["inputs"]] == ["chai", "samples", "cache", "entities"]


def test_each_blueprint_is_one_subgraph_node_with_the_templates_definition():
    assert set(BLUEPRINTS) == {"CHAI", "CHAI Store"}
    for name, doc in BLUEPRINTS.items():
        (node,) = doc["nodes"]
        (definition,) = doc["definitions"]["subgraphs"]
        assert node["type"] == definition["id"] and doc["links"] == [] and doc["version"] == 0.4
        if name in DEFS:
            assert definition == DEFS[name], "the blueprint and the template share one definition"
        assert all(i["link"] is None for i in node["inputs"])
        assert len(node["widgets_values"]) == len(widget_inputs(definition))
    assert BLUEPRINTS["CHAI"]["nodes"][0]["widgets_values"][1] == "default"


def test_blueprints_ship_in_the_registry_archive():
    import subprocess
    import sys

    tracked = subprocess.run(["git", "-C", str(REPO), "ls-files", "subgraphs"], capture_output=True, text=True)
    files = set(tracked.stdout.splitlines())
    if tracked.returncode != 0 or not files:
        pytest.skip("not a git checkout with the blueprints committed: the archive is built from tracked files")
    out = subprocess.run([sys.executable, str(REPO / "scripts" / "registry_archive.py"), "--list"], cwd=REPO,
                         capture_output=True, text=True, check=True)
    assert files == {f"subgraphs/{n}.json" for n in BLUEPRINTS} and files <= set(out.stdout.splitlines())


TITLE_HEIGHT = 30


@pytest.mark.parametrize("name", ["CHAI", "CHAI Store"])
def test_no_node_inside_a_subgraph_overlaps_another(name):
    nodes = ALL[name]["nodes"]
    boxes = [(n["id"], n["pos"][0], n["pos"][1] - TITLE_HEIGHT, n["pos"][0] + n["size"][0], n["pos"][1] + n["size"][1])
             for n in nodes]
    overlapping = [(a[0], b[0]) for i, a in enumerate(boxes) for b in boxes[i + 1:]
                   if a[1] < b[3] and b[1] < a[3] and a[2] < b[4] and b[2] < a[4]]
    assert not overlapping, overlapping


# ------------------------------------------------------------------------------------------- the converter

SPEC = {"Src": [], "Sink": [["x", False]], "Pair": [["a", False], ["b", False]]}


def _io(name, kind, links, n):
    return {"id": f"00000000-0000-4000-8000-00000000000{n}", "name": name, "type": kind, "linkIds": links}


def synthetic(x_link: int | None) -> dict:
    """Root: Src(1) -> [sub node 2: in 'm' (socket), 'x' (widget of Pair.a)] -> Sink(3) from the sub's output."""
    sub = {"id": "11111111-1111-4111-8111-111111111111", "name": "S", "version": 1,
           "inputs": [_io("m", "MODEL", [11], 1), _io("x", "INT", [12], 2), _io("opt", "MODEL", [13], 3)],
           "outputs": [_io("out", "INT", [14], 4)],
           "nodes": [{"id": 10, "type": "Pair", "mode": 0, "widgets_values": [0, 5],
                      "inputs": [{"name": "m", "type": "MODEL", "link": 11},
                                 {"name": "a", "type": "INT", "widget": {"name": "a"}, "link": 12},
                                 {"name": "o", "type": "MODEL", "link": 13}],
                      "outputs": [{"name": "v", "type": "INT", "links": [14]}]}],
           "links": [{"id": 11, "origin_id": -10, "origin_slot": 0, "target_id": 10, "target_slot": 0, "type": "MODEL"},
                     {"id": 12, "origin_id": -10, "origin_slot": 1, "target_id": 10, "target_slot": 1, "type": "INT"},
                     {"id": 13, "origin_id": -10, "origin_slot": 2, "target_id": 10, "target_slot": 2, "type": "MODEL"},
                     {"id": 14, "origin_id": 10, "origin_slot": 0, "target_id": -20, "target_slot": 0, "type": "INT"}]}
    node = {"id": 2, "type": sub["id"], "mode": 0, "widgets_values": [7],
            "inputs": [{"name": "m", "type": "MODEL", "link": 1}, {"name": "x", "type": "INT", "link": x_link,
                                                                     "widget": {"name": "x"}},
                       {"name": "opt", "type": "MODEL", "link": None}],
            "outputs": [{"name": "out", "type": "INT", "links": [2]}]}
    nodes = [{"id": 1, "type": "Src", "mode": 0, "widgets_values": [], "inputs": [], "outputs": []}, node,
             {"id": 3, "type": "Sink", "mode": 0, "widgets_values": [0],
              "inputs": [{"name": "x", "type": "INT", "widget": {"name": "x"}, "link": 2}]}]
    links = [[1, 1, 0, 2, 0, "MODEL"], [2, 2, 0, 3, 0, "INT"]]
    if x_link is not None:
        links.append([x_link, 1, 1, 2, 1, "INT"])
    return {"nodes": nodes, "links": links, "definitions": {"subgraphs": [sub]}}


def test_converter_expands_a_subgraph_as_the_frontend_does():
    api = ui_to_api(synthetic(None), SPEC)
    assert set(api) == {"1", "2:10", "3"}
    # socket from outside, the instance's widget value for the widget input, an unconnected socket left unset
    assert api["2:10"]["inputs"] == {"a": 7, "b": 5, "m": ["1", 0]}
    assert api["3"]["inputs"] == {"x": ["2:10", 0]}  # the instance's output is what feeds the output node
    linked = ui_to_api(synthetic(9), SPEC)
    assert linked["2:10"]["inputs"]["a"] == ["1", 1]  # a linked widget input follows the outer link


def test_converter_refuses_a_subgraph_output_with_nothing_inside():
    ui = synthetic(None)
    ui["definitions"]["subgraphs"][0]["outputs"][0]["linkIds"] = []
    with pytest.raises(WorkflowError, match="not connected inside"):
        ui_to_api(ui, SPEC)
