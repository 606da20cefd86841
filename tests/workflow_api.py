"""A small UI-format -> API-format workflow converter for the node set of the shipped CHAI workflows.

ComfyUI's frontend does this conversion in TypeScript ("Export (API)"); this is our own, for tests. What it
handles: links (through Reroute nodes), `widgets_values` in the node's widget order (required inputs, then
optional ones, socket-only types skipped) including the frontend-only value that follows a
`control_after_generate` widget, widget inputs driven by a link, frontend PrimitiveNode values inlined into
their targets, and frontend-only nodes (Note, MarkdownNote, Reroute, PrimitiveNode) and muted nodes dropped.
Bypassed nodes are refused (nothing shipped uses them).

The widget order of each node type comes from a spec: {class_type: [[input name, has control value], ...]},
built from ComfyUI's INPUT_TYPES with `widget_layout` (tests/workflows/node_specs.json holds the one for our
workflows; a tier-2 test checks it against the live ComfyUI).
"""
from __future__ import annotations

from typing import Any, Mapping

WIDGET_TYPES = ("INT", "FLOAT", "STRING", "BOOLEAN", "COMBO")
FRONTEND_ONLY = ("Note", "MarkdownNote", "Reroute", "PrimitiveNode")
MUTED, BYPASSED = 2, 4


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


def ui_to_api(ui: Mapping[str, Any], specs: Mapping[str, list[list[Any]]]) -> dict[str, dict[str, Any]]:
    """The API-format prompt of a UI-format workflow."""
    nodes = {int(n["id"]): n for n in ui["nodes"]}
    links = _links(ui)

    def source(link_id: int) -> tuple[str, Any]:
        """("link", [node id, slot]) or ("value", primitive value) for a link, following Reroutes."""
        seen = set()
        while True:
            if link_id in seen:
                raise WorkflowError(f"link {link_id} loops through reroutes")
            seen.add(link_id)
            origin, slot, _, _ = links[link_id]
            node = nodes[origin]
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
            return "link", [str(origin), slot]

    api: dict[str, dict[str, Any]] = {}
    for node_id in sorted(nodes):
        node = nodes[node_id]
        kind = node["type"]
        if kind in FRONTEND_ONLY or node.get("mode", 0) == MUTED:
            continue
        if node.get("mode", 0) == BYPASSED:
            raise WorkflowError(f"node {node_id} ({kind}) is bypassed; the converter does not handle bypass")
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
            _, value = source(int(entry["link"]))
            inputs[entry["name"]] = value
        api[str(node_id)] = {"inputs": inputs, "class_type": kind, "_meta": {"title": node.get("title", kind)}}
    return api
