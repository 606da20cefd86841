"""Command line over a cache folder: stats, list, prune, clear, verify, repair."""
from __future__ import annotations

import argparse
import sqlite3
import sys
from pathlib import Path

from .config import StoreConfig, budget_from_gb
from .errors import CacheError
from .manifest import MANIFEST_NAME
from .naming import cache_dir
from .service import default_root
from .store import CacheStore

DEFAULT_BUDGET_GB = 2.0


def saved_config(folder: Path) -> StoreConfig | None:
    """The budget and policy a cache was last opened with, if it exists."""
    path = folder / MANIFEST_NAME
    if not path.exists():
        return None
    try:
        con = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=30)
        try:
            meta = dict(con.execute("SELECT key, value FROM meta WHERE key IN ('budget_bytes', 'policy')"))
        finally:
            con.close()
        return StoreConfig(int(meta["budget_bytes"]), meta.get("policy", "lru"))
    except (sqlite3.Error, KeyError, ValueError):
        return None


def build_parser() -> argparse.ArgumentParser:
    """The argument parser."""
    p = argparse.ArgumentParser(prog="python -m cache_store", description=__doc__)
    p.add_argument("--root", type=Path, default=None,
                   help="folder holding the caches (default: $CHAI_CACHE_DIR or ~/.cache/chai-cache; "
                        "inside ComfyUI: ComfyUI/models/chai_cache)")
    p.add_argument("--name", default="default", help="cache name (a folder under the root)")
    sub = p.add_subparsers(dest="command", required=True)
    sub.add_parser("stats", help="counts, sizes, budget, embedder")
    ls = sub.add_parser("list", help="entries, most recently used first")
    ls.add_argument("--limit", type=int, default=50)
    pr = sub.add_parser("prune", help="evict by policy until the latents fit the budget")
    pr.add_argument("--budget-gb", type=float, default=None, help="target budget (default: the cache's own)")
    cl = sub.add_parser("clear", help="delete every entry")
    cl.add_argument("--yes", action="store_true", help="confirm")
    sub.add_parser("verify", help="check checksums, orphans and the index; change nothing")
    sub.add_parser("repair", help="verify and fix what can be fixed (drop damaged entries, rebuild the index)")
    return p


def run(args: argparse.Namespace) -> str:
    """Execute one command and return its report."""
    folder = cache_dir(args.root or default_root(), args.name)
    config = saved_config(folder) or StoreConfig(budget_from_gb(DEFAULT_BUDGET_GB))
    with CacheStore(folder, config) as store:
        if args.command == "stats":
            return store.stats().report()
        if args.command == "list":
            lines = [f"{'id':>6} {'MB':>7} {'hits':>5}  entities | prompt"]
            for e in store.entries(args.limit):
                lines.append(f"{e.id:>6} {e.nbytes / 1e6:7.2f} {e.hits:>5}  {', '.join(e.entities)} | {e.prompt}")
            return "\n".join(lines)
        if args.command == "prune":
            budget = budget_from_gb(args.budget_gb) if args.budget_gb is not None else None
            evicted = store.prune(budget)
            return f"evicted {len(evicted)} entries\n" + store.stats().report()
        if args.command == "clear":
            if not args.yes:
                raise CacheError("clear deletes every entry of the cache: add --yes to confirm")
            return f"removed {store.clear()} entries"
        if args.command == "verify":
            return store.verify().report()
        return store.repair().report()


def main(argv: list[str] | None = None) -> int:
    """Entry point; errors become one line on stderr and exit status 2."""
    args = build_parser().parse_args(argv)
    try:
        print(run(args))
    except (CacheError, ValueError, OSError, sqlite3.Error) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0
