"""A small UI-format -> API-format workflow converter for the node set of the shipped CHAI workflows.

ComfyUI's frontend does this conversion in TypeScript ("Export (API)"); this is our own, for tests. What it
handles: links (through Reroute nodes), `widgets_values` in the node's widget order (required inputs, then
optional ones, socket-only types skipped) including the frontend-only value that follows a
`control_after_generate` widget, widget inputs driven by a link, frontend PrimitiveNode values inlined into
their targets, and frontend-only nodes (Note, MarkdownNote, Reroute, PrimitiveNode) and muted nodes dropped.
Bypassed nodes are refused (nothing shipped uses them). Subgraphs (`definitions.subgraphs`, frontend 1.27.10's
layout) are expanded as the frontend expands them: an inner node's id is `<instance id>:<inner id>`, a link from the
subgraph's input node (-10) takes what feeds the instance's input of that slot (or, unlinked, the instance's widget
value), and a link from an instance's output takes what feeds the subgraph's output node (-20) at that slot.

The widget order of each node type comes from a spec: {class_type: [[input name, has control value], ...]},
built from ComfyUI's INPUT_TYPES with `widget_layout` (tests/workflows/node_specs.json holds the one for our
workflows; a tier-2 test checks it against the live ComfyUI).
"""
from __future__ import annotations

from typing import Any, Mapping

WIDGET_TYPES = ("INT", "FLOAT", "STRING", "BOOLEAN", "COMBO")
FRONTEND_ONLY = ("Note", "MarkdownNote", "Reroute", "PrimitiveNode")
MUTED, BYPASSED = 2, 4
SUBGRAPH_INPUT, SUBGRAPH_OUTPUT = -10, -20  # the ids of a subgraph's boundary nodes


def widget_layout(input_types: Mapping[str, Any]) -> list[list[Any]]:
    """[[name, has control_after_generate value], ...] for a node's INPUT_TYPES() dict, in widgets_values order."""
    layout = []
    for section in ("required", "optional"):
        for name, spec in (input_types.get(section) or {}).items():
            kind = spec[0]
            options = spec[1] if len(spec) > 1 and isinstance(spec[1], Mapping) else {}
            if not (isinstance(kind, (list, tuple)) or kind in WIDGET_TYPES) or options.get("forceInput"):
                continue
            layout.append([name, bool(options.get("control_after_generate"))])
    return layout


class WorkflowError(ValueError):
    """The UI workflow uses something this converter does not handle, or is inconsistent."""


def _links(ui: Mapping[str, Any]) -> dict[int, tuple[int, int, int, int]]:
    """link id -> (from node, from slot, to node, to slot)."""
    out = {}
    for link in ui.get("links", []):
        if isinstance(link, Mapping):
            out[int(link["id"])] = (int(link["origin_id"]), int(link["origin_slot"]), int(link["target_id"]),
                                    int(link["target_slot"]))
        else:
            out[int(link[0])] = (int(link[1]), int(link[2]), int(link[3]), int(link[4]))
    return out


class _Graph:
    """One graph being expanded: the root, or a subgraph reached through an instance node (`via`)."""

    def __init__(self, doc: Mapping[str, Any], subgraphs: Mapping[str, Mapping[str, Any]], path: tuple[str, ...] = (),
                 via: tuple[_Graph, Mapping[str, Any]] | None = None) -> None:
        self.nodes = {int(n["id"]): n for n in doc["nodes"]}
        self.links = _links(doc)
        self.doc, self.subgraphs, self.path, self.via = doc, subgraphs, path, via

    def api_id(self, node_id: int) -> str:
        return ":".join((*self.path, str(node_id)))

    def inner(self, instance: Mapping[str, Any]) -> _Graph:
        """The graph of a subgraph instance node of this graph."""
        if len(self.path) > 8:
            raise WorkflowError("subgraphs nested more than 8 deep")
        return _Graph(self.subgraphs[instance["type"]], self.subgraphs, (*self.path, str(instance["id"])),
                      (self, instance))


def widget_inputs(definition: Mapping[str, Any]) -> list[str]:
    """Names of a subgraph's inputs that feed a widget inside it: the instance node shows them as widgets."""
    links = _links(definition)
    nodes = {int(n["id"]): n for n in definition["nodes"]}
    names = []
    for slot in definition.get("inputs") or []:
        for link_id in slot.get("linkIds") or []:
            _, _, target, index = links[int(link_id)]
            if "widget" in nodes[target]["inputs"][index]:
                names.append(slot["name"])
                break
    return names


def _source(graph: _Graph, link_id: int) -> tuple[str, Any]:
    """("link", [api id, slot]), ("value", value) or ("none", None) for what feeds a link, through reroutes and
    subgraphs."""
    seen = set()
    while True:
        if (graph.path, link_id) in seen:
            raise WorkflowError(f"link {link_id} loops")
        seen.add((graph.path, link_id))
        if link_id not in graph.links:
            raise WorkflowError(f"link {link_id} is not in the graph {':'.join(graph.path) or 'root'}")
        origin, slot, _, _ = graph.links[link_id]
        if origin == SUBGRAPH_INPUT:
            if graph.via is None:
                raise WorkflowError(f"link {link_id} starts at a subgraph input outside a subgraph")
            parent, instance = graph.via
            entry = instance["inputs"][slot]
            if entry.get("link") is None:
                names = widget_inputs(graph.doc)
                if entry["name"] not in names:  # an unconnected socket: the inner input stays unset
                    return "none", None
                return "value", instance["widgets_values"][names.index(entry["name"])]
            graph, link_id = parent, int(entry["link"])
            continue
        node = graph.nodes[origin]
        if node["type"] in graph.subgraphs:
            inner = graph.inner(node)
            outputs = inner.doc.get("outputs") or []
            ids = outputs[slot].get("linkIds") if slot < len(outputs) else None
            if not ids:
                raise WorkflowError(f"output {slot} of subgraph node {origin} is not connected inside")
            graph, link_id = inner, int(ids[0])
            continue
        if node["type"] == "Reroute":
            upstream = (node.get("inputs") or [{}])[0].get("link")
            if upstream is None:
                raise WorkflowError(f"reroute {origin} has no input")
            link_id = int(upstream)
            continue
        if node["type"] == "PrimitiveNode":
            return "value", node["widgets_values"][0]
        if node.get("mode", 0) == MUTED:
            raise WorkflowError(f"node {origin} is muted but feeds another node")
        return "link", [graph.api_id(origin), slot]


def _expand(graph: _Graph, specs: Mapping[str, list[list[Any]]], api: dict[str, dict[str, Any]]) -> None:
    """Add the API entries of a graph's nodes, subgraph instances expanded in place."""
    for node_id in sorted(graph.nodes):
        node = graph.nodes[node_id]
        kind = node["type"]
        if kind in FRONTEND_ONLY or node.get("mode", 0) == MUTED:
            continue
        if node.get("mode", 0) == BYPASSED:
            raise WorkflowError(f"node {node_id} ({kind}) is bypassed; the converter does not handle bypass")
        if kind in graph.subgraphs:
            _expand(graph.inner(node), specs, api)
            continue
        if kind not in specs:
            raise WorkflowError(f"no widget spec for node type {kind!r}")
        inputs: dict[str, Any] = {}
        values = list(node.get("widgets_values") or [])
        at = 0
        for name, control in specs[kind]:
            if at >= len(values):
                raise WorkflowError(f"node {node_id} ({kind}) has {len(values)} widget values; {name!r} is missing")
            inputs[name] = values[at]
            at += 2 if control else 1
        if at != len(values):
            raise WorkflowError(f"node {node_id} ({kind}) has {len(values)} widget values, its widgets take {at}")
        for entry in node.get("inputs") or []:
            if entry.get("link") is None:
                continue
            how, value = _source(graph, int(entry["link"]))
            if how != "none":
                inputs[entry["name"]] = value
        api[graph.api_id(node_id)] = {"inputs": inputs, "class_type": kind, "_meta": {"title": node.get("title", kind)}}


def ui_to_api(ui: Mapping[str, Any], specs: Mapping[str, list[list[Any]]]) -> dict[str, dict[str, Any]]:
    """The API-format prompt of a UI-format workflow."""
    subgraphs = {s["id"]: s for s in (ui.get("definitions") or {}).get("subgraphs") or []}
    api: dict[str, dict[str, Any]] = {}
    _expand(_Graph(ui, subgraphs), specs, api)
    return api
