"""Crash safety, corruption and multi-process use of one cache folder."""
from __future__ import annotations

import os
import random
import signal
import sqlite3
import subprocess
import textwrap
import time

import pytest
import torch

from comfyui_chai.cache_store.config import StoreConfig
from comfyui_chai.cache_store.folder.store import CacheStore
from comfyui_chai.cache_store.lookup.rule import HitRule
from store_helpers import PYTHON, SIGMAS, ents, latents, subprocess_env

FP = "model-a"
SHAPE = (1, 4, 2, 4, 4)
THR = 0.8

# A child process that writes (and reads) forever; entry i of writer w holds latents(seed=w*100000+i), so any
# survivor can be checked bit for bit against what was meant to be written.
WRITER = textwrap.dedent("""
    import random, sys
    import comfyui_chai.cache_store.backend as backend_mod
    from comfyui_chai.cache_store.config import StoreConfig
    from comfyui_chai.cache_store.folder.store import CacheStore
    from comfyui_chai.cache_store.lookup.rule import HitRule
    from store_helpers import SIGMAS, ents, latents
    root, wid, budget, count = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    backend_mod.SAVE_INDEX_EVERY = 3          # persist the index often, so kills land inside saves too
    backend_mod.SAVE_INDEX_INTERVAL = 0.0
    rng = random.Random(wid)
    s = CacheStore(root, StoreConfig(budget))
    print("ready", flush=True)
    i = 0
    while count < 0 or i < count:
        seed = wid * 100000 + i
        words = rng.sample([f"w{k}" for k in range(30)], rng.randint(1, 3))
        s.insert(f"seed={seed}", ents(*words), "model-a", latents(seed), [0.9, 0.8, 0.7])
        res = s.lookup(ents(rng.choice(words)), "model-a", (1, 4, 2, 4, 4), HitRule(0.8))
        if res.hit:
            want = latents(int(res.entry.prompt.split("=")[1]))
            assert all((res.latents[k] == want[k]).all() for k in want), "hit returned wrong latents"
        i += 1
    s.close()
    print("done", flush=True)
""")


def spawn_writer(tmp_path, root, wid: int, budget: int, count: int = -1) -> subprocess.Popen:
    script = tmp_path / "writer.py"
    script.write_text(WRITER)
    return subprocess.Popen([PYTHON, str(script), str(root), str(wid), str(budget), str(count)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=subprocess_env())


def assert_intact(root, budget: int) -> int:
    """Open the store and check every entry is complete and holds exactly what its writer meant."""
    with CacheStore(root, StoreConfig(budget)) as s:
        report = s.verify()
        assert report.ok and not report.problems, report.report()
        entries = s.entries()
        # a kill between a file's rename and its commit leaves a file open adopts (open never evicts): at most one
        # unacknowledged entry above the budget, until the next write or prune
        assert s.stats().bytes <= budget + max((e.nbytes for e in entries), default=0)
        for e in entries:
            tensors, sigmas = s.load_latents(e.id)
            want = latents(int(e.prompt.split("=")[1]))
            assert set(tensors) == set(want)
            assert all(torch.equal(tensors[k], want[k]) for k in want)
            assert sigmas == SIGMAS
        files = {p.name for p in s.latent_dir.iterdir()}
        assert files == {e.file for e in entries}
        live = s.manifest.query("SELECT COUNT(DISTINCT entity_id) FROM postings")[0][0]
        assert len(s._index) == live == s.stats().entities
        return len(entries)


def entry_size(tmp_path) -> int:
    with CacheStore(tmp_path / "probe", StoreConfig(10**9)) as s:
        return s.insert("seed=0", ents("w1"), FP, latents(0), SIGMAS).nbytes


@pytest.mark.skipif(not hasattr(signal, "SIGKILL"), reason="SIGKILL is POSIX (Windows has no such signal)")
def test_killed_writers_never_leave_a_broken_cache(tmp_path):
    root = tmp_path / "c"
    budget = entry_size(tmp_path) * 12 + 100
    rng = random.Random(3)
    for round_ in range(10):
        proc = spawn_writer(tmp_path, root, round_, budget)
        assert proc.stdout.readline().strip() == "ready", proc.stderr.read()
        time.sleep(rng.uniform(0.0, 0.6))
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert assert_intact(root, budget) > 0


def test_two_writer_processes_and_a_reader_lose_nothing(tmp_path):
    root = tmp_path / "c"
    budget = 10**9
    CacheStore(root, StoreConfig(budget)).close()
    procs = [spawn_writer(tmp_path, root, wid, budget, count=25) for wid in (1, 2)]
    reader_hits = 0
    with CacheStore(root, StoreConfig(budget)) as reader:
        while any(p.poll() is None for p in procs):
            res = reader.lookup(ents(f"w{random.randrange(30)}"), FP, SHAPE, HitRule(THR))
            if res.hit:
                want = latents(int(res.entry.prompt.split("=")[1]))
                assert all(torch.equal(res.latents[k], want[k]) for k in want)
                reader_hits += 1
    for p in procs:
        out, err = p.communicate()
        assert p.returncode == 0 and "done" in out, err
    assert assert_intact(root, budget) == 50
    with CacheStore(root, StoreConfig(budget)) as s:
        prompts = {e.prompt for e in s.entries()}
    assert prompts == {f"seed={w * 100000 + i}" for w in (1, 2) for i in range(25)}


@pytest.fixture
def filled(tmp_path):
    root = tmp_path / "c"
    with CacheStore(root, StoreConfig(10**9)) as s:
        for i in range(6):
            s.insert(f"seed={i}", ents(f"thing{i}", "dog"), FP, latents(i), SIGMAS)
    return root


def _file_of(root, prompt: str) -> str:
    con = sqlite3.connect(root / "manifest.sqlite")
    try:
        return con.execute("SELECT file FROM entries WHERE prompt=?", (prompt,)).fetchone()[0]
    finally:
        con.close()


@pytest.mark.parametrize("damage", ["truncate", "flip", "delete"])
def test_damaged_latent_file_is_a_miss_and_dropped(filled, damage):
    with CacheStore(filled, StoreConfig(10**9)) as s:
        path = s.latent_dir / _file_of(filled, "seed=2")
        if damage == "truncate":
            path.write_bytes(path.read_bytes()[:100])
        elif damage == "flip":
            data = bytearray(path.read_bytes())
            data[-5] ^= 0xFF
            path.write_bytes(bytes(data))
        else:
            path.unlink()
        res = s.lookup(ents("thing2", "dog"), FP, SHAPE, HitRule(THR))
        # "dog" is shared by every entry, so the next best intact entry serves the hit instead
        assert res.hit and res.entry.prompt != "seed=2"
        assert torch.equal(res.latents["step2"], latents(int(res.entry.prompt.split("=")[1]))["step2"])
        assert "seed=2" not in {e.prompt for e in s.entries()}
    assert assert_intact(filled, 10**9) == 5


def test_damaged_only_candidate_gives_a_clear_miss(tmp_path):
    root = tmp_path / "c"
    with CacheStore(root, StoreConfig(10**9)) as s:
        s.insert("seed=1", ents("cat"), FP, latents(1), SIGMAS)
        (s.latent_dir / s.entries()[0].file).write_bytes(b"garbage")
        res = s.lookup(ents("cat"), FP, SHAPE, HitRule(THR))
        assert not res.hit and "unreadable" in res.reason
        assert s.stats().entries == 0


def test_deleted_file_is_reported_by_open_and_dropped_by_repair(filled):
    (filled / "latents" / _file_of(filled, "seed=4")).unlink()
    with CacheStore(filled) as s:
        assert any("missing or damaged" in w for w in s.warnings)
        assert s.stats().entries == 6  # open never deletes, not even a dead row
        report = s.repair()
        assert any("dropped entry" in r and "seed=4" in r for r in report.repaired)
    assert assert_intact(filled, 10**9) == 5


def test_deleted_or_garbage_index_is_rebuilt(filled):
    for p in (filled / "index").iterdir():
        p.unlink()
    with CacheStore(filled, StoreConfig(10**9)) as s:
        assert s.lookup(ents("thing5"), FP, SHAPE, HitRule(THR)).entry.prompt == "seed=5"
    for p in (filled / "index").iterdir():
        p.write_bytes(os.urandom(64))
    with CacheStore(filled, StoreConfig(10**9)) as s:
        assert s.lookup(ents("thing1"), FP, SHAPE, HitRule(THR)).entry.prompt == "seed=1"
    assert assert_intact(filled, 10**9) == 6


def test_garbage_manifest_is_rebuilt_from_the_latent_files(filled):
    for suffix in ("-wal", "-shm"):
        (filled / f"manifest.sqlite{suffix}").unlink(missing_ok=True)
    (filled / "manifest.sqlite").write_bytes(os.urandom(4096))
    with CacheStore(filled, StoreConfig(10**9)) as s:
        assert s.stats().entries == 6
        assert s.lookup(ents("thing3"), FP, SHAPE, HitRule(THR)).entry.prompt == "seed=3"
    kept = list((filled / "quarantine").glob("*manifest.sqlite"))   # the damaged file is kept aside, not deleted
    assert kept and kept[0].read_bytes()[:16] != b"SQLite format 3\x00"
    assert assert_intact(filled, 10**9) == 6


def test_garbage_rows_never_reach_outside_the_cache(filled, tmp_path):
    outside = tmp_path / "precious.safetensors"
    outside.write_bytes(b"keep me")
    con = sqlite3.connect(filled / "manifest.sqlite")
    con.execute("UPDATE entries SET file=? WHERE prompt='seed=1'", ("../../precious.safetensors",))
    con.execute("UPDATE entries SET nbytes=-5 WHERE prompt='seed=2'")
    con.commit()
    con.close()
    with CacheStore(filled, StoreConfig(10**9)) as s:
        # seed=1's real file lost its row, so open adopted it back; the two garbage rows stay until repair
        assert sorted(e.prompt for e in s.entries()) == sorted([f"seed={i}" for i in range(6)] + ["seed=1"])
        assert s.lookup(ents("thing1"), FP, SHAPE, HitRule(THR)).entry.prompt == "seed=1"
        report = s.repair()
        assert sum("dropped entry" in r for r in report.repaired) == 2
    assert outside.read_bytes() == b"keep me"
    assert assert_intact(filled, 10**9) == 6


def test_verify_reports_and_repair_fixes(filled):
    with CacheStore(filled, StoreConfig(10**9)) as s:
        path = s.latent_dir / _file_of(filled, "seed=0")
        data = bytearray(path.read_bytes())
        data[-1] ^= 0x01
        path.write_bytes(bytes(data))
        (s.latent_dir / ("ab" * 16 + ".safetensors")).write_bytes(b"stray")
        report = s.verify()
        assert not report.ok
        text = report.report()
        assert "checksum" in text and "not in the manifest" in text
        repaired = s.repair()
        assert repaired.repaired
        assert s.verify().ok and not s.verify().problems
        assert s.stats().entries == 5


def test_cli_stats_verify_prune_clear(filled):
    env = subprocess_env()
    base = [PYTHON, "-m", "comfyui_chai.cache_store", "--root", str(filled.parent), "--name", filled.name]

    def run(*args: str) -> str:
        out = subprocess.run(base + list(args), capture_output=True, text=True, env=env, timeout=120)
        assert out.returncode == 0, out.stderr
        return out.stdout

    assert "entries: 6" in run("stats")
    assert run("list").count("seed=") == 6
    assert "0 problem(s)" in run("verify")
    size = os.path.getsize(next((filled / "latents").iterdir()))
    assert "evicted 4" in run("prune", "--budget-gb", str(size * 2 / 1e9))
    assert "removed 2" in run("clear", "--yes")
    bad = subprocess.run(base[:3] + ["--root", str(filled.parent), "--name", "../x", "stats"],
                         capture_output=True, text=True, env=env, timeout=120)
    assert bad.returncode == 2 and "invalid cache name" in bad.stderr and "Traceback" not in bad.stderr


def test_temporaries_of_interrupted_writes_are_swept_on_open(filled):
    (filled / "latents" / ".tmp-0123").write_bytes(b"half a latent")
    (filled / "index" / ".entities-1-6.idx.x1y2.hnsw.tmp").write_bytes(b"half an index")
    with CacheStore(filled, StoreConfig(10**9)) as s:
        assert not [p for p in s.latent_dir.iterdir() if p.name.startswith(".")]
        assert not [p for p in s.index_dir.iterdir() if p.name.startswith(".")]
        assert s.lookup(ents("thing1"), FP, SHAPE, HitRule(THR)).hit
