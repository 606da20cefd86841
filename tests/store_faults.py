"""Fault injection on a cache folder, shared by tests/test_store_faults.py and bench/bench_store_faults.py.

Each scenario damages a filled cache the way an attack on issue 13 did; `check` then opens it and counts what
came back. Entry i holds latents(seed=i) and prompt "seed=i", so every served latent can be checked bit for bit.
"""
from __future__ import annotations

import hashlib
import json
import os
import sqlite3
import struct
import subprocess
import textwrap
import zlib
from dataclasses import dataclass
from pathlib import Path

import torch

from comfyui_chai.cache_store.folder.store import CacheStore
from comfyui_chai.cache_store.lookup.rule import HitRule
from store_helpers import PYTHON, SIGMAS, ents, latents, subprocess_env

FP = "model-a"
SHAPE = (1, 4, 2, 4, 4)
THR = 0.8


def fill(root: Path, n: int, **kw) -> list[str]:
    """A cache of n entries (entities thing<i> + dog); return their file names in insert order."""
    with CacheStore(root, **kw) as s:
        ids = [s.insert(f"seed={i}", ents(f"thing{i}", "dog"), FP, latents(i), SIGMAS).entry_id for i in range(n)]
        return [s.manifest.entry(i).file for i in ids]


def folder_state(root: Path) -> dict[str, str]:
    """Every file under root (relative path -> sha256), except SQLite's shared-memory index and the lock."""
    out = {}
    for path in sorted(root.rglob("*")):
        if path.is_file() and not path.name.endswith("-shm") and path.name != ".writer.lock":
            out[str(path.relative_to(root))] = hashlib.sha256(path.read_bytes()).hexdigest()
        elif path.is_dir():
            out[str(path.relative_to(root)) + "/"] = "dir"
    return out


@dataclass
class Outcome:
    """What an open of a damaged cache gave back."""

    entries: int
    corrupted_served: int
    quarantined: int
    verify_problems: list[str]


def check(root: Path, n_expected_max: int) -> Outcome:
    """Open, look every entry up, load every entry; count corrupted tensors and what verify still finds."""
    corrupted = 0
    with CacheStore(root) as s:
        for e in s.entries():
            seed = int(e.prompt.split("=")[1])
            tensors, _ = s.load_latents(e.id)
            want = latents(seed, shape=tuple(e.shape))
            corrupted += not all(torch.equal(tensors[k], want[k]) for k in want)
        for i in range(n_expected_max):
            res = s.lookup(ents(f"thing{i}"), FP, SHAPE, HitRule(THR))
            if res.hit:
                want = latents(int(res.entry.prompt.split("=")[1]))
                corrupted += not all(torch.equal(res.latents[k], want[k]) for k in want)
        n = s.stats().entries
        problems = s.verify().problems
    q = root / "quarantine"
    quarantined = len([p for p in q.iterdir() if p.name.endswith(".safetensors")]) if q.exists() else 0
    return Outcome(n, corrupted, quarantined, problems)


# ---------------------------------------------------------------------------------------------- damage
def lose_manifest(root: Path, how: str) -> None:
    """Delete, empty or replace manifest.sqlite (and its -wal/-shm) in one of the ways issue 13 found."""
    for suffix in ("-wal", "-shm"):
        (root / f"manifest.sqlite{suffix}").unlink(missing_ok=True)
    path = root / "manifest.sqlite"
    if how == "deleted":
        path.unlink(missing_ok=True)  # a rebuild killed early may not have written one yet: still lost
    elif how == "zero-length":
        path.write_bytes(b"")
    elif how == "foreign":
        path.unlink()
        con = sqlite3.connect(path)
        con.execute("CREATE TABLE notes (id INTEGER PRIMARY KEY, body TEXT)")
        con.execute("INSERT INTO notes(body) VALUES ('someone else''s database')")
        con.commit()
        con.close()
    elif how == "garbage":
        path.write_bytes(os.urandom(8192))
    else:
        raise ValueError(how)


def edit_manifest(root: Path, sql: str) -> None:
    """Run one statement against the manifest behind the store's back."""
    con = sqlite3.connect(root / "manifest.sqlite")
    con.execute(sql)
    con.commit()
    con.close()


def craft_file(path: Path, seed: int, meta_edit: dict | None = None, tensor_shape=SHAPE, vectors=None,
               drop_vectors: bool = False) -> None:
    """Write a latent file the way the store does, then with chosen lies in it."""
    from safetensors.torch import save

    from comfyui_chai.cache_store import latents as lat

    e = ents(f"thing{seed}", "dog")
    meta = {"prompt": f"seed={seed}", "fingerprint": FP, "shape": list(SHAPE), "dtype": "float32",
            "sigmas": SIGMAS, "embedder": e.embedder, "extra": {},
            "entities": [{"text": x.text, "kind": x.kind} for x in e.entities]}
    data = lat.encode_entry(latents(seed, shape=tensor_shape), e.vectors if vectors is None else vectors, meta)
    if meta_edit is not None or drop_vectors:
        from safetensors.torch import load

        tensors = load(data)
        if drop_vectors:
            tensors.pop(lat.VECTORS_KEY)
        header = json.loads(data[8:8 + int.from_bytes(data[:8], "little")])
        record = json.loads(header["__metadata__"]["chai"])
        record.pop("data_sha256", None)
        record.update(meta_edit or {})
        data = save(tensors, metadata={"chai": json.dumps(record)})
    path.write_bytes(data)


def corrupt_hnsw_index(index_file: Path) -> None:
    """Point a level-0 neighbour of the saved hnsw graph far out of range and recompute every checksum."""
    raw = index_file.read_bytes()
    head_len = struct.unpack("<Q", raw[8:16])[0]
    header = json.loads(raw[16:16 + head_len])
    labels_len = header["sections"][0]["bytes"]
    graph = bytearray(raw[16 + head_len + labels_len:])
    # first level-0 record starts after hnswlib's 96-byte header: u32 count, then u32 neighbour ids
    struct.pack_into("<I", graph, 96 + 4, 10**8)
    header["sections"][1]["crc32"] = zlib.crc32(bytes(graph))
    head = json.dumps(header, sort_keys=True).encode()
    index_file.write_bytes(raw[:8] + struct.pack("<Q", len(head)) + head + raw[16 + head_len:16 + head_len + labels_len]
                           + bytes(graph))


KILLED_WRITER = textwrap.dedent("""
    import sys
    from comfyui_chai.cache_store.folder.store import CacheStore
    from store_helpers import SIGMAS, ents, latents
    root, start = sys.argv[1], int(sys.argv[2])
    s = CacheStore(root)
    s.manifest.conn.execute("PRAGMA wal_autocheckpoint=0")   # keep every commit in the -wal
    for i in range(start, start + 5):
        s.insert(f"seed={i}", ents(f"thing{i}", "dog"), "model-a", latents(i), SIGMAS)
    print("inserted", flush=True)
    sys.stdin.read()                                          # wait to be killed
""")


def killed_writer_then_wal_lost(tmp: Path, root: Path, start: int) -> None:
    """A writer commits 5 entries (all still in the -wal), is SIGKILLed, and the -wal is then lost."""
    script = tmp / "killed_writer.py"
    script.write_text(KILLED_WRITER)
    proc = subprocess.Popen([PYTHON, str(script), str(root), str(start)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=subprocess_env())
    line = proc.stdout.readline()
    assert line.strip() == "inserted", proc.stderr.read()
    proc.kill()
    proc.wait()
    for suffix in ("-wal", "-shm"):
        (root / f"manifest.sqlite{suffix}").unlink(missing_ok=True)


REBUILDER = textwrap.dedent("""
    import sys
    from comfyui_chai.cache_store.folder.store import CacheStore
    CacheStore(sys.argv[1]).close()
    print("opened", flush=True)
""")


def kill_during_rebuild(tmp: Path, root: Path, delay: float) -> bool:
    """Start an open that must rebuild the manifest, SIGKILL it after `delay` s; True if it finished first."""
    import time

    script = tmp / "rebuilder.py"
    script.write_text(REBUILDER)
    proc = subprocess.Popen([PYTHON, str(script), str(root)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=subprocess_env())
    time.sleep(delay)
    finished = proc.poll() is not None
    proc.kill()
    proc.wait()
    return finished


def run_cli(root: Path, *args: str) -> subprocess.CompletedProcess:
    """python -m comfyui_chai.cache_store --root <parent> --name <folder> <args>."""
    return subprocess.run([PYTHON, "-m", "comfyui_chai.cache_store", "--root", str(root.parent), "--name",
                           root.name, *args], capture_output=True, text=True, env=subprocess_env(), timeout=120)
