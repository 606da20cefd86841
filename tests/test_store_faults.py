"""Issue 13: the cache never destroys what it can recover. One test per scenario the attack found."""
from __future__ import annotations

import json
import random
import sqlite3
import subprocess
import textwrap

import numpy as np
import pytest
import torch

from comfyui_chai.cache_store import latents as lat
from comfyui_chai.cache_store.config import StoreConfig
from comfyui_chai.cache_store.errors import CacheError, CacheNameError, InvalidEntryError, ManifestError
from comfyui_chai.cache_store.folder.maintenance import verify_folder
from comfyui_chai.cache_store.folder.manifest import advice
from comfyui_chai.cache_store.naming import cache_dir
from comfyui_chai.cache_store.folder.store import CacheStore
from comfyui_chai.cache_store.types import EmbeddedEntities
from comfyui_chai.cache_store.lookup.rule import HitRule
from store_faults import (FP, SHAPE, THR, check, corrupt_hnsw_index, craft_file, edit_manifest, fill, folder_state,
                          kill_during_rebuild, killed_writer_then_wal_lost, lose_manifest, run_cli)
from store_helpers import PYTHON, SIGMAS, ents, latents, subprocess_env


def _assert_all_back(root, n: int) -> None:
    out = check(root, n)
    assert (out.entries, out.corrupted_served) == (n, 0)
    assert not out.verify_problems, out.verify_problems


# ----------------------------------------------------------------------------- 1. a lost manifest deletes nothing
@pytest.mark.parametrize("how", ["deleted", "zero-length", "foreign", "garbage"])
def test_lost_manifest_is_rebuilt_from_the_files(tmp_path, how):
    root = tmp_path / "c"
    files = fill(root, 6)
    lose_manifest(root, how)
    before = folder_state(root)
    report = verify_folder(root)
    assert report.problems and folder_state(root) == before      # verify on the damaged folder changes nothing
    assert sorted(p.name for p in (root / "latents").iterdir()) == sorted(files)
    _assert_all_back(root, 6)
    if how in ("foreign", "garbage"):
        assert list((root / "quarantine").glob("*manifest.sqlite.reason.txt"))   # kept, with its reason


def test_killed_writer_with_lost_wal_loses_nothing(tmp_path):
    root = tmp_path / "c"
    fill(root, 3)
    killed_writer_then_wal_lost(tmp_path, root, start=3)
    assert len(list((root / "latents").iterdir())) == 8
    _assert_all_back(root, 8)


@pytest.mark.parametrize("command", ["verify", "repair"])
def test_verify_and_repair_on_a_lost_manifest_delete_nothing(tmp_path, command):
    root = tmp_path / "c"
    files = fill(root, 4)
    lose_manifest(root, "garbage")
    out = run_cli(root, command)
    # verify lists the lost manifest, so it exits 1 (issue 23); repair fixes it and exits 0
    assert out.returncode == (1 if command == "verify" else 0) and "Traceback" not in out.stderr, out.stderr
    assert sorted(p.name for p in (root / "latents").iterdir()) == sorted(files)
    _assert_all_back(root, 4)


# ----------------------------------------------------------------------------- 2. a kill during the rebuild
def test_kill_during_rebuild_loses_nothing(tmp_path):
    root = tmp_path / "c"
    fill(root, 12)
    rng = random.Random(7)
    for _ in range(3):
        lose_manifest(root, "deleted")
        kill_during_rebuild(tmp_path, root, rng.uniform(0.5, 3.0))
    assert len([p for p in (root / "latents").iterdir() if p.name.endswith(".safetensors")]) == 12
    _assert_all_back(root, 12)


# ----------------------------------------------------------------------------- 3. malformed files are isolated
MALFORMED = {
    "entities not a list": {"entities": "dog"},
    "shape not a list": {"shape": "big"},
    "no prompt": {"prompt": None},
    "nan sigma": {"sigmas": [float("nan")]},
    "no format": {"format": "something else"},
}


def test_malformed_files_are_quarantined_and_the_rest_rebuilt(tmp_path):
    root = tmp_path / "c"
    fill(root, 14)
    for i, edit in enumerate(MALFORMED.values()):
        craft_file(root / "latents" / f"{i:032x}.safetensors", 100 + i, meta_edit=edit)
    craft_file(root / "latents" / f"{99:032x}.safetensors", 199, drop_vectors=True)
    lose_manifest(root, "deleted")
    out = run_cli(root, "repair")
    assert out.returncode == 0 and "Traceback" not in out.stderr, out.stderr
    assert "quarantined" in out.stdout
    res = check(root, 14)
    assert (res.entries, res.corrupted_served, res.quarantined) == (14, 0, 6)
    reasons = list((root / "quarantine").glob("*.safetensors.reason.txt"))
    assert len(reasons) == 6 and all(r.read_text().strip() for r in reasons)


# ----------------------------------------------------------------------------- 4. shape from the tensors
def test_a_file_lying_about_its_shape_is_never_served(tmp_path):
    root = tmp_path / "c"
    fill(root, 2)
    craft_file(root / "latents" / f"{7:032x}.safetensors", 7, meta_edit={"shape": [1, 4, 1, 4, 4]},
               tensor_shape=(1, 4, 3, 4, 4))
    with CacheStore(root) as s:
        assert s.stats().entries == 2
        assert not s.lookup(ents("thing7"), FP, (1, 4, 1, 4, 4), HitRule(THR)).hit
    assert check(root, 2).quarantined == 1


# ----------------------------------------------------------------------------- 5. invalid vectors never committed
@pytest.mark.parametrize("bad", ["zero", "nan", "not unit"])
def test_invalid_entity_vectors_are_refused_before_commit(tmp_path, bad):
    root = tmp_path / "c"
    fill(root, 2)
    e = ents("cat")
    vec = {"zero": np.zeros_like(e.vectors), "nan": e.vectors * np.nan, "not unit": e.vectors * 3}[bad]
    with CacheStore(root) as s:
        with pytest.raises(InvalidEntryError):
            s.insert("bad", _unchecked(e.entities, vec), FP, latents(9), SIGMAS)
        assert s.stats().entries == 2 and len(list(s.latent_dir.iterdir())) == 2
    _assert_all_back(root, 2)


def _unchecked(entities, vectors) -> EmbeddedEntities:
    """EmbeddedEntities without its own finiteness check, as a buggy embedder could hand over."""
    obj = object.__new__(EmbeddedEntities)
    object.__setattr__(obj, "entities", tuple(entities))
    object.__setattr__(obj, "vectors", np.asarray(vectors, np.float32))
    object.__setattr__(obj, "embedder", "test-hash-embedder@1")
    return obj


def test_a_zero_vector_already_in_the_manifest_bricks_nothing(tmp_path):
    root = tmp_path / "c"
    fill(root, 3)
    edit_manifest(root, f"UPDATE entities SET vector=X'{'00' * 4 * 32}' WHERE text='thing1'")
    with CacheStore(root) as s:
        assert s.lookup(ents("thing2"), FP, SHAPE, HitRule(THR)).entry.prompt == "seed=2"
        assert any("not finite unit" in p for p in s.verify().problems)
        s.repair()
        assert not s.verify().problems


# ----------------------------------------------------------------------------- 6. verify is read-only
def test_verify_changes_nothing_and_lists_every_problem(tmp_path):
    root = tmp_path / "c"
    files = fill(root, 5)
    (root / "latents" / files[0]).unlink()
    (root / "latents" / files[1]).write_bytes(b"garbage")
    craft_file(root / "latents" / f"{5:032x}.safetensors", 5)                        # intact, unlisted
    (root / "latents" / f"{6:032x}.safetensors").write_bytes(b"\x80\x04pickle")        # unusable, unlisted
    before = folder_state(root)
    out = run_cli(root, "verify")
    assert out.returncode == 1, out.stderr  # problems listed: a script or cron job can tell
    assert folder_state(root) == before
    text = out.stdout
    assert "4 problem(s)" in text and "missing" in text and "damaged" in text
    assert "adopts it" in text and "quarantines it" in text


# ----------------------------------------------------------------------------- 7. a crafted hnsw graph
CRAFTED_LOOKUP = textwrap.dedent("""
    import sys
    from comfyui_chai.cache_store.folder.store import CacheStore
    from comfyui_chai.cache_store.lookup.rule import HitRule
    from store_helpers import ents
    with CacheStore(sys.argv[1], index_kwargs={"backend": "hnsw"}) as s:
        print("hit" if s.lookup(ents("thing3"), "model-a", (1, 4, 2, 4, 4), HitRule(0.8)).hit else "miss", flush=True)
""")


def test_crafted_hnsw_graph_is_refused_not_loaded(tmp_path):
    root = tmp_path / "c"
    fill(root, 6, index_kwargs={"backend": "hnsw"})
    state = json.loads((root / "index" / "state.json").read_text())
    corrupt_hnsw_index(root / "index" / state["file"])
    script = tmp_path / "crafted.py"
    script.write_text(CRAFTED_LOOKUP)
    out = subprocess.run([PYTHON, str(script), str(root)], capture_output=True, text=True, env=subprocess_env(),
                         timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "hit", out.stderr   # no segfault: the graph was refused


# ----------------------------------------------------------------------------- 8. smaller ones
def test_the_budget_belongs_to_the_cache(tmp_path):
    root = tmp_path / "c"
    fill(root, 1)
    size = next((root / "latents").iterdir()).stat().st_size
    with CacheStore(root, StoreConfig(budget_bytes=3 * size)) as a, CacheStore(root) as b:
        assert a.budget_bytes == b.budget_bytes == 3 * size        # an open without a budget keeps the cache's
        for i in range(1, 10):
            (a if i % 2 else b).insert(f"seed={i}", ents(f"thing{i}"), FP, latents(i), SIGMAS)
            assert a.stats().bytes <= 3 * size
        b.prune(2 * size)                                           # an explicit change, seen by both
        assert a.budget_bytes == 2 * size and a.stats().entries == 2


@pytest.mark.parametrize("where", ["latents", "sigmas"])
def test_nan_latents_and_sigmas_are_refused(tmp_path, where):
    bad = latents(1)
    sigmas = list(SIGMAS)
    if where == "latents":
        bad["step2"][0, 0, 0, 0, 0] = float("inf")
    else:
        sigmas[1] = float("nan")
    with CacheStore(tmp_path / "c") as s:
        with pytest.raises(InvalidEntryError):
            s.insert("p", ents("cat"), FP, bad, sigmas)
        assert s.stats().entries == 0


def test_a_file_with_nan_latents_is_quarantined_not_served(tmp_path):
    root = tmp_path / "c"
    fill(root, 1)
    bad = latents(3)
    bad["step3"][0, 1, 0, 0, 0] = float("nan")
    e = ents("thing3", "dog")
    meta = {"prompt": "seed=3", "fingerprint": FP, "shape": list(SHAPE), "dtype": "float32", "sigmas": SIGMAS,
            "embedder": e.embedder, "entities": [{"text": x.text, "kind": x.kind} for x in e.entities]}
    (root / "latents" / f"{3:032x}.safetensors").write_bytes(lat.encode_entry(bad, e.vectors, meta))
    res = check(root, 4)
    assert res.corrupted_served == 0 and res.entries == 1 and res.quarantined == 1


def test_lone_surrogates_are_stored_as_replacement_characters(tmp_path):
    with CacheStore(tmp_path / "c") as s:
        s.insert("a dog \ud800 on a beach", ents("dog"), FP, latents(1), SIGMAS)
        assert s.entries()[0].prompt == "a dog \ufffd on a beach"


def test_lone_surrogate_prompt_extracts_without_error(spacy_pipeline):
    from comfyui_chai.cache_store.entities.extract import EntityExtractor

    found = EntityExtractor(spacy_pipeline).extract("a dog \udc80 on a beach")
    assert "dog" in [e.text for e in found]


@pytest.mark.parametrize("name", ["default\n", "default\r", "a\x00b", " default"])
def test_names_with_control_characters_are_refused(tmp_path, name):
    with pytest.raises(CacheNameError):
        cache_dir(tmp_path, name)
    assert list(tmp_path.iterdir()) == []


def test_a_full_disk_is_a_cache_error_with_advice_and_hits_still_serve(tmp_path, monkeypatch):
    root = tmp_path / "c"
    fill(root, 2)
    with CacheStore(root) as s:
        pages = s.manifest.conn.execute("PRAGMA page_count").fetchone()[0]
        s.manifest.conn.execute(f"PRAGMA max_page_count={pages}")
        with pytest.raises(CacheError, match="full"):
            for i in range(2, 60):
                s.insert(f"seed={i}", ents(f"thing{i} " + "x" * 400), FP, latents(i), SIGMAS)

        def full(*a, **k):
            raise ManifestError(advice(sqlite3.OperationalError("database or disk is full")))

        monkeypatch.setattr(s, "touch", full)
        res = s.lookup(ents("thing1"), FP, SHAPE, HitRule(THR))
        assert res.hit and torch.equal(res.latents["step2"], latents(1)["step2"])
    assert not [p for p in (root / "latents").iterdir() if p.name.startswith(".tmp")]


@pytest.mark.parametrize("damage", ["UPDATE meta SET value='abc' WHERE key='format_version'", "DROP TABLE postings",
                                    "UPDATE meta SET value='x' WHERE key='generation'"])
def test_a_damaged_schema_or_meta_is_rebuilt(tmp_path, damage):
    root = tmp_path / "c"
    fill(root, 4)
    edit_manifest(root, damage)
    _assert_all_back(root, 4)


def test_a_directory_in_place_of_a_latent_file_is_cleared_by_repair(tmp_path):
    root = tmp_path / "c"
    files = fill(root, 3)
    (root / "latents" / files[1]).unlink()
    (root / "latents" / files[1]).mkdir()
    with CacheStore(root) as s:
        assert s.lookup(ents("thing1", "dog"), FP, SHAPE, HitRule(THR)).entry.prompt != "seed=1"
        problems = s.verify().problems
        report = s.repair()
        assert report.repaired and not s.verify().problems, (problems, report.report())
        assert s.stats().entries == 2


def test_symlink_in_place_of_a_latent_file_is_not_followed(tmp_path):
    root = tmp_path / "c"
    files = fill(root, 3)
    target = root / "latents" / files[0]
    victim = root / "latents" / files[1]
    victim.unlink()
    victim.symlink_to(target)
    with CacheStore(root) as s:
        res = s.lookup(ents("thing1", "dog"), FP, SHAPE, HitRule(THR))
        assert res.hit and res.entry.prompt != "seed=1"


def test_power_loss_snapshots_open_without_losing_committed_entries(tmp_path):
    """Folder copies taken at random moments while a writer runs (manifest first, then the files) all open."""
    import shutil
    import time

    root = tmp_path / "c"
    fill(root, 1)
    script = tmp_path / "w.py"
    script.write_text(textwrap.dedent("""
        import sys
        from comfyui_chai.cache_store.folder.store import CacheStore
        from store_helpers import SIGMAS, ents, latents
        with CacheStore(sys.argv[1]) as s:
            for i in range(1, 40):
                s.insert(f"seed={i}", ents(f"thing{i}", "dog"), "model-a", latents(i), SIGMAS)
    """))
    def copy_if_present(src: str, dst: str) -> None:
        try:  # a temporary file renamed or removed between the listing and the copy is not part of this moment
            shutil.copy2(src, dst)
        except FileNotFoundError:
            pass

    proc = subprocess.Popen([PYTHON, str(script), str(root)], env=subprocess_env(), stderr=subprocess.PIPE)
    snaps = []
    rng = random.Random(5)
    while proc.poll() is None and len(snaps) < 4:
        time.sleep(rng.uniform(0.2, 0.8))
        snap = tmp_path / f"snap{len(snaps)}"
        snap.mkdir()
        for name in ("manifest.sqlite", "manifest.sqlite-wal"):
            try:
                shutil.copy2(root / name, snap / name)
            except FileNotFoundError:
                pass
        shutil.copytree(root / "latents", snap / "latents", ignore_dangling_symlinks=True,
                        copy_function=copy_if_present)
        snaps.append(snap)
    proc.wait()
    assert snaps
    for snap in snaps:
        out = check(snap, 40)
        assert out.corrupted_served == 0 and out.entries >= 1
        assert not [p for p in out.verify_problems if "missing" in p]
