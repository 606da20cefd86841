"""Builders for ComfyUI's UI-format workflows (frontend "workflow" version 0.4) and their subgraphs.

`UIGraph` lays out nodes and links; `Subgraph` is a graph of its own with boundary inputs and outputs, placed in a
workflow as one node (its type is the subgraph's id) and defined under `definitions.subgraphs`, the layout
ComfyUI's frontend 1.27.10 (the one ComfyUI v0.3.64 ships) reads and writes: definition version 1 with `state`,
`inputNode` / `outputNode` (ids -10 / -20), `inputs` / `outputs` with uuid ids and `linkIds`, links as objects.
An instance node lists every subgraph input in order (a widget-type one with `widget`); its `widgets_values` are
the values of the inputs that feed a widget inside, in input order. Node sockets and widget order come from
tests/workflows/node_specs.json; ids are deterministic (uuid5), so regenerating writes the same files.
"""
from __future__ import annotations

import json
import sys
import uuid
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

from workflow_api import SUBGRAPH_INPUT, SUBGRAPH_OUTPUT, WIDGET_TYPES  # noqa: E402

SPECS = json.loads((REPO / "tests" / "workflows" / "node_specs.json").read_text())["nodes"]
FRONTEND_VERSION = "1.27.10"


def stable_uuid(*parts: str) -> str:
    """A uuid that is the same on every run for the same parts."""
    return str(uuid.uuid5(uuid.NAMESPACE_URL, "comfyui-chai/" + "/".join(parts)))


class UIGraph:
    """Builds a UI-format graph from node types, widget values and links; node ids start after `first_id`."""

    def __init__(self, name: str, first_id: int = 0, first_link: int = 0) -> None:
        self.name = name
        self.first_id, self.first_link = first_id, first_link
        self.nodes: list[dict[str, Any]] = []
        self.links: list[list[Any]] = []
        self.subgraphs: list[Subgraph] = []

    def _add(self, node: dict[str, Any]) -> int:
        node_id = self.first_id + len(self.nodes) + 1
        ordered: dict[str, Any] = {"id": node_id}
        for key, value in node.items():  # the frontend's key order: ..., flags, order, mode, ...
            ordered[key] = value
            if key == "flags":
                ordered["order"] = len(self.nodes)
        self.nodes.append(ordered)
        return node_id

    def get(self, node_id: int) -> dict[str, Any]:
        """The node with this id."""
        return self.nodes[node_id - self.first_id - 1]

    def node(self, kind: str, pos: tuple[int, int], widgets: list[Any], *, title: str | None = None,
             size: tuple[int, int] = (320, 130), models: tuple[dict[str, str], ...] = ()) -> int:
        """Add a node; widgets are its widgets_values (control_after_generate values included)."""
        spec = SPECS[kind] if kind in SPECS else {"inputs": [], "outputs": [], "widgets": []}
        widget_names = {w[0] for w in spec["widgets"]}
        sockets = [{"name": n, "type": t, "link": None} for n, t in spec["inputs"]
                   if t not in WIDGET_TYPES or (n not in widget_names and t != "COMBO")]
        node: dict[str, Any] = {"type": kind, "pos": list(pos), "size": list(size), "flags": {}, "mode": 0,
                                "inputs": sockets,
                                "outputs": [{"name": n, "type": t, "links": []} for n, t in spec["outputs"]],
                                "properties": {"Node name for S&R": kind}, "widgets_values": widgets}
        if models:
            node["properties"]["models"] = [dict(m) for m in models]
        if title:
            node["title"] = title
        return self._add(node)

    def note(self, pos: tuple[int, int], text: str, size: tuple[int, int] = (420, 260)) -> None:
        """A MarkdownNote (frontend only: not part of the API prompt)."""
        self._add({"type": "MarkdownNote", "pos": list(pos), "size": list(size), "flags": {}, "mode": 0,
                   "inputs": [], "outputs": [], "properties": {}, "widgets_values": [text],
                   "title": "About this workflow"})

    def subgraph_node(self, sub: Subgraph, pos: tuple[int, int], widgets: list[Any],
                      size: tuple[int, int] = (340, 300)) -> int:
        """Place a subgraph as one node; widgets are the values of its widget-feeding inputs, in input order."""
        if sub not in self.subgraphs:
            self.subgraphs.append(sub)
        if len(widgets) != len(sub.widget_inputs()):
            raise ValueError(f"{sub.name}: {len(sub.widget_inputs())} widget inputs, {len(widgets)} values given")
        inputs = []
        for slot in sub.inputs:
            entry: dict[str, Any] = {"name": slot["name"], "type": slot["type"], "link": None}
            if slot["name"] in sub.widget_inputs():
                entry["widget"] = {"name": slot["name"]}
            inputs.append(entry)
        return self._add({"type": sub.id, "pos": list(pos), "size": list(size), "flags": {}, "mode": 0,
                          "inputs": inputs,
                          "outputs": [{"name": s["name"], "type": s["type"], "links": []} for s in sub.outputs],
                          "properties": {}, "widgets_values": widgets, "title": sub.name})

    def _entry(self, target: dict[str, Any], name: str) -> dict[str, Any]:
        """The input entry `name` of a node; a widget input gets a socket entry the first time a link drives it."""
        entry = next((e for e in target["inputs"] if e["name"] == name), None)
        if entry is None:
            types = dict((n, t) for n, t in SPECS.get(target["type"], {"inputs": []})["inputs"])
            if name not in types:
                raise ValueError(f"{target['type']} has no input {name!r}")
            entry = {"name": name, "type": types[name], "widget": {"name": name}, "link": None}
            target["inputs"].append(entry)
        return entry

    def link(self, src: int, slot: int, dst: int, name: str) -> None:
        """Connect output `slot` of node src to input `name` of node dst (a widget input becomes linked)."""
        source, target = self.get(src), self.get(dst)
        kind = source["outputs"][slot]["type"]
        link_id = self.first_link + len(self.links) + 1
        entry = self._entry(target, name)
        if entry["type"] != kind:
            raise ValueError(f"{source['type']} output {slot} is {kind}; {target['type']}.{name} takes {entry['type']}")
        entry["link"] = link_id
        source["outputs"][slot]["links"].append(link_id)
        self.links.append([link_id, src, slot, dst, target["inputs"].index(entry), kind])

    def to_json(self) -> dict[str, Any]:
        """The workflow document."""
        doc: dict[str, Any] = {
            "id": stable_uuid(self.name), "revision": 0, "last_node_id": self.first_id + len(self.nodes),
            "last_link_id": self.first_link + len(self.links), "nodes": self.nodes, "links": self.links,
            "groups": [], "config": {},
            "extra": {"ds": {"scale": 0.6, "offset": [480, 40]}, "frontendVersion": FRONTEND_VERSION},
            "version": 0.4}
        if self.subgraphs:
            doc["definitions"] = {"subgraphs": [sub.definition() for sub in self.subgraphs]}
        return doc


class Subgraph(UIGraph):
    """A subgraph definition: inner nodes and links plus boundary inputs (from -10) and outputs (to -20)."""

    def __init__(self, name: str, first_id: int, first_link: int, *, input_x: int = -300, output_x: int = 1200):
        super().__init__(name, first_id, first_link)
        self.id = stable_uuid("subgraph", name)
        self.inputs: list[dict[str, Any]] = []
        self.outputs: list[dict[str, Any]] = []
        self.input_x, self.output_x = input_x, output_x

    def add_input(self, name: str, kind: str) -> int:
        """A boundary input; returns its slot."""
        self.inputs.append({"id": stable_uuid(self.name, "in", name), "name": name, "type": kind, "linkIds": []})
        return len(self.inputs) - 1

    def add_output(self, name: str, kind: str) -> int:
        """A boundary output; returns its slot."""
        self.outputs.append({"id": stable_uuid(self.name, "out", name), "name": name, "type": kind, "linkIds": []})
        return len(self.outputs) - 1

    def link_in(self, slot: int, dst: int, name: str) -> None:
        """Connect boundary input `slot` to input `name` of an inner node."""
        target, boundary = self.get(dst), self.inputs[slot]
        link_id = self.first_link + len(self.links) + 1
        entry = self._entry(target, name)
        if entry["type"] != boundary["type"]:
            raise ValueError(f"{self.name}: input {boundary['name']} is {boundary['type']}, "
                             f"{target['type']}.{name} takes {entry['type']}")
        entry["link"] = link_id
        boundary["linkIds"].append(link_id)
        self.links.append([link_id, SUBGRAPH_INPUT, slot, dst, target["inputs"].index(entry), boundary["type"]])

    def link_out(self, src: int, src_slot: int, slot: int) -> None:
        """Connect output `src_slot` of an inner node to boundary output `slot` (one link per output)."""
        source, boundary = self.get(src), self.outputs[slot]
        if boundary["linkIds"]:
            raise ValueError(f"{self.name}: output {boundary['name']} is already connected")
        link_id = self.first_link + len(self.links) + 1
        source["outputs"][src_slot]["links"].append(link_id)
        boundary["linkIds"].append(link_id)
        self.links.append([link_id, src, src_slot, SUBGRAPH_OUTPUT, slot, boundary["type"]])

    def widget_inputs(self) -> list[str]:
        """Names of the boundary inputs that feed a widget of an inner node (the instance shows them as widgets)."""
        targets = {link[0]: (link[3], link[4]) for link in self.links if link[1] == SUBGRAPH_INPUT}
        names = []
        for slot in self.inputs:
            for link_id in slot["linkIds"][:1]:
                node_id, index = targets[link_id]
                if "widget" in self.get(node_id)["inputs"][index]:
                    names.append(slot["name"])
        return names

    def definition(self) -> dict[str, Any]:
        """The entry of `definitions.subgraphs`."""
        def io_pos(x: int, i: int) -> list[int]:
            return [x + 100, 60 + 20 * i]

        links = [{"id": i, "origin_id": o, "origin_slot": os_, "target_id": t, "target_slot": ts, "type": k}
                 for i, o, os_, t, ts, k in self.links]
        return {
            "id": self.id, "version": 1,
            "state": {"lastGroupId": 0, "lastNodeId": self.first_id + len(self.nodes),
                      "lastLinkId": self.first_link + len(self.links), "lastRerouteId": 0},
            "revision": 0, "config": {}, "name": self.name,
            "inputNode": {"id": SUBGRAPH_INPUT, "bounding": [self.input_x, 40, 120, 40 + 20 * len(self.inputs)]},
            "outputNode": {"id": SUBGRAPH_OUTPUT, "bounding": [self.output_x, 40, 120, 40 + 20 * len(self.outputs)]},
            "inputs": [{**s, "localized_name": s["name"], "pos": io_pos(self.input_x, i)}
                       for i, s in enumerate(self.inputs)],
            "outputs": [{**s, "localized_name": s["name"], "pos": io_pos(self.output_x - 100, i)}
                        for i, s in enumerate(self.outputs)],
            "widgets": [], "groups": [], "nodes": self.nodes, "links": links, "extra": {}}

    def blueprint(self, widgets: list[Any]) -> dict[str, Any]:
        """A subgraph blueprint file: a workflow whose root graph is this subgraph's one node."""
        root = UIGraph(f"blueprint/{self.name}")
        node_id = root.subgraph_node(self, (0, 0), widgets)
        doc = root.to_json()
        assert doc["last_node_id"] == node_id and doc["last_link_id"] == 0
        return doc
