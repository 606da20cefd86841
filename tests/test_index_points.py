"""One index point per identity: the map from stored entities to points, and searches read back per text."""
from __future__ import annotations

import numpy as np
import pytest

from comfyui_chai.cache_store.index.backends import _as_unit_rows
from comfyui_chai.cache_store.index.points import EntityPoints, PointMap
from comfyui_chai.cache_store.index.vector_index import VectorIndex

DIM = 8


def unit(rng: np.random.Generator, n: int) -> np.ndarray:
    return _as_unit_rows(rng.standard_normal((n, DIM)), DIM)


def pts(ids, vectors, identities) -> EntityPoints:
    return EntityPoints(np.asarray(ids, np.int64), np.asarray(vectors, np.float32), list(identities))


def test_texts_of_one_identity_share_a_point_labelled_by_the_smallest_id():
    rng = np.random.default_rng(0)
    car, dog = unit(rng, 2)
    pm = PointMap()
    edit = pm.add(pts([5, 3, 9], [car, car, dog], [("", "car"), ("", "car"), ("", "dog")]))
    assert pm.labels() == {3, 9} and len(pm) == 2
    assert pm.size(3) == 2 and pm.size(9) == 1 and pm.size(5) == 0
    labels, vectors = edit.arrays(DIM)
    assert sorted(labels.tolist()) == [3, 9]
    assert np.allclose(vectors[labels.tolist().index(3)], car)
    assert edit.removed == [5]  # 5 was a point until 3 joined it in the same call
    assert pm.add(pts([3], [car], [("", "car")])).added == {}  # already here: nothing changes


def test_removing_the_labelled_text_moves_the_point_to_the_next_one():
    rng = np.random.default_rng(1)
    car = unit(rng, 1)[0]
    pm = PointMap()
    pm.add(pts([1, 2, 4], [car] * 3, [("", "car")] * 3))
    edit = pm.remove([1])
    assert edit.removed == [1] and list(edit.added) == [2] and pm.size(2) == 2
    edit = pm.remove([4, 77])  # 77 is unknown
    assert edit.removed == [] and edit.added == {} and pm.size(2) == 1
    edit = pm.remove([2])
    assert edit.removed == [2] and edit.added == {} and len(pm) == 0


def test_format_v1_rows_and_other_vectors_keep_points_of_their_own():
    rng = np.random.default_rng(2)
    a, b = unit(rng, 2)
    pm = PointMap()
    pm.add(pts([1, 2, 3, 4], [a, a, a, b], [None, None, ("", "car"), ("", "car")]))
    assert pm.labels() == {1, 2, 3, 4}  # v1 rows name no identity; one identity with two vectors is two points


@pytest.mark.parametrize("seed", range(6))
def test_search_read_back_per_text_finds_the_identities_of_a_per_text_search(seed):
    """Exact search over one point per identity, cut at k texts, names the same identities at the same
    similarities as exact search over one point per text."""
    rng = np.random.default_rng(seed)
    n_ids = int(rng.integers(5, 60))
    ident_vecs = unit(rng, n_ids)
    counts = rng.integers(1, 12, n_ids)
    ids, vecs, idents = [], [], []
    eid = 0
    for i, c in enumerate(counts):
        for _ in range(c):
            eid += int(rng.integers(1, 3))
            ids.append(eid)
            vecs.append(ident_vecs[i])
            idents.append(("", f"thing{i}"))
    order = rng.permutation(len(ids))
    ids, vecs, idents = [ids[i] for i in order], [vecs[i] for i in order], [idents[i] for i in order]
    ident_of = dict(zip(ids, idents))
    per_text = VectorIndex(DIM, backend="exact")
    per_text.add(np.asarray(ids), np.asarray(vecs))
    pm = PointMap()
    edit = pm.add(pts(ids, vecs, idents))
    per_point = VectorIndex(DIM, backend="exact")
    per_point.add(*edit.arrays(DIM))
    # Churn: drop a third of the texts from both, applying the edit the way the keeper does.
    gone = [i for i in ids if rng.random() < 0.33]
    per_text.remove(gone)
    edit = pm.remove(gone)
    per_point.remove(edit.removed)
    if edit.added:
        per_point.add(*edit.arrays(DIM))
    assert set(per_point.labels().tolist()) == pm.labels()
    queries = unit(rng, 20)
    for k in (1, 4, 16):
        if len(per_text) == 0:
            break
        want_l, want_s = per_text.query(queries, min(k, len(per_text)))
        got_l, got_s = pm.nearest_texts(*per_point.query(queries, min(k, len(per_point))), k)
        for row in range(len(queries)):
            want = {(ident_of[int(lab)], round(float(s), 5)) for lab, s in zip(want_l[row], want_s[row]) if lab >= 0}
            got = {(ident_of[int(lab)], round(float(s), 5)) for lab, s in zip(got_l[row], got_s[row]) if lab >= 0}
            assert got == want


def test_an_id_that_comes_back_as_another_thing_moves_to_its_new_point():
    rng = np.random.default_rng(3)
    car, dog = unit(rng, 2)
    pm = PointMap()
    pm.add(pts([1, 2], [car, car], [("", "car")] * 2))
    edit = pm.add(pts([1], [dog], [("", "dog")]))  # a restored cache handing id 1 out again
    assert pm.labels() == {1, 2} and pm.size(1) == 1 and pm.size(2) == 1
    assert 1 in edit.removed and set(edit.added) == {1, 2}
    assert np.allclose(edit.added[1], dog) and np.allclose(edit.added[2], car)
