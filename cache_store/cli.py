"""Command line over a cache folder or a cache on a PostgreSQL server: stats, list, prune, clear, verify, repair.

The server comes from --url, else $CHAI_CACHE_URL / $CHAI_CACHE_URL_FILE unless --root names a folder.
"""
from __future__ import annotations

import argparse
import sqlite3
import sys
from pathlib import Path

from .backend import CacheBackend
from .cli_checks import READ_ONLY, printable
from .config import StoreConfig, budget_from_gb
from .errors import CacheError
from .naming import cache_dir
from .open_store import check_store, fix_before_repair, open_store, verify_store
from .postgres.url import ServerURL, from_option, redact, resolve
from .service import default_root
from .types import VerifyReport


def build_parser() -> argparse.ArgumentParser:
    """The argument parser."""
    p = argparse.ArgumentParser(prog="python -m cache_store", description=__doc__)
    p.add_argument("--root", type=Path, default=None,
                   help="folder holding the caches (default: $CHAI_CACHE_DIR or ~/.cache/chai-cache; "
                        "inside ComfyUI: ComfyUI/models/chai_cache)")
    p.add_argument("--name", default="default", help="cache name (a folder under the root, or a cache on the server)")
    p.add_argument("--url", default=None,
                   help="postgresql://user@host:port/database of a farm's shared cache (default: $CHAI_CACHE_URL or "
                        "the URL in the file $CHAI_CACHE_URL_FILE, unless --root is given; 'local' forces the "
                        "folder). Keep the password out of the command line: PGPASSWORD, ~/.pgpass or the "
                        "variables")
    sub = p.add_subparsers(dest="command", required=True)
    sub.add_parser("stats", help="counts, sizes, budget, embedder")
    ls = sub.add_parser("list", help="entries, most recently used first")
    ls.add_argument("--limit", type=int, default=50)
    pr = sub.add_parser("prune", help="evict by policy until the latents fit the budget")
    pr.add_argument("--budget-gb", type=float, default=None,
                    help="set the cache's budget to this many GB first (it stays); default: keep the cache's own")
    cl = sub.add_parser("clear", help="delete every entry")
    cl.add_argument("--yes", action="store_true", help="confirm")
    sub.add_parser("verify", help="check manifest, every latent file and the index; read-only, changes nothing; "
                                  "exit status 1 when it lists problems")
    rp = sub.add_parser("repair", help="verify, then fix and report each action (rebuild a damaged manifest, drop "
                                       "entries whose files are bad, adopt or quarantine stray files, rebuild the "
                                       "index)")
    for cmd in (cl, rp):
        cmd.add_argument("--quarantine", action="store_true",
                         help="also empty the quarantine afterwards (default: keep it, it is evidence)")
    return p


def _server(args: argparse.Namespace) -> ServerURL | None:
    if args.url is not None:
        return from_option(args.url, "--url")
    return None if args.root is not None else resolve(None)


class Outcome(str):
    """A report and the exit status it calls for (1: verify listed problems)."""

    status = 0


def _problems(report: VerifyReport) -> Outcome:
    out = Outcome(report.report())
    out.status = 1 if report.problems else 0
    return out


def run(args: argparse.Namespace) -> str:
    """Execute one command and return its report (an Outcome with its exit status for verify)."""
    server = _server(args)
    root = args.root or default_root()
    location = cache_dir(root, args.name) if server is None else server
    if args.command in READ_ONLY:  # opening would create the typo'd cache
        check_store(location, name=args.name)
    if args.command == "verify":  # read-only: never opens the store (opening adopts and quarantines files)
        return _problems(verify_store(location, name=args.name))
    fixed = fix_before_repair(location) if args.command == "repair" else []
    with open_store(location, StoreConfig(), name=args.name, local_root=root) as store:
        if args.command == "stats":
            return store.stats().report()
        if args.command == "list":
            lines = [f"{'id':>6} {'MB':>7} {'hits':>5}  entities | prompt"]
            for e in store.entries(args.limit):
                lines.append(f"{e.id:>6} {e.nbytes / 1e6:7.2f} {e.hits:>5}  {printable(', '.join(e.entities))} | "
                             f"{printable(e.prompt)}")
            return "\n".join(lines)
        if args.command == "prune":
            budget = budget_from_gb(args.budget_gb) if args.budget_gb is not None else None
            evicted = store.prune(budget)
            return f"evicted {len(evicted)} entries\n" + store.stats().report()
        if args.command == "clear":
            if not args.yes:
                raise CacheError("clear deletes every entry of the cache: add --yes to confirm")
            return f"removed {store.clear()} entries" + _emptied(store, args)
        report = store.repair()
        report.repaired[:0] = fixed
        return report.report() + _emptied(store, args)


def _emptied(store: CacheBackend, args: argparse.Namespace) -> str:
    """Empty the quarantine when --quarantine asks for it, and say what went."""
    if not args.quarantine:
        return ""
    files, size = store.empty_quarantine()
    return f"\nemptied the quarantine: {files} file(s), {size / 1e6:.2f} MB"


def main(argv: list[str] | None = None) -> int:
    """Entry point; errors become one line on stderr and exit status 2."""
    args = build_parser().parse_args(argv)
    try:
        out = run(args)
        print(out)
    except (CacheError, ValueError, OSError, sqlite3.Error) as exc:
        print(f"error: {redact(str(exc))}", file=sys.stderr)
        return 2
    except Exception as exc:  # a bug, still one line: the cache folder is never left half-changed by the CLI
        print(f"error: unexpected {type(exc).__name__}: {redact(str(exc))} (please report this)", file=sys.stderr)
        return 3
    return getattr(out, "status", 0)
