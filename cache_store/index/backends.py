"""The two search backends behind VectorIndex: exact numpy search and hnswlib, plus input checks."""
from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np

_ROWWISE_MAX_QUERIES = 16
# Up to this many vectors a BLAS matrix-vector product runs on one thread and beats einsum 2-3x (647 identity
# points, 6 queries: 0.10 / 0.53 ms p50 / p99 against 0.28 / 1.47, the other core busy or not; 1,024: 0.15 / 0.77);
# at 1,500 OpenBLAS threads it, and its p99 with the other core busy went to 8 ms (measured 2026-12-02, 2 cores).
_GEMV_MAX_VECTORS = 1024


def _as_labels(labels: Any) -> np.ndarray:
    """Return labels as a 1-D int64 array, rejecting non-integers and negative ids."""
    arr = np.asarray(labels)
    if arr.ndim == 0:
        arr = arr.reshape(1)
    if arr.ndim != 1:
        raise ValueError(f"labels must be 1-D, got shape {arr.shape}")
    if arr.size == 0:
        return np.zeros(0, dtype=np.int64)
    if arr.dtype.kind not in "iu":
        raise ValueError(f"labels must be integers, got dtype {arr.dtype}")
    if arr.dtype.kind == "u" and arr.max() > np.iinfo(np.int64).max:
        raise ValueError("labels must fit in int64")
    arr = arr.astype(np.int64, copy=False)
    if arr.min() < 0:
        raise ValueError("labels must be non-negative (-1 is the padding value)")
    return arr


def _as_unit_rows(vectors: Any, dim: int) -> np.ndarray:
    """Return vectors as a C-contiguous (n, dim) float32 array of unit rows; ValueError on bad input."""
    arr = np.asarray(vectors, dtype=np.float32)
    if arr.ndim == 1:
        arr = arr.reshape(1, -1)
    if arr.ndim != 2 or arr.shape[1] != dim:
        raise ValueError(f"vectors must have shape (n, {dim}), got {np.shape(vectors)}")
    if not np.isfinite(arr).all():
        raise ValueError("vectors contain NaN or infinity")
    norms = np.linalg.norm(arr, axis=1, keepdims=True)
    if arr.shape[0] and not (norms > 1e-12).all():
        raise ValueError("vectors contain a zero row, which has no direction")
    return np.ascontiguousarray(arr / norms, dtype=np.float32)


def _last_occurrence(labels: np.ndarray) -> np.ndarray:
    """Indices keeping the last occurrence of each label (a later row replaces an earlier one)."""
    if labels.size < 2:
        return np.arange(labels.size)
    _, first_in_reversed = np.unique(labels[::-1], return_index=True)
    return np.sort(labels.size - 1 - first_in_reversed)


def _top_k(sims: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Row-wise indices and values of the k largest entries, sorted descending (k <= sims.shape[1])."""
    if sims.shape[0] <= _ROWWISE_MAX_QUERIES and 0 < k < sims.shape[1]:
        # A prompt's few rows one at a time: the same partition and stable sort per row as below, without
        # take_along_axis's index building (0.16 -> 0.05 ms for 2 rows of 642).
        idx = np.empty((sims.shape[0], k), np.int64)
        vals = np.empty((sims.shape[0], k), sims.dtype)
        for i, row in enumerate(sims):
            part = np.argpartition(-row, k - 1)[:k]
            got = row[part]
            order = np.argsort(-got, kind="stable")
            idx[i], vals[i] = part[order], got[order]
        return idx, vals
    if k < sims.shape[1]:
        part = np.argpartition(-sims, k - 1, axis=1)[:, :k]
    else:
        part = np.broadcast_to(np.arange(sims.shape[1]), sims.shape)
    vals = np.take_along_axis(sims, part, axis=1)
    order = np.argsort(-vals, axis=1, kind="stable")
    return np.take_along_axis(part, order, axis=1), np.take_along_axis(vals, order, axis=1)


class _Exact:
    """Brute-force backend: a contiguous float32 matrix, its labels, and a label -> row map."""

    kind = "exact"

    def __init__(self, dim: int, capacity: int = 64) -> None:
        self.dim = dim
        self._mat = np.zeros((max(capacity, 1), dim), dtype=np.float32)
        self._lab = np.zeros(max(capacity, 1), dtype=np.int64)
        self._row: dict[int, int] = {}

    def __len__(self) -> int:
        return len(self._row)

    def __contains__(self, label: int) -> bool:
        return label in self._row

    def labels(self) -> np.ndarray:
        return self._lab[: len(self._row)].copy()

    def vectors(self) -> tuple[np.ndarray, np.ndarray]:
        n = len(self._row)
        return self._lab[:n].copy(), self._mat[:n].copy()

    def _reserve(self, total: int) -> None:
        cap = self._mat.shape[0]
        if total <= cap:
            return
        new_cap = max(total, cap * 2)
        mat = np.zeros((new_cap, self.dim), dtype=np.float32)
        lab = np.zeros(new_cap, dtype=np.int64)
        n = len(self._row)
        mat[:n] = self._mat[:n]
        lab[:n] = self._lab[:n]
        self._mat, self._lab = mat, lab

    def add(self, labels: np.ndarray, vectors: np.ndarray) -> None:
        rows = np.empty(labels.size, dtype=np.int64)
        n = len(self._row)
        new = [i for i, lab in enumerate(labels.tolist()) if lab not in self._row]
        self._reserve(n + len(new))
        for i, lab in enumerate(labels.tolist()):
            row = self._row.get(lab)
            if row is None:
                row = self._row[lab] = n
                self._lab[n] = lab
                n += 1
            rows[i] = row
        self._mat[rows] = vectors

    def remove(self, labels: Iterable[int]) -> None:
        for lab in labels:
            row = self._row.pop(lab, None)
            if row is None:
                continue
            last = len(self._row)  # index of the last occupied row after the pop
            if row != last:
                moved = int(self._lab[last])
                self._mat[row] = self._mat[last]
                self._lab[row] = moved
                self._row[moved] = row
        n = len(self._row)
        if self._mat.shape[0] > 1024 and n < self._mat.shape[0] // 4:
            self._mat = self._mat[: max(n * 2, 64)].copy()
            self._lab = self._lab[: self._mat.shape[0]].copy()

    def query(self, q: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        n = len(self._row)
        mat = self._mat[:n]
        if q.shape[0] <= _ROWWISE_MAX_QUERIES:
            # Row by row rather than one gemm: gemm packs the whole (n, dim) matrix on every call (1.2 ms vs 8 ms
            # for 3 queries over 10k vectors), and OpenBLAS threads a matrix-vector product as small as 5k x 384,
            # which stalled for 8-12 ms per call whenever the other core was busy (einsum: 0.46 ms); below
            # _GEMV_MAX_VECTORS that product stays on one thread and is the fastest.
            sims = np.empty((q.shape[0], n), dtype=np.float32)
            small = n <= _GEMV_MAX_VECTORS
            for i in range(q.shape[0]):
                if small:
                    np.matmul(mat, q[i], out=sims[i])
                else:
                    np.einsum("ij,j->i", mat, q[i], out=sims[i])
        else:
            sims = q @ mat.T
        idx, vals = _top_k(sims, min(k, n))
        return self._lab[idx], vals


class _Hnsw:
    """hnswlib backend: cosine space, deleted slots reused, capacity grown in place with resize_index."""

    kind = "hnsw"

    def __init__(self, dim: int, *, M: int, ef_construction: int, ef: int, num_threads: int,
                 capacity: int = 1024, index: Any = None, live: Iterable[int] = ()) -> None:
        import hnswlib

        self.dim = dim
        self.num_threads = num_threads
        self.ef = ef
        if index is None:
            index = hnswlib.Index(space="cosine", dim=dim)
            index.init_index(max_elements=max(capacity, 16), M=M, ef_construction=ef_construction,
                             allow_replace_deleted=True)
        self.index = index
        self.index.set_ef(ef)
        self._live: set[int] = set(int(x) for x in live)

    def __len__(self) -> int:
        return len(self._live)

    def __contains__(self, label: int) -> bool:
        return label in self._live

    @property
    def n_deleted(self) -> int:
        return self.index.element_count - len(self._live)

    def labels(self) -> np.ndarray:
        return np.fromiter(self._live, dtype=np.int64, count=len(self._live))

    def vectors(self) -> tuple[np.ndarray, np.ndarray]:
        labs = np.sort(self.labels())
        if labs.size == 0:
            return labs, np.zeros((0, self.dim), dtype=np.float32)
        vecs = np.asarray(self.index.get_items(labs.tolist(), return_type="numpy"), dtype=np.float32)
        return labs, vecs

    def set_ef(self, ef: int) -> None:
        self.ef = ef
        self.index.set_ef(ef)

    def add(self, labels: np.ndarray, vectors: np.ndarray) -> None:
        update = np.zeros(labels.size, dtype=bool)
        maybe_deleted = self.n_deleted > 0
        for i, lab in enumerate(labels.tolist()):
            if lab in self._live:
                update[i] = True
            elif maybe_deleted:
                # A label deleted earlier whose slot has not been reused yet is still in the graph: revive it and
                # overwrite its vector. hnswlib refuses a plain re-add of a deleted label, and re-adding it into
                # another slot would leave two slots under one label.
                try:
                    self.index.unmark_deleted(lab)
                except RuntimeError:
                    continue
                self._live.add(lab)
                update[i] = True
        nt = self.num_threads
        if update.any():
            # add_items on a live label updates its vector in place (replace_deleted must be off for that).
            self.index.add_items(vectors[update], labels[update], num_threads=nt, replace_deleted=False)
        new = ~update
        n_new = int(new.sum())
        if n_new:
            needed = self.index.element_count + max(0, n_new - self.n_deleted)
            if needed > self.index.max_elements:
                self.index.resize_index(max(needed, self.index.max_elements * 2))
            self.index.add_items(vectors[new], labels[new], num_threads=nt, replace_deleted=True)
            self._live.update(labels[new].tolist())

    def remove(self, labels: Iterable[int]) -> None:
        for lab in labels:
            if lab in self._live:
                self.index.mark_deleted(lab)
                self._live.discard(lab)

    def query(self, q: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        k = min(k, len(self._live))
        if k == 0:
            return np.zeros((q.shape[0], 0), dtype=np.int64), np.zeros((q.shape[0], 0), dtype=np.float32)
        # hnswlib searches with max(ef, k) itself; threads only pay off for larger batches.
        nt = 1 if q.shape[0] < 64 else self.num_threads
        try:
            labs, dist = self.index.knn_query(q, k=k, num_threads=nt)
        except RuntimeError:
            # Fewer than k live neighbours were reached (possible after many deletions): retry row by row.
            rows = [self._query_row(q[i : i + 1], k) for i in range(q.shape[0])]
            return np.vstack([r[0] for r in rows]), np.vstack([r[1] for r in rows])
        return labs.astype(np.int64), (1.0 - dist).astype(np.float32)

    def _query_row(self, q: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        try:
            for ef in (max(4 * self.ef, 4 * k), self.index.element_count):
                self.index.set_ef(ef)
                try:
                    labs, dist = self.index.knn_query(q, k=k, num_threads=1)
                    return labs.astype(np.int64), (1.0 - dist).astype(np.float32)
                except RuntimeError:
                    continue
        finally:
            self.index.set_ef(self.ef)
        # Last resort: exact search over the stored vectors.
        all_labs, vecs = self.vectors()
        idx, vals = _top_k(q @ vecs.T, k)
        return all_labs[idx], vals
