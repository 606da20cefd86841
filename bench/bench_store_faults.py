"""Fault table for the cache store (issue 13): each scenario damages a filled cache, then counts what came back.

Run: .venv/bin/python bench/bench_store_faults.py [--tries N]
Columns: entries before the damage, entries after reopening, corrupted latents served (bit-for-bit check),
lost (intact entries neither back nor quarantined), quarantined files. Scenarios reuse tests/store_faults.py.
"""
from __future__ import annotations

import argparse
import random
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from store_faults import (check, corrupt_hnsw_index, craft_file, edit_manifest, fill,  # noqa: E402
                          kill_during_rebuild, killed_writer_then_wal_lost, lose_manifest)

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

    return {"manifest deleted": lost("deleted"), "manifest zero-length": lost("zero-length"),
            "manifest foreign SQLite": lost("foreign"), "manifest garbage": lost("garbage"),
            "writer killed, -wal lost": wal, "kill during rebuild": rebuild_kill,
            "3 malformed files + lost manifest": malformed, "zero vector in manifest": zero_vector,
            "crafted hnsw graph": crafted_graph, "format_version 'abc'": bad_version,
            "postings table dropped": dropped_postings}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tries", type=int, default=2)
    args = parser.parse_args()
    rng = random.Random(13)
    print(f"{'scenario':<36} {'tries':>5} {'before':>7} {'after':>6} {'corrupt':>8} {'lost':>5} {'quarant.':>8}")
    for name, damage in _scenarios().items():
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
              f"{totals[4]:>8}")


if __name__ == "__main__":
    main()
