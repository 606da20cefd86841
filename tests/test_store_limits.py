"""Issue 23 item 14: huge stray files, a full disk during a rebuild or a write, NUL characters, and quarantine/."""
from __future__ import annotations

import errno
import hashlib
import json
import os
import sqlite3
from pathlib import Path

import pytest

from comfyui_chai.cache_store import latents as lat
from comfyui_chai.cache_store.errors import CacheError
from comfyui_chai.cache_store.folder.maintenance import verify_folder
from comfyui_chai.cache_store.folder.manifest import Manifest
from comfyui_chai.cache_store.folder.store import CacheStore
from comfyui_chai.cache_store.lookup.rule import HitRule
from comfyui_chai.cache_store.service import ChaiCache
from store_faults import FP, SHAPE, THR, edit_manifest, fill, run_cli
from store_helpers import SIGMAS, ents, latents

HUGE = 2 * 1024**3
STRAY = "0123456789abcdef0123456789abcdef.safetensors"


def _bytes_read() -> int:
    with open("/proc/self/io", encoding="ascii") as fh:
        return int(next(line for line in fh if line.startswith("rchar:")).split()[1])


def _huge_file(path: Path, header: bool) -> None:
    """A sparse 2 GiB file: all zeros, or a safetensors header that vouches for all of it."""
    with open(path, "wb") as fh:
        if header:
            n = (HUGE - 4096) // 4
            head = json.dumps({"__metadata__": {"chai": "{}"},
                               "x": {"dtype": "F32", "shape": [n], "data_offsets": [0, 4 * n]}}).encode()
            fh.write(len(head).to_bytes(8, "little") + head)
            size = 8 + len(head) + 4 * n
        else:
            size = HUGE
    os.truncate(path, size)


@pytest.mark.skipif(not os.path.exists("/proc/self/io"), reason="counts bytes read through /proc/self/io")
@pytest.mark.parametrize("header", [False, True], ids=["zeros", "header-claims-2GiB"])
def test_a_huge_stray_file_is_judged_without_reading_it(tmp_path, header):
    root = tmp_path / "c"
    fill(root, 1)
    _huge_file(root / "latents" / STRAY, header)
    before = _bytes_read()
    report = verify_folder(root)
    assert any(STRAY in p and "unusable" in p for p in report.problems), report.problems
    with CacheStore(root) as s:
        assert any(STRAY in line for line in s.warnings)
        assert s.stats().entries == 1
    assert _bytes_read() - before < 64 * 1024**2
    assert not (root / "latents" / STRAY).exists()  # quarantined, never read whole


def _disk_full_on_rebuild(monkeypatch, only_rebuild: bool) -> None:
    real = Manifest._init_schema

    def init_schema(self):
        if not only_rebuild or self.path.name.startswith(".manifest-rebuild-"):
            raise sqlite3.OperationalError("database or disk is full")
        return real(self)

    monkeypatch.setattr(Manifest, "_init_schema", init_schema)


def test_a_full_disk_during_a_rebuild_says_so_and_keeps_the_old_manifest(tmp_path, monkeypatch):
    root = tmp_path / "c"
    fill(root, 2)
    edit_manifest(root, "UPDATE meta SET value='abc' WHERE key='format_version'")
    old = hashlib.sha256((root / "manifest.sqlite").read_bytes()).hexdigest()
    _disk_full_on_rebuild(monkeypatch, only_rebuild=True)
    with pytest.raises(CacheError) as err:
        CacheStore(root)
    assert "full" in str(err.value) and "unreadable" not in str(err.value)
    assert hashlib.sha256((root / "manifest.sqlite").read_bytes()).hexdigest() == old
    assert not [p for p in root.iterdir() if p.name.startswith(".manifest-rebuild-")]
    monkeypatch.undo()
    with CacheStore(root) as s:  # space again: the rebuild recovers both entries
        assert s.stats().entries == 2


def test_a_full_disk_with_a_lost_manifest_leaves_no_empty_manifest(tmp_path, monkeypatch):
    root = tmp_path / "c"
    fill(root, 2)
    (root / "manifest.sqlite").unlink()
    _disk_full_on_rebuild(monkeypatch, only_rebuild=False)
    with pytest.raises(CacheError) as err:
        CacheStore(root)
    assert "full" in str(err.value) and "unreadable" not in str(err.value)
    assert not (root / "manifest.sqlite").exists()
    monkeypatch.undo()
    with CacheStore(root) as s:
        assert s.stats().entries == 2


def test_a_full_disk_on_write_is_not_stored_with_the_reason(tmp_path, monkeypatch):
    cache = ChaiCache(tmp_path / "c")
    real = os.fsync

    def fsync(fd):
        if os.path.basename(os.readlink(f"/proc/self/fd/{fd}")).startswith(lat.TMP_PREFIX):
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    written = cache.write("a dog", ents("dog"), FP, latents(1), SIGMAS)
    assert not written.stored and "disk is full" in written.reason
    cache.close()


def test_a_nul_in_a_prompt_is_stored_the_same_way_by_both_backends(opener):
    with opener("nul") as s:
        res = s.insert("a dog\x00 on a beach", ents("dog\x00"), FP, latents(1), SIGMAS)
        entry = s.entry(res.entry_id)
        assert entry.prompt == "a dog\ufffd on a beach" and entry.entities == ("dog\ufffd",)
        assert s.lookup(ents("dog\x00"), FP, SHAPE, HitRule(THR)).hit  # the vector of what was embedded


def test_quarantine_is_counted_by_stats_and_emptied_only_when_asked(tmp_path):
    root = tmp_path / "c"
    fill(root, 1)
    (root / "latents" / STRAY).write_bytes(b"not a latent file")
    stats = run_cli(root, "stats")
    assert stats.returncode == 0 and "quarantine: 1 file(s)" in stats.stdout, stats.stdout + stats.stderr
    kept = run_cli(root, "clear", "--yes")
    assert kept.returncode == 0 and len(list((root / "quarantine").iterdir())) == 2  # the file and its reason
    emptied = run_cli(root, "clear", "--yes", "--quarantine")
    assert emptied.returncode == 0 and "quarantine" in emptied.stdout, emptied.stdout + emptied.stderr
    assert list((root / "quarantine").iterdir()) == []
    assert "quarantine: 0 file(s)" in run_cli(root, "stats").stdout
    (root / "latents" / STRAY).write_bytes(b"again")
    repaired = run_cli(root, "repair", "--quarantine")
    assert repaired.returncode == 0, repaired.stdout + repaired.stderr
    assert list((root / "quarantine").iterdir()) == []


def test_a_server_quarantine_is_counted_and_emptied_when_asked(opener):
    if opener.kind != "server":
        pytest.skip("the folder's quarantine is tested through the CLI above")
    with opener("q") as s:
        s.insert("a dog", ents("dog"), FP, latents(1), SIGMAS)
        with s.db.write() as cur:
            cur.execute("INSERT INTO quarantine (entry_id, prompt, reason, at, data) VALUES (1, 'p', 'r', 0, %s)",
                        (b"12345",))
        assert (s.stats().quarantine_files, s.stats().quarantine_bytes) == (1, 5)
        s.clear()
        assert s.stats().quarantine_files == 1
        assert s.empty_quarantine() == (1, 5)
        assert s.stats().quarantine_files == 0


def test_a_full_server_disk_is_said_so_and_not_taken_for_an_unreachable_server(opener, monkeypatch):
    if opener.kind != "server":
        pytest.skip("the folder's full disk is tested above")
    psycopg = pytest.importorskip("psycopg")
    cache = ChaiCache(opener.tmp / "w", server=opener.server(), name=opener.prefix + "-full")

    def full(*a, **k):
        raise cache.store.db._translate(psycopg.errors.DiskFull("could not extend file: No space left on device"))

    monkeypatch.setattr(cache.store, "insert", full)
    written = cache.write("a dog", ents("dog"), FP, latents(1), SIGMAS)
    assert not written.stored and "disk is full" in written.reason and "unreachable" not in written.reason
    cache.close()


def test_a_nul_in_a_fingerprint_or_an_embedder_name_is_refused_alike_by_both_backends(opener):
    from comfyui_chai.cache_store.errors import InvalidEntryError

    with opener("nulfp") as s:
        with pytest.raises(InvalidEntryError, match="fingerprint holds a NUL"):
            s.insert("a dog", ents("dog"), FP + "\x00x", latents(1), SIGMAS)
        with pytest.raises(InvalidEntryError, match="embedder holds a NUL"):
            s.insert("a dog", ents("dog", embedder="mini\x00lm"), FP, latents(1), SIGMAS)
        assert s.stats().entries == 0
        s.insert("a dog", ents("dog"), FP, latents(1), SIGMAS)
        miss = s.lookup(ents("dog"), FP + "\x00", SHAPE, HitRule(THR))
        assert not miss.hit and "NUL" in miss.reason


@pytest.mark.skipif(not os.path.exists("/proc/self/io"), reason="counts bytes read through /proc/self/io")
def test_a_rebuild_of_a_lost_manifest_judges_a_huge_stray_file_by_the_opener_budget_unread(tmp_path):
    from comfyui_chai.cache_store.folder.manifest import MANIFEST_NAME

    root = tmp_path / "c"
    fill(root, 2)
    for suffix in ("", "-wal", "-shm"):
        (root / (MANIFEST_NAME + suffix)).unlink(missing_ok=True)  # the budget it held is gone with it
    _huge_file(root / "latents" / STRAY, header=True)
    before = _bytes_read()
    with CacheStore(root) as s:
        assert s.stats().entries == 2  # the real entries are adopted again
        assert any(STRAY in line for line in s.warnings)
    assert _bytes_read() - before < 64 * 1024**2
    assert not (root / "latents" / STRAY).exists()
