"""Fault table for the cache store (issue 13): each scenario damages a filled cache, then counts what came back.

Run: .venv/bin/python bench/bench_store_faults.py [--tries N] [--only WORD] [--no-server]
Columns: entries before the damage, entries after reopening, corrupted latents served (bit-for-bit check),
lost (intact entries neither back nor quarantined), quarantined files. Scenarios reuse tests/store_faults.py.
A FIFO scenario (issue 23) first runs open, lookups, verify and repair in a child process that is killed after
60 s: "hung" counts the tries it had to be killed (the rest of the row is then the untouched cache).

With PostgreSQL installed (tests/pg_server.py), a second table covers a cache on a throwaway server
(tests/pg_faults.py): a schema restored from a backup under a live (or reopened) worker, counting lookups
answered with another subject's entry; and the server frozen (SIGSTOP) while connected, with the seconds a
lookup and a write took to come back as a miss / "not stored" (limit StoreConfig.server_timeout_s = 2 s).
"""
from __future__ import annotations

import argparse
import os
import random
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from store_faults import (check, corrupt_hnsw_index, craft_file, edit_manifest, fill,  # noqa: E402
                          kill_during_rebuild, killed_writer_then_wal_lost, lose_manifest)
from store_helpers import PYTHON, subprocess_env  # noqa: E402

HANG_S = 60
_OPEN_AND_REPAIR = """
import sys
from comfyui_chai.cache_store.folder.maintenance import verify_folder
from comfyui_chai.cache_store.folder.store import CacheStore
from comfyui_chai.cache_store.lookup.rule import HitRule
from store_helpers import ents
verify_folder(sys.argv[1])
with CacheStore(sys.argv[1]) as s:
    for i in range(int(sys.argv[2])):
        s.lookup(ents(f"thing{i}"), "model-a", (1, 4, 2, 4, 4), HitRule(0.8))
    s.verify()
    s.repair()
"""

N = 10


def _scenarios():
    """name -> damage(tmp, root, rng) returning (entries before, intact entries expected back)."""
    def lost(how):
        return lambda tmp, root, rng: (lose_manifest(root, how), (N, N))[1]

    def wal(tmp, root, rng):
        killed_writer_then_wal_lost(tmp, root, start=N)
        return N + 5, N + 5

    def rebuild_kill(tmp, root, rng):
        lose_manifest(root, "deleted")
        kill_during_rebuild(tmp, root, rng.uniform(0.5, 3.0))
        return N, N

    def malformed(tmp, root, rng):
        craft_file(root / "latents" / f"{1:032x}.safetensors", 101, meta_edit={"entities": "dog"})
        craft_file(root / "latents" / f"{2:032x}.safetensors", 102, drop_vectors=True)
        craft_file(root / "latents" / f"{3:032x}.safetensors", 103, meta_edit={"shape": [1, 4, 1, 4, 4]},
                   tensor_shape=(1, 4, 3, 4, 4))
        lose_manifest(root, "deleted")
        return N + 3, N

    def zero_vector(tmp, root, rng):
        edit_manifest(root, f"UPDATE entities SET vector=X'{'00' * 128}' WHERE text='thing1'")
        return N, N

    def crafted_graph(tmp, root, rng):
        import json

        state = json.loads((root / "index" / "state.json").read_text())
        corrupt_hnsw_index(root / "index" / state["file"])
        return N, N

    def bad_version(tmp, root, rng):
        edit_manifest(root, "UPDATE meta SET value='abc' WHERE key='format_version'")
        return N, N

    def dropped_postings(tmp, root, rng):
        edit_manifest(root, "DROP TABLE postings")
        return N, N

    def fifo(where):
        def damage(tmp, root, rng):
            if where == "latent":
                victim = sorted((root / "latents").iterdir())[rng.randrange(N)]
            elif where == "manifest":
                victim = root / "manifest.sqlite"
            else:
                victim = root / "index" / "state.json"
            victim.unlink()
            os.mkfifo(victim)
            try:
                subprocess.run([PYTHON, "-c", _OPEN_AND_REPAIR, str(root), str(N)], env=subprocess_env(),
                               capture_output=True, timeout=HANG_S)
            except subprocess.TimeoutExpired:
                HUNG.append(where)
                victim.unlink()  # free the cache so the rest of the row can be counted
            return N, N - 1 if where == "latent" else N
        return damage

    return {"manifest deleted": lost("deleted"), "manifest zero-length": lost("zero-length"),
            "manifest foreign SQLite": lost("foreign"), "manifest garbage": lost("garbage"),
            "writer killed, -wal lost": wal, "kill during rebuild": rebuild_kill,
            "3 malformed files + lost manifest": malformed, "zero vector in manifest": zero_vector,
            "crafted hnsw graph": crafted_graph, "format_version 'abc'": bad_version,
            "postings table dropped": dropped_postings, "FIFO for a latent file": fifo("latent"),
            "FIFO for the manifest": fifo("manifest"), "FIFO for the index state": fifo("index")}


HUNG: list[str] = []


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tries", type=int, default=2)
    parser.add_argument("--only", default="", help="run only the scenarios whose name contains this word")
    parser.add_argument("--no-server", action="store_true", help="skip the PostgreSQL table")
    args = parser.parse_args()
    rng = random.Random(13)
    print(f"{'scenario':<36} {'tries':>5} {'before':>7} {'after':>6} {'corrupt':>8} {'lost':>5} {'quarant.':>8} "
          f"{'hung':>5}")
    for name, damage in _scenarios().items():
        if args.only.lower() not in name.lower():
            continue
        HUNG.clear()
        totals = [0, 0, 0, 0, 0]
        for _ in range(args.tries):
            with tempfile.TemporaryDirectory() as tmp:
                root = Path(tmp) / "c"
                fill(root, N, index_kwargs={"backend": "hnsw"} if "hnsw" in name else {})
                before, expected = damage(Path(tmp), root, rng)
                out = check(root, before)
                lost = max(0, expected - out.entries)
                for i, v in enumerate((before, out.entries, out.corrupted_served, lost, out.quarantined)):
                    totals[i] += v
        print(f"{name:<36} {args.tries:>5} {totals[0]:>7} {totals[1]:>6} {totals[2]:>8} {totals[3]:>5} "
              f"{totals[4]:>8} {len(HUNG):>5}", flush=True)
    if args.only.lower() in "verify while a writer inserts":
        verify_under_writes(20 * args.tries)
    if not args.no_server:
        server_table(args.tries, args.only)


_WRITER = """
import sys
from comfyui_chai.cache_store.folder.store import CacheStore
from store_helpers import SIGMAS, ents, latents
with CacheStore(sys.argv[1]) as s:
    for i in range(1, 10**6):
        s.insert(f"seed={i}", ents(f"thing{i}", "dog"), "model-a", latents(i), SIGMAS)
"""


def verify_under_writes(runs: int) -> None:
    """verify runs while another process inserts: how many list a problem (every one would be a phantom)."""
    import time

    from comfyui_chai.cache_store.folder.maintenance import verify_folder

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "c"
        fill(root, 1)
        writer = subprocess.Popen([PYTHON, "-c", _WRITER, str(root)], env=subprocess_env())
        try:
            while len(list((root / "latents").iterdir())) < 4 and writer.poll() is None:
                time.sleep(0.05)
            listed = [bool(verify_folder(root).problems) for _ in range(runs)]
            inserted = len(list((root / "latents").iterdir()))
        finally:
            writer.kill()
            writer.wait()
    print(f"\n{'verify while a writer inserts':<36} {'runs':>5} {'listing problems':>17} {'entries at the end':>19}")
    print(f"{'':<36} {runs:>5} {sum(listed):>17} {inserted:>19}", flush=True)


def server_table(tries: int, only: str) -> None:
    """The PostgreSQL scenarios (skipped with a note when no server can be started here)."""
    from pg_server import CHAI_PASSWORD, PgServer, find_binaries

    if find_binaries() is None:
        print("\n(PostgreSQL scenarios skipped: no initdb/pg_ctl; apt-get install postgresql)")
        return
    from comfyui_chai.cache_store.postgres.url import ServerURL
    from pg_faults import frozen_while_connected, restored_under_a_worker

    server = PgServer.start()
    try:
        url = ServerURL(server.url("chai", password=CHAI_PASSWORD), "CHAI_CACHE_URL")
        header = f"\n{'server scenario':<36} {'tries':>5} {'asked':>7} {'right':>6} {'other subject':>14} {'missed':>7}"
        for label, reopen in (("schema restored, live worker", False), ("schema restored, worker reopened", True)):
            if only.lower() not in label.lower():
                continue
            if header:
                print(header, flush=True)
            header = ""
            totals = {"asked": 0, "right": 0, "wrong": 0, "missed": 0}
            for _ in range(tries):
                with tempfile.TemporaryDirectory() as tmp:
                    for k, v in restored_under_a_worker(server, url, Path(tmp), reopen).items():
                        totals[k] += v
            print(f"{label:<36} {tries:>5} {totals['asked']:>7} {totals['right']:>6} {totals['wrong']:>14} "
                  f"{totals['missed']:>7}", flush=True)
        if only.lower() in "server frozen while connected":
            print(f"\n{'server scenario':<36} {'tries':>5} {'lookups':>7} {'misses':>6} {'max lookup s':>12} "
                  f"{'not stored':>10} {'max write s':>11} {'hit after':>9}")
            rows = []
            for _ in range(tries):
                with tempfile.TemporaryDirectory() as tmp:
                    rows.append(frozen_while_connected(server, url, Path(tmp), timeout_s=2.0))
            print(f"{'server frozen while connected':<36} {tries:>5} {sum(r['lookups'] for r in rows):>7} "
                  f"{sum(r['misses'] for r in rows):>6} {max(r['max_s'] for r in rows):>12.1f} "
                  f"{sum(r['not_stored'] for r in rows):>10} {max(r['write_s'] for r in rows):>11.1f} "
                  f"{sum(r['hit_after'] for r in rows):>9}", flush=True)
    finally:
        server.destroy()


if __name__ == "__main__":
    main()
