"""hnswlib is optional: exact search when it is missing, stores that move between backends, and a clear error when
a setting asks for hnswlib that is not there."""
from __future__ import annotations

import logging
import sys
import tomllib
from pathlib import Path

import numpy as np
import pytest

from comfyui_chai.cache_store.config import StoreConfig
from comfyui_chai.cache_store.errors import CacheError
from comfyui_chai.cache_store.folder.store import CacheStore
from comfyui_chai.cache_store.index import ann
from comfyui_chai.cache_store.index.vector_index import VectorIndex
from comfyui_chai.cache_store.lookup.rule import HitRule
from store_helpers import DIM, SIGMAS, ents, latents

REPO = Path(__file__).resolve().parents[1]
FP, SHAPE, THR = "model-a", (1, 4, 2, 4, 4), 0.8
HEADS = ["dog", "cat", "cow", "horse", "owl", "fox", "bear", "boat", "car", "tower", "lamp", "kite"]
PLACES = ["beach", "forest", "street"]


@pytest.fixture
def no_hnswlib(monkeypatch):
    """This process behaves as if hnswlib were not installed (an import of it raises ImportError)."""
    monkeypatch.setitem(sys.modules, "hnswlib", None)
    ann.forget()
    yield
    ann.forget()


@pytest.fixture(autouse=True)
def fresh_check():
    ann.forget()
    yield
    ann.forget()


def fill(root: Path, config: StoreConfig, **index_kwargs) -> list[int]:
    """36 entries of one to three entities (a modifier, a head, sometimes a scene); their ids."""
    ids = []
    with CacheStore(root, config, index_kwargs=index_kwargs or None) as s:
        for i in range(36):
            texts = [f"{['red', 'small', 'old'][i % 3]} {HEADS[i % len(HEADS)]}"]
            if i % 2:
                texts.append(HEADS[(i * 5 + 1) % len(HEADS)])
            if i % 3 == 0:
                texts.append(PLACES[i % len(PLACES)])
            ids.append(s.insert(f"p{i}", ents(*texts), FP, latents(i), SIGMAS).entry_id)
    return ids


REQUESTS = [("red dog",), ("old owl", "beach"), ("small kite", "forest"), ("cat", "street"), ("blue horse",),
            ("tower", "beach"), ("giraffe",), ("green car", "lamp")]


def answers(store: CacheStore) -> list[tuple]:
    """What each request gets: hit, entry, reason and matches (touching nothing)."""
    out = []
    for texts in REQUESTS:
        r = store.lookup(ents(*texts), FP, SHAPE, HitRule(THR), touch=False, load=False)
        out.append((r.hit, r.entry.id if r.entry else None, r.reason,
                    [(m.query, m.entity, round(m.similarity, 5), m.role) for m in r.matches]))
    return out


def every_entry_found(store: CacheStore, ids: list[int]) -> None:
    labels = set(store.keeper.index.labels().tolist())
    points = store.manifest.entity_points()
    assert labels == store.keeper.points.labels()
    assert len(labels) == len({(ident, v.tobytes()) for ident, v in zip(points.identities, points.vectors)})
    assert sorted(e.id for e in store.entries()) == sorted(ids)
    hit = store.lookup(ents("red dog"), FP, SHAPE, HitRule(THR), touch=False)
    assert hit.hit and hit.latents is not None


def test_auto_index_stays_exact_without_hnswlib(no_hnswlib, caplog):
    rng = np.random.default_rng(0)
    vecs = rng.standard_normal((300, DIM)).astype(np.float32)
    vecs /= np.linalg.norm(vecs, axis=1, keepdims=True)
    labels = np.arange(300, dtype=np.int64) * 3
    ix = VectorIndex(DIM, hnsw_min_size=50)
    with caplog.at_level(logging.INFO, logger=ann.__name__):
        ix.add(labels[:100], vecs[:100])
        ix.add(labels[100:], vecs[100:])
    assert ix.backend == "exact" and len(ix) == 300
    notes = [r.getMessage() for r in caplog.records if "hnswlib is not installed" in r.getMessage()]
    assert len(notes) == 1 and "exact search over 100 entities" in notes[0]  # once, when the switch was due
    q = vecs[:4] + 0.05
    got, sims = ix.query(q, 7)
    qn = q / np.linalg.norm(q, axis=1, keepdims=True)
    ref = labels[np.argsort(-(qn @ vecs.T), axis=1)[:, :7]]
    assert np.array_equal(got, ref) and np.all(np.diff(sims, axis=1) <= 1e-6)


def test_asking_for_hnsw_without_hnswlib_names_the_fix(no_hnswlib, tmp_path):
    with pytest.raises(ValueError, match="pip install hnswlib"):
        VectorIndex(DIM, backend="hnsw")
    with pytest.raises(CacheError, match="pip install hnswlib.*'auto' or 'exact'"):
        CacheStore(tmp_path / "c", StoreConfig(index_backend="hnsw"))
    assert not (tmp_path / "c").exists()  # refused before anything was created


def test_index_backend_setting_is_validated():
    with pytest.raises(ValueError, match="index_backend must be one of"):
        StoreConfig(index_backend="faiss")
    assert StoreConfig().index_backend == "auto"


def test_store_without_hnswlib_serves_and_grows(no_hnswlib, tmp_path):
    root = tmp_path / "c"
    ids = fill(root, StoreConfig(10**9), hnsw_min_size=10)  # past the switch size, yet exact
    with CacheStore(root, StoreConfig(10**9), index_kwargs={"hnsw_min_size": 10}) as s:
        assert s.stats().index_backend == "exact"
        every_entry_found(s, ids)


def test_exact_and_hnsw_stores_give_the_same_answers(tmp_path):
    pytest.importorskip("hnswlib")
    root = tmp_path / "c"
    fill(root, StoreConfig(10**9))
    with CacheStore(root, StoreConfig(10**9, index_backend="exact")) as s:
        assert s.stats().index_backend == "exact"
        exact = answers(s)
    with CacheStore(root, StoreConfig(10**9, index_backend="hnsw")) as s:
        assert s.stats().index_backend == "hnsw"
        assert answers(s) == exact  # 36 entries: hnswlib's search (ef 64) reaches every one
    assert sum(a[0] for a in exact) >= 4 and not all(a[0] for a in exact)  # hits and misses compared


@pytest.mark.parametrize("first, second", [("hnsw", "exact"), ("exact", "hnsw"), ("hnsw", "auto")])
def test_persisted_store_reopens_under_the_other_backend(tmp_path, first, second):
    pytest.importorskip("hnswlib")
    root = tmp_path / "c"
    ids = fill(root, StoreConfig(10**9, index_backend=first))
    with CacheStore(root, StoreConfig(10**9, index_backend=second)) as s:
        assert s.stats().index_backend == ("exact" if second == "auto" else second)  # auto: small, so exact
        every_entry_found(s, ids)
        ids.append(s.insert("later", ents("grey wolf"), FP, latents(99), SIGMAS).entry_id)
    with CacheStore(root, StoreConfig(10**9, index_backend=first)) as s:
        every_entry_found(s, ids)
        assert s.lookup(ents("grey wolf"), FP, SHAPE, HitRule(THR), touch=False).entry.id == ids[-1]


def test_hnswlib_gone_between_runs_then_back(tmp_path, monkeypatch, caplog):
    pytest.importorskip("hnswlib")
    root = tmp_path / "c"
    ids = fill(root, StoreConfig(10**9, index_backend="hnsw"))   # the saved index is an hnswlib graph
    monkeypatch.setitem(sys.modules, "hnswlib", None)
    ann.forget()
    with caplog.at_level(logging.INFO), CacheStore(root, StoreConfig(10**9)) as s:
        assert s.stats().index_backend == "exact"
        every_entry_found(s, ids)
        ids.append(s.insert("later", ents("grey wolf"), FP, latents(99), SIGMAS).entry_id)
        s.flush()  # saved again, now as exact vectors
    assert any("hnswlib is not installed here" in r.getMessage() for r in caplog.records)
    monkeypatch.delitem(sys.modules, "hnswlib")
    ann.forget()
    with CacheStore(root, StoreConfig(10**9), index_kwargs={"hnsw_min_size": 10}) as s:
        assert s.stats().index_backend == "hnsw"  # hnswlib back: a large enough index moves to it again
        every_entry_found(s, ids)


def test_requirements_install_without_a_compiler():
    """hnswlib (no wheels) is an extra, not a requirement; the repo's own test setup still installs it."""
    reqs = [line.split(">")[0].split("=")[0].split("<")[0].strip().lower()
            for line in (REPO / "requirements.txt").read_text().splitlines() if line.strip()
            and not line.startswith("#")]
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    deps = [d.split(">")[0].split("=")[0].split("<")[0].strip().lower() for d in project["dependencies"]]
    assert "hnswlib" not in reqs and "hnswlib" not in deps and sorted(reqs) == sorted(deps)
    extras = project["optional-dependencies"]
    assert any(d.startswith("hnswlib") for d in extras["ann"]) and any(d.startswith("hnswlib")
                                                                        for d in extras["farm"])
    assert "hnswlib" in (REPO / "scripts" / "setup_venv.sh").read_text()
