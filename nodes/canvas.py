"""What a CHAI node shows on the ComfyUI canvas after it runs: a one-line status and its report text.

The status goes to the node as ComfyUI's progress text (the frontend shows it on the node, no extension
needed) and leads the node's text UI output (kept in the history; the pack's web extension shows the whole
text on the node and marks a report that ComfyUI served from its output cache).
"""
from __future__ import annotations

import logging

from comfy_api.v0_0_2 import ui

from ..chai_attention.status import one_line

log = logging.getLogger(__name__)


def executing_node_id() -> str:
    """The id of the node ComfyUI is running (or fingerprinting) now; '?' outside an execution."""
    try:
        from comfy_execution.utils import get_executing_context
    except ImportError:
        return "?"
    context = get_executing_context()
    return str(context.node_id) if context is not None else "?"


def send_status(status: str) -> bool:
    """Show `status` on the running node (ComfyUI's progress text); False when there is no server to tell."""
    node_id = executing_node_id()
    try:
        from server import PromptServer
    except ImportError:
        return False
    server = getattr(PromptServer, "instance", None)
    send = getattr(server, "send_progress_text", None)
    if send is None or node_id == "?":
        return False
    try:
        send(status, node_id)
    except Exception as exc:  # a status is a courtesy: never fail a run over it
        log.debug("[CHAI] status not sent: %s", exc)
        return False
    return True


def show(status: str, report: str | None = None) -> ui.PreviewText:
    """Send the status (cut to one short line) and return the node's text UI output: the status, then the report."""
    status = one_line(status)
    send_status(status)
    return ui.PreviewText(status if not report else f"{status}\n{report}")
