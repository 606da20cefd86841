"""Synthetic fill of a server cache for bench/bench_farm.py: 100k entries written with COPY, not insert().

insert() validates, encodes and commits one entry per transaction (~10 ms here); 100k of them would take most of
an hour on this 2-core machine, so the fill writes the same rows insert() writes (entries, their safetensors
blobs, entities with vectors, postings, the change log, the state counters) in bulk. Entities are synthetic
384-d unit vectors (clusters plus noise, MiniLM's dimension); each entry holds two of them.
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass

import numpy as np

DIM = 384
EMBEDDER = "bench-synthetic-384@1"
FINGERPRINT = "bench:farm"
SHAPE = (1, 4, 2, 4, 4)
SIGMAS = (0.9, 0.7, 0.5)


@dataclass
class Fill:
    """What the fill wrote."""

    entries: int
    entities: int
    total_bytes: int
    vectors: np.ndarray   # (entities, DIM): entity id k+1 has vectors[k]
    holders: np.ndarray   # (entries, 2): entity ids of entry i+1
    seconds: float


def synthetic_vectors(n: int, seed: int = 0, clusters: int = 2000) -> np.ndarray:
    """Unit vectors around `clusters` centres (nearest neighbours are close, as for real phrases)."""
    rng = np.random.default_rng(seed)
    centres = rng.standard_normal((clusters, DIM)).astype(np.float32)
    v = centres[rng.integers(0, clusters, n)] + 0.6 * rng.standard_normal((n, DIM)).astype(np.float32)
    return v / np.linalg.norm(v, axis=1, keepdims=True)


def fill(db, n_entries: int, n_entities: int, seed: int = 0, log=print) -> Fill:
    """Write n_entries synthetic entries into the (empty) cache behind `db` (a PgDb)."""
    import torch

    from comfyui_chai.cache_store import latents as lat
    from comfyui_chai.cache_store.types import shape_key

    t0 = time.perf_counter()
    rng = np.random.default_rng(seed)
    vectors = synthetic_vectors(n_entities, seed)
    holders = np.stack([np.arange(n_entries) % n_entities + 1, rng.integers(1, n_entities + 1, n_entries)], 1)
    holders[holders[:, 0] == holders[:, 1], 1] = holders[holders[:, 0] == holders[:, 1], 1] % n_entities + 1
    tensors = {f"x_t_{k}": torch.zeros(SHAPE) for k in range(3)}
    key, now, total = shape_key(SHAPE), time.time(), 0
    with db.write() as cur:
        cur.execute("SELECT COUNT(*) FROM entries")
        if cur.fetchone()[0]:
            raise SystemExit("the bench's fill needs an empty cache")
        cur.execute("INSERT INTO groups (fingerprint, shape) VALUES (%s, %s) RETURNING id", (FINGERPRINT, key))
        group = cur.fetchone()[0]
        with cur.copy("COPY entities (id, text, kind, vector, head, core) FROM STDIN") as copy:
            for k in range(n_entities):
                copy.write_row((k + 1, f"ent{k + 1}", "object", vectors[k].tobytes(), f"ent{k + 1}", ""))
        log(f"  {n_entities} entities copied; encoding and copying {n_entries} entries")
        for start in range(0, n_entries, 5000):
            rows, data_rows, posting_rows = [], [], []
            for i in range(start, min(start + 5000, n_entries)):
                ids = [int(x) for x in holders[i]]
                payload = {"prompt": f"synthetic {i + 1}", "fingerprint": FINGERPRINT, "shape": list(SHAPE),
                           "dtype": "float32", "sigmas": list(SIGMAS), "embedder": EMBEDDER,
                           "entities": [{"text": f"ent{e}", "kind": "object", "role": "main", "head": f"ent{e}",
                                         "core": ""} for e in ids], "extra": {}}
                data = lat.encode_entry(tensors, vectors[[e - 1 for e in ids]], payload)
                total += len(data)
                rows.append((i + 1, f"synthetic {i + 1}", FINGERPRINT, key, "float32", len(data),
                             lat.checksum(data), json.dumps(list(SIGMAS)), json.dumps(sorted(tensors)), "{}", now,
                             now, i + 1, 0, group))
                data_rows.append((i + 1, data))
                posting_rows += [(group, e, i + 1, "main") for e in ids]
            with cur.copy("COPY entries (id, prompt, fingerprint, shape, dtype, nbytes, checksum, sigmas, "
                          "tensors, meta, created, last_used, use_tick, hits, group_id) FROM STDIN") as copy:
                for row in rows:
                    copy.write_row(row)
            with cur.copy("COPY blobs (entry_id, data) FROM STDIN") as copy:
                for row in data_rows:
                    copy.write_row(row)
            with cur.copy("COPY postings (group_id, entity_id, entry_id, role) FROM STDIN") as copy:
                for row in posting_rows:
                    copy.write_row(row)
        with cur.copy("COPY index_log (seq, entity_id, op) FROM STDIN") as copy:
            for k in range(n_entities):
                copy.write_row((k + 1, k + 1, "add"))
        for seq, value in (("entries", n_entries), ("entities", n_entities)):
            cur.execute("SELECT setval(pg_get_serial_sequence(%s, 'id'), %s)", (seq, value))
        cur.execute("SELECT setval('ticks', %s)", (n_entries,))
        cur.execute("UPDATE state SET embedder = %s, dim = %s, total_bytes = %s, generation = generation + 1, "
                    "log_seq = %s, budget_bytes = GREATEST(budget_bytes, %s)",
                    (EMBEDDER, DIM, total, n_entities, total))
    return Fill(n_entries, n_entities, total, vectors, holders, time.perf_counter() - t0)
