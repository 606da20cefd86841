"""Tests for cache_store.index.vector_index.VectorIndex: both backends, switching, persistence and input checks."""
from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("hnswlib")

from comfyui_chai.cache_store.index.vector_index import DEFAULT_EF, HNSW_MIN_SIZE, IndexLoadError, VectorIndex  # noqa: E402

DIM = 32


def clustered(n: int, seed: int, dim: int = DIM, centres: int = 60) -> np.ndarray:
    """Unit vectors around random centres (embedding-like, unlike i.i.d. Gaussian data)."""
    rng = np.random.default_rng(seed)
    c = rng.standard_normal((centres, dim)).astype(np.float32)
    c /= np.linalg.norm(c, axis=1, keepdims=True)
    x = c[rng.integers(0, centres, n)] + 0.15 * rng.standard_normal((n, dim)).astype(np.float32)
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


def brute(labels: np.ndarray, vecs: np.ndarray, q: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Reference top-k by full sort."""
    sims = q @ vecs.T
    order = np.argsort(-sims, axis=1)[:, :k]
    return labels[order], np.take_along_axis(sims, order, axis=1)


@pytest.fixture(scope="module")
def data() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    labels = np.arange(2000, dtype=np.int64) * 7 + 2**40  # sparse, large ids
    return labels, clustered(2000, 0), clustered(60, 1)


def make(backend: str, labels: np.ndarray, vecs: np.ndarray, **kw) -> VectorIndex:
    ix = VectorIndex(DIM, backend=backend, **kw)
    ix.add(labels, vecs)
    return ix


@pytest.mark.parametrize("backend", ["exact", "hnsw"])
def test_top_k_matches_brute_force(data, backend):
    labels, vecs, qs = data
    ix = make(backend, labels, vecs)
    assert ix.backend == backend and len(ix) == len(labels)
    got_l, got_s = ix.query(qs, 10)
    ref_l, ref_s = brute(labels, vecs, qs, 10)
    assert got_l.shape == (len(qs), 10) and got_l.dtype == np.int64 and got_s.dtype == np.float32
    assert np.all(np.diff(got_s, axis=1) <= 1e-6)  # descending
    hits = sum(len(set(g) & set(r)) for g, r in zip(got_l.tolist(), ref_l.tolist()))
    if backend == "exact":
        assert hits == ref_l.size
        np.testing.assert_allclose(got_s, ref_s, atol=1e-5)
    else:
        assert hits / ref_l.size >= 0.99
    # returned similarities are the true cosines of the returned labels
    row_of = {lab: i for i, lab in enumerate(labels.tolist())}
    true = np.array([[vecs[row_of[lab]] @ q for lab in row] for row, q in zip(got_l.tolist(), qs)])
    np.testing.assert_allclose(got_s, true, atol=1e-5)


def test_hnsw_uses_default_ef_and_keeps_it_at_least_k(data):
    labels, vecs, qs = data
    ix = make("hnsw", labels[:300], vecs[:300])
    assert ix.ef == DEFAULT_EF and ix.hnsw.ef == DEFAULT_EF
    got_l, _ = ix.query(qs[:3], DEFAULT_EF + 20)  # k above ef still returns k true neighbours
    ref_l, _ = brute(labels[:300], vecs[:300], qs[:3], DEFAULT_EF + 20)
    assert all(set(g) == set(r) for g, r in zip(got_l.tolist(), ref_l.tolist()))
    assert ix.hnsw.ef == DEFAULT_EF  # restored after the wide query


@pytest.mark.parametrize("backend", ["exact", "hnsw"])
def test_readd_replaces_vector(data, backend):
    labels, vecs, _ = data
    ix = make(backend, labels[:200], vecs[:200])
    target, new_vec = int(labels[5]), vecs[1500]
    ix.add(np.array([target]), new_vec[None])
    assert len(ix) == 200
    got_l, got_s = ix.query(new_vec[None], 1)
    assert got_l[0, 0] == target and got_s[0, 0] == pytest.approx(1.0, abs=1e-5)
    got_l, got_s = ix.query(vecs[5][None], 1)
    assert got_l[0, 0] != target or got_s[0, 0] < 0.999
    if backend == "hnsw":
        assert ix.hnsw.element_count == 200


@pytest.mark.parametrize("backend", ["exact", "hnsw"])
def test_duplicate_labels_in_one_call_last_wins(backend):
    v = clustered(3, 3)
    ix = VectorIndex(DIM, backend=backend)
    ix.add(np.array([4, 4, 9]), v)
    assert len(ix) == 2
    l, s = ix.query(v[1][None], 1)
    assert l[0, 0] == 4 and s[0, 0] == pytest.approx(1.0, abs=1e-5)


@pytest.mark.parametrize("backend", ["exact", "hnsw"])
def test_remove_never_returns_removed_and_double_remove_is_harmless(data, backend):
    labels, vecs, _ = data
    ix = make(backend, labels[:500], vecs[:500])
    gone = labels[:500:3]
    ix.remove(gone)
    ix.remove(gone)  # second delete of the same labels: no error
    ix.remove([123, 456])  # unknown labels ignored
    keep = np.setdiff1d(labels[:500], gone)
    assert len(ix) == keep.size
    assert set(ix.labels().tolist()) == set(keep.tolist())
    assert int(gone[0]) not in ix and int(keep[0]) in ix and np.int64(keep[0]) in ix
    got_l, _ = ix.query(vecs[:500:3], 20)  # query with the removed vectors themselves
    assert not set(got_l.ravel().tolist()) & set(gone.tolist())
    # removed labels can come back with new vectors
    ix.add(gone[:5], vecs[1000:1005])
    got_l, got_s = ix.query(vecs[1000:1005], 1)
    assert got_l[:, 0].tolist() == gone[:5].tolist()
    assert np.allclose(got_s[:, 0], 1.0, atol=1e-5)


def test_hnsw_reuses_deleted_slots(data):
    labels, vecs, qs = data
    ix = make("hnsw", labels[:500], vecs[:500])
    cap = ix.hnsw.max_elements
    next_label = int(labels.max()) + 1
    for cycle in range(3):
        live = ix.labels()
        ix.remove(live[:200])
        fresh = np.arange(next_label, next_label + 200, dtype=np.int64)
        next_label += 200
        ix.add(fresh, vecs[500 + 200 * cycle : 700 + 200 * cycle])
        assert len(ix) == 500
        assert ix.hnsw.element_count == 500  # deleted slots were reused, the graph did not grow
        assert ix.hnsw.max_elements == cap
    live = np.sort(ix.labels())
    row_of = {lab: i for i, lab in enumerate(labels.tolist())}
    # the reused-slot labels map to vecs rows by construction: rebuild the live matrix to check results
    live_vecs = []
    first_new = int(labels.max()) + 1
    for lab in live.tolist():
        live_vecs.append(vecs[row_of[lab]] if lab in row_of else vecs[500 + lab - first_new])
    ref_l, _ = brute(live, np.array(live_vecs), qs, 5)
    got_l, _ = ix.query(qs, 5)
    hits = sum(len(set(g) & set(r)) for g, r in zip(got_l.tolist(), ref_l.tolist()))
    assert hits / ref_l.size >= 0.99


def test_hnsw_grows_in_place_beyond_capacity(data):
    labels, vecs, qs = data
    ix = VectorIndex(DIM, backend="hnsw")
    graph = ix.hnsw
    cap0 = graph.max_elements
    for start in range(0, 2000, 250):
        ix.add(labels[start : start + 250], vecs[start : start + 250])
    assert ix.hnsw is graph  # resized, not rebuilt
    assert graph.max_elements >= 2000 > cap0 and graph.element_count == 2000
    got_l, _ = ix.query(qs, 10)
    ref_l, _ = brute(labels, vecs, qs, 10)
    hits = sum(len(set(g) & set(r)) for g, r in zip(got_l.tolist(), ref_l.tolist()))
    assert hits / ref_l.size >= 0.99


def test_auto_switches_with_hysteresis(data):
    labels, vecs, qs = data
    ix = VectorIndex(DIM, hnsw_min_size=200)
    assert ix.backend == "exact"

    def check(live: np.ndarray) -> None:
        rows = np.searchsorted(labels, live)
        ref_l, _ = brute(live, vecs[rows], qs, 5)
        got_l, _ = ix.query(qs, 5)
        hits = sum(len(set(g) & set(r)) for g, r in zip(got_l.tolist(), ref_l.tolist()))
        assert hits / ref_l.size >= 0.99

    ix.add(labels[:199], vecs[:199])
    assert ix.backend == "exact"
    ix.add(labels[199:200], vecs[199:200])
    assert ix.backend == "hnsw" and len(ix) == 200
    check(labels[:200])
    ix.add(labels[200:400], vecs[200:400])
    ix.remove(labels[150:400])  # 150 left: below the switch size but inside the hysteresis band
    assert ix.backend == "hnsw"
    check(labels[:150])
    ix.add(labels[150:180], vecs[150:180])
    ix.remove(labels[99:180])  # 99 left: below half the switch size
    assert ix.backend == "exact" and len(ix) == 99
    check(labels[:99])
    ix.add(labels[99:190], vecs[99:190])  # 190: still below the switch size
    assert ix.backend == "exact"
    check(labels[:190])


def test_default_switch_size_is_sane():
    assert 100 <= HNSW_MIN_SIZE <= 100_000
    assert VectorIndex(DIM).hnsw_min_size == HNSW_MIN_SIZE


@pytest.mark.parametrize("backend", ["exact", "hnsw"])
def test_save_load_round_trip(data, tmp_path: Path, backend):
    labels, vecs, qs = data
    ix = make(backend, labels[:1200], vecs[:1200], ef=77)
    ix.remove(labels[:1200:4])
    path = tmp_path / "entities.idx"
    ix.save(path)
    assert [p.name for p in tmp_path.iterdir()] == ["entities.idx"]  # no temp files left behind
    back = VectorIndex.load(path, DIM, backend=backend)
    assert back.backend == backend and len(back) == len(ix)
    assert set(back.labels().tolist()) == set(ix.labels().tolist())
    assert back.ef == 77
    if backend == "hnsw":
        assert back.hnsw.ef == 77 and back.hnsw.element_count == ix.hnsw.element_count
    a_l, a_s = ix.query(qs, 8)
    b_l, b_s = back.query(qs, 8)
    np.testing.assert_array_equal(a_l, b_l)
    np.testing.assert_allclose(a_s, b_s, atol=1e-6)
    # the loaded index keeps working: removed labels stay out, deleted slots are reused
    assert not set(b_l.ravel().tolist()) & set(labels[:1200:4].tolist())
    back.add(np.arange(10**6, 10**6 + 100), vecs[1500:1600])
    assert len(back) == len(ix) + 100
    if backend == "hnsw":
        assert back.hnsw.element_count == 1200
    assert VectorIndex.load(path, DIM, backend=backend, ef=20).ef == 20


def test_save_overwrites_and_auto_load_follows_count(data, tmp_path: Path):
    labels, vecs, _ = data
    path = tmp_path / "idx"
    make("hnsw", labels[:300], vecs[:300]).save(path)
    make("exact", labels[:50], vecs[:50]).save(path)
    back = VectorIndex.load(path, DIM)
    assert len(back) == 50 and back.backend == "exact"
    make("hnsw", labels[:30], vecs[:30]).save(path)
    assert VectorIndex.load(path, DIM, hnsw_min_size=100).backend == "exact"  # below the hysteresis band
    assert VectorIndex.load(path, DIM, backend="hnsw").backend == "hnsw"


@pytest.mark.parametrize("backend", ["exact", "hnsw"])
def test_empty_index_round_trip(tmp_path: Path, backend):
    path = tmp_path / "empty.idx"
    VectorIndex(DIM, backend=backend).save(path)
    back = VectorIndex.load(path, DIM, backend=backend)
    assert len(back) == 0
    l, s = back.query(clustered(2, 5), 3)
    assert l.shape == (2, 3) and (l == -1).all() and np.isneginf(s).all()


@pytest.mark.parametrize("backend", ["exact", "hnsw"])
def test_bad_files_raise_index_load_error(data, tmp_path: Path, backend):
    labels, vecs, _ = data
    path = tmp_path / "i.idx"
    make(backend, labels[:300], vecs[:300]).save(path)
    good = path.read_bytes()

    with pytest.raises(IndexLoadError):
        VectorIndex.load(tmp_path / "missing.idx", DIM)
    with pytest.raises(IndexLoadError):
        VectorIndex.load(path, DIM + 1)  # dim mismatch

    def bad(blob: bytes) -> None:
        path.write_bytes(blob)
        with pytest.raises(IndexLoadError):
            VectorIndex.load(path, DIM)

    bad(b"")
    bad(good[:10])
    bad(good[: len(good) // 2])  # truncated
    bad(good[:-1])
    bad(good + b"\0")  # trailing bytes
    flipped = bytearray(good)
    flipped[-100] ^= 0xFF  # corrupt payload
    bad(bytes(flipped))
    bad(b"XXXXXXXX" + good[8:])  # wrong magic
    bad(good.replace(b'"version": 1', b'"version": 9'))  # unknown format version
    bad(good.replace(b'"format": "chai-vector-index"', b'"format": "chai-vector-indey"'))
    path.write_bytes(good)
    assert len(VectorIndex.load(path, DIM)) == 300


@pytest.mark.parametrize("backend", ["exact", "hnsw"])
def test_input_validation(backend):
    ix = VectorIndex(DIM, backend=backend)
    v = clustered(2, 6)
    for poison in (np.nan, np.inf, -np.inf):
        w = v.copy()
        w[1, 3] = poison
        with pytest.raises(ValueError):
            ix.add(np.array([1, 2]), w)
        with pytest.raises(ValueError):
            ix.query(w, 1)
    assert len(ix) == 0  # a rejected batch adds nothing
    with pytest.raises(ValueError):
        ix.add(np.array([1, 2]), np.zeros((2, DIM), np.float32))
    with pytest.raises(ValueError):
        ix.add(np.array([1]), v)  # count mismatch
    with pytest.raises(ValueError):
        ix.add(np.array([1, 2]), v[:, :-1])  # wrong dim
    with pytest.raises(ValueError):
        ix.add(np.array([-1, 2]), v)  # -1 is reserved for padding
    with pytest.raises(ValueError):
        ix.add(np.array([1.5, 2.0]), v)
    with pytest.raises(ValueError):
        ix.query(v, -1)
    with pytest.raises(ValueError):
        VectorIndex(DIM, backend="faiss")
    with pytest.raises(ValueError):
        VectorIndex(0)


@pytest.mark.parametrize("backend", ["exact", "hnsw"])
def test_normalises_and_pads(backend):
    ix = VectorIndex(DIM, backend=backend)
    v = clustered(3, 7)
    ix.add(np.array([10, 20, 30]), v * np.array([[3.0], [0.5], [7.0]], dtype=np.float32))
    l, s = ix.query(v[:1] * 9.0, 5)
    assert l.shape == (1, 5)
    assert l[0, 0] == 10 and s[0, 0] == pytest.approx(1.0, abs=1e-5)
    assert sorted(l[0, :3].tolist()) == [10, 20, 30]
    assert (l[0, 3:] == -1).all() and np.isneginf(s[0, 3:]).all()
    assert (s[0, :3] <= 1.0).all()
    l0, s0 = ix.query(v[:2], 0)
    assert l0.shape == (2, 0) and s0.shape == (2, 0)
    le, _ = VectorIndex(DIM, backend=backend).query(v[0], 4)  # 1-D query, empty index
    assert le.shape == (1, 4) and (le == -1).all()


def test_hnsw_heavy_deletion_still_returns_all_live(data):
    labels, vecs, qs = data
    ix = make("hnsw", labels[:400], vecs[:400], ef=10)
    ix.remove(labels[:390])
    l, s = ix.query(qs[:4], 16)
    for row in l.tolist():
        assert sorted(x for x in row if x != -1) == sorted(labels[390:400].tolist())
    assert (l[:, 10:] == -1).all()


def test_concurrent_adds_and_queries(data):
    labels, vecs, qs = data
    ix = VectorIndex(DIM, hnsw_min_size=300)
    errors: list[BaseException] = []

    def worker(part: int) -> None:
        try:
            for start in range(part * 400, part * 400 + 400, 40):
                ix.add(labels[start : start + 40], vecs[start : start + 40])
                ix.query(qs[:3], 5)
        except BaseException as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(p,)) for p in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert len(ix) == 1600 and ix.backend == "hnsw"
    assert set(ix.labels().tolist()) == set(labels[:1600].tolist())


class _ShortSearch:
    """Wraps an hnswlib index whose knn_query fails like hnswlib does when it reaches fewer than k live items."""

    def __init__(self, index, works_from_ef: int | None) -> None:
        self._index, self._works_from_ef, self._ef = index, works_from_ef, index.ef

    def set_ef(self, ef: int) -> None:
        self._ef = ef
        self._index.set_ef(ef)

    def knn_query(self, q, k, num_threads=1):
        if self._works_from_ef is None or self._ef < self._works_from_ef:
            raise RuntimeError("Cannot return the results in a contiguous 2D array. Probably ef or M is too small")
        return self._index.knn_query(q, k=k, num_threads=num_threads)

    def __getattr__(self, name):
        return getattr(self._index, name)


@pytest.mark.parametrize("works_from_ef", [300, None])  # wider retry works; only exact works
def test_hnsw_query_recovers_when_search_comes_up_short(data, works_from_ef):
    labels, vecs, qs = data
    ix = make("hnsw", labels[:400], vecs[:400])
    ix.remove(labels[:200])
    impl = ix._impl  # white-box: simulate the rare short search on the real graph
    impl.index = _ShortSearch(impl.index, works_from_ef)
    got_l, got_s = ix.query(qs[:3], 8)
    ref_l, ref_s = brute(labels[200:400], vecs[200:400], qs[:3], 8)
    np.testing.assert_array_equal(got_l, ref_l)
    np.testing.assert_allclose(got_s, ref_s, atol=1e-5)
    assert impl.index._ef == ix.ef  # search width restored afterwards
