"""Nodes that open a named CHAI cache and inspect, prune or clear it."""
from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from comfy_api.v0_0_2 import io

from ..cache_store import CacheUnavailableError, budget_from_gb
from ..cache_store.naming import validate_cache_name
from ..cache_store.service import ChaiCache, open_cache
from .canvas import executing_node_id, show
from .errors import ChaiNodeError, user_errors
from .paths import cache_root
from .sockets import CATEGORY, CHAI_CACHE
from .widgets import combo

log = logging.getLogger(__name__)

POLICIES = ["lru", "lfu"]
EMBEDDERS = ["minilm"]
ACTION_SHOW = "show"
ACTION_PRUNE = "prune to budget"
ACTION_CLEAR = "clear"
ACTIONS = [ACTION_SHOW, ACTION_PRUNE, ACTION_CLEAR]
RECENT_ENTRIES = 10


class CacheOpen(io.ComfyNode):
    """Open (or create) a named cache folder under ComfyUI's `chai_cache` models folder."""

    @classmethod
    def define_schema(cls) -> io.Schema:
        return io.Schema(
            node_id="CHAI_CacheOpen",
            display_name="CHAI Cache",
            category=CATEGORY,
            description="Opens a named CHAI cache of earlier generations (created on first use) under "
                        "models/chai_cache or the chai_cache path of extra_model_paths.yaml.",
            inputs=[
                io.String.Input(
                    "name", default="default",
                    tooltip="Folder name of the cache: 1-64 letters, digits, '.', '_' or '-'. Use one cache per "
                            "model family (e.g. 'wan21'); 'default' is fine for a single model."),
                io.Float.Input(
                    "budget_gb", default=2.0, min=0.01, max=10000.0, step=0.1, round=0.01,
                    tooltip="Disk budget for cached latents in GB; the least useful entries are evicted beyond "
                            "it. An entry is about 1-2 MB at 240p, so 2 GB holds roughly a thousand generations. "
                            "The budget belongs to the cache: running this node sets it for every process."),
                combo(
                    "policy", options=POLICIES, default="lru",
                    tooltip="Which entries to evict when the budget is full. 'lru' (least recently used, the "
                            "paper's choice) suits most prompt streams; 'lfu' keeps the most often hit entries."),
                combo(
                    "embedder", options=EMBEDDERS, default="minilm",
                    tooltip="How entity phrases are compared. 'minilm' (all-MiniLM-L6-v2, CPU, a few ms per "
                            "prompt) is the calibrated default. A cache keeps the embedder it was built with."),
                io.String.Input(
                    "server", optional=True, force_input=True,
                    tooltip="Optional: where the cache lives. Unconnected or empty: the server in the worker's "
                            "CHAI_CACHE_URL (or the file CHAI_CACHE_URL_FILE) if set, else the local folder. "
                            "'postgresql://user@host:5432/db': a render farm's shared cache on PostgreSQL "
                            "(the password comes from CHAI_CACHE_URL, PGPASSWORD or ~/.pgpass, never from the "
                            "workflow). 'local': the local folder even when CHAI_CACHE_URL is set."),
            ],
            outputs=[CHAI_CACHE.Output(
                "cache", display_name="cache",
                tooltip="The opened cache; connect it to the CHAI lookup, write and stats nodes.")],
        )

    @classmethod
    def validate_inputs(cls, name: str | None = None) -> bool | str:
        """Reject an unsafe cache name before anything runs (a linked name is checked at run time)."""
        # Only `name` is taken: ComfyUI repeats a failure message under every input named here.
        if name is None:
            return True
        try:
            validate_cache_name(name)
        except ValueError as exc:
            return str(exc)
        return True

    @classmethod
    def execute(cls, name: str, budget_gb: float, policy: str, embedder: str,
                server: str | None = None) -> io.NodeOutput:
        # Validation checks widget values (ListedCombo); a value that arrives through a link is checked here.
        if policy not in POLICIES:
            raise ChaiNodeError(f"CHAI Cache: unknown eviction policy {policy!r}; choose one of "
                                f"{', '.join(POLICIES)}")
        if embedder not in EMBEDDERS:
            raise ChaiNodeError(f"CHAI Cache: unknown embedder {embedder!r}; choose one of {', '.join(EMBEDDERS)}")
        with user_errors("CHAI Cache"):
            root = cache_root()
            # The handle belongs to this node: re-running it (new budget) replaces only its own handle. The
            # budget widget is an explicit setting: opening stores it as the cache's budget (logged if changed).
            cache = open_cache(root, name, budget_bytes=budget_from_gb(budget_gb), policy=policy,
                               embedder=embedder, owner=f"CHAI_CacheOpen:{executing_node_id()}", server=server)
        log.info("[CHAI] cache %r open at %s (budget %.2f GB, %s)", name, cache.root, budget_gb, policy)
        shared = f" · shared on {cache.server.label}" if cache.server is not None else ""
        return io.NodeOutput(cache, ui=show(f"cache '{name}' open · budget {budget_gb:g} GB · {policy}{shared}"))


class CacheStats(io.ComfyNode):
    """Report a cache's size and recent entries; optionally prune it to its budget or clear it."""

    @classmethod
    def define_schema(cls) -> io.Schema:
        return io.Schema(
            node_id="CHAI_CacheStats",
            display_name="CHAI Cache Stats",
            category=CATEGORY,
            description="Shows what a CHAI cache holds; can also prune it to its budget or clear it.",
            inputs=[
                CHAI_CACHE.Input("cache", tooltip="The cache to inspect, from a CHAI Cache node."),
                combo(
                    "action", options=ACTIONS, default=ACTION_SHOW,
                    tooltip="'show' only reports (safe to leave in a workflow). 'prune to budget' evicts until "
                            "the cache fits its budget (after lowering budget_gb). 'clear' deletes every entry: "
                            "queue it once, then switch back to 'show'."),
                io.String.Input(
                    "after", optional=True, force_input=True,
                    tooltip="Optional: connect CHAI Cache Write's report here so the stats are taken after the "
                            "write (ComfyUI runs a node only after the nodes it is linked to). With a prompt list "
                            "the stats run once, after every write."),
            ],
            outputs=[io.String.Output("report", display_name="report",
                                      tooltip="Entry count, bytes against the budget and the most recent entries.")],
            is_output_node=True,
            # Lists in, one run: after a prompt list's writes the stats are taken once, not once per prompt.
            is_input_list=True,
        )

    @classmethod
    def fingerprint_inputs(cls, **kwargs: Any) -> float:
        """Always re-run: ComfyUI passes only widget values here, not the linked cache, and the store changes
        (writes, hits, other processes) without any widget changing."""
        # A new NaN object per call: ComfyUI's cache keys are containers, and container equality takes the
        # one shared math.nan object as equal to itself, so returning math.nan would look unchanged.
        return float("nan")

    @classmethod
    def execute(cls, cache: list[ChaiCache], action: list[str], after: list | None = None) -> io.NodeOutput:
        # is_input_list: every input arrives as a list; the cache and action are the first (only) ones.
        handle, chosen = cache[0], action[0]
        if chosen not in ACTIONS:
            raise ChaiNodeError(f"CHAI Cache Stats: unknown action {chosen!r}; choose one of "
                                f"{', '.join(ACTIONS)}")
        with user_errors("CHAI Cache Stats"):
            store = handle.store
            lines = []
            try:
                if chosen == ACTION_CLEAR:
                    lines.append(f"cleared {store.clear()} entries")
                elif chosen == ACTION_PRUNE:
                    lines.append(f"pruned {len(store.prune())} entries to fit the budget")
                stats = store.stats()
                entries = store.entries(RECENT_ENTRIES) if stats.entries else []
            except CacheUnavailableError as exc:  # a farm's server restarting: say so, do not fail the run
                report = f"CHAI cache: {exc}"
                log.warning("[CHAI] cache stats: %s", exc)
                return io.NodeOutput(report, ui=show("cache server unreachable", report))
        report = format_report(Path(stats.root).name, stats.report(), lines, entries, stats.entries)
        log.info("[CHAI] cache %r: %s, %d entries", Path(stats.root).name, chosen, stats.entries)
        status = " · ".join([*lines, f"{stats.entries} entries", f"{stats.bytes / 1e6:.1f} of "
                             f"{stats.budget_bytes / 1e6:.0f} MB"])
        return io.NodeOutput(report, ui=show(status, report))


def format_report(name: str, stats_report: str, actions: list[str], entries: list[Any], total: int) -> str:
    """The stats node's text: header, what the action did, store summary, most recent entries."""
    lines = [f"CHAI cache '{name}'", *actions, stats_report]
    if entries:
        lines.append(f"most recent {len(entries)} of {total} entries:")
        for e in entries:
            prompt = e.prompt if len(e.prompt) <= 80 else e.prompt[:77] + "..."
            lines.append(f"  #{e.id} hits {e.hits}, {e.nbytes / 1e6:.2f} MB, entities "
                         f"[{', '.join(e.entities)}]: {prompt!r}")
    return "\n".join(lines)


NODES = [CacheOpen, CacheStats]
