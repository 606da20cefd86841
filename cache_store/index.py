"""Cosine vector index over distinct entity vectors: exact numpy search while small, hnswlib once large.

Labels are non-negative int64 entity ids. Similarities are cosines in [-1, 1], sorted descending. Query results
always have shape (m, k); slots past the available matches hold label -1 and similarity -inf (an empty index
returns only padding). The index is derived state: ``load`` raises ``IndexLoadError`` for anything it cannot
trust, and the store then rebuilds it from the manifest.

On-disk format (one file, replaced atomically): 8-byte magic, little-endian u64 header length, a UTF-8 JSON
header, then sections whose byte lengths and CRC32s the header records: the live labels (<i8), then either the
row-major vectors (<f4, exact backend) or the bytes hnswlib's ``save_index`` wrote (hnsw backend). No pickle.
"""
from __future__ import annotations

import json
import os
import struct
import tempfile
import threading
import zlib
from collections.abc import Iterable
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

# Switch point and search width, measured with bench/bench_index.py on the 2-core dev machine: 384-d clustered
# embedding-like data, k=16, M=16, ef_construction=100, one query thread, CPU time per call (wall-clock tails on
# that shared machine were scheduler preemption), ratio = exact / hnsw at ef=96:
#   size      exact p50 / p99    hnsw p50 / p99    ratio p50   (batch of 3 vectors)
#   1k        0.18 / 0.37 ms     0.19 / 0.34 ms    0.97        0.83
#   2k        0.30 / 0.55 ms     0.26 / 0.45 ms    1.16        1.09
#   4k        0.62 / 0.79 ms     0.43 / 0.55 ms    1.44        1.51
#   10k       1.29 / 2.34 ms     0.65 / 0.89 ms    1.98        2.51
#   100k      20.3 / 23.4 ms     0.39 / 0.67 ms    ~40         ~40
# hnsw overtakes exact search at about 1.5k-2k vectors. "auto" keeps hnsw down to half the switch size, so the
# switch size is twice that crossover: hnsw is then never slower than exact search while it is in use.
HNSW_MIN_SIZE = 4000
# Graph and search width, measured on real data: MiniLM vectors of 60,640 distinct VBench-derived entities
# (bench/bench_store_scale.py builds them), 1,000 noisy stored vectors as queries, 2 query rows per call
# (a prompt's entities), one thread, recall of hnswlib against exact search:
#   M / ef_construction   ef   recall@16  recall@32  p50 / p99 per call
#   16 / 100              128  -          0.939      1.01 / 1.50 ms
#   16 / 200              128  -          0.985      1.37 / 1.84 ms
#   32 / 200               48  0.991      -          0.54 / 0.91 ms
#   32 / 200               64  0.993      0.988      0.66-0.74 / 0.91-1.17 ms (second figure: machine under load)
#   32 / 200               96  -          0.991      0.96 / 1.30 ms
# At 4,000 vectors M=32/200 gives recall@32 0.998 at ef=64. Clustered synthetic data (bench/bench_index.py) is
# easier than real embeddings and had suggested M=16/100; the real vectors decide. Building costs ~1 ms per
# vector at this M (60k in 55-60 s on 2 cores), paid once: the index is persisted and grown incrementally.
DEFAULT_EF = 64
DEFAULT_M = 32
DEFAULT_EF_CONSTRUCTION = 200
# "auto" switches back to exact only below this fraction of hnsw_min_size, so churn near the switch point does
# not rebuild the index back and forth.
SHRINK_FRACTION = 0.5

BACKENDS = ("auto", "exact", "hnsw")
FORMAT_NAME = "chai-vector-index"
FORMAT_VERSION = 1
_MAGIC = b"CHAIVIDX"
_U64 = struct.Struct("<Q")
_MAX_HEADER = 1 << 20
_CHUNK = 1 << 22
_ROWWISE_MAX_QUERIES = 16


class IndexLoadError(RuntimeError):
    """A saved index is missing, truncated, corrupt or does not match the requested dimension or format."""


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
            # Row by row with einsum rather than BLAS: gemm packs the whole (n, dim) matrix on every call (1.2 ms
            # vs 8 ms for 3 queries over 10k vectors), and OpenBLAS threads a matrix-vector product as small as
            # 5k x 384, which stalled for 8-12 ms per call whenever the other core was busy (einsum: 0.46 ms).
            sims = np.empty((q.shape[0], n), dtype=np.float32)
            for i in range(q.shape[0]):
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


class VectorIndex:
    """Cosine index over distinct entity vectors, labels are int64 entity ids; exact numpy below a measured size,
    hnswlib above."""

    def __init__(self, dim: int, *, hnsw_min_size: int = HNSW_MIN_SIZE, ef: int = DEFAULT_EF, M: int = DEFAULT_M,
                 backend: str = "auto", ef_construction: int = DEFAULT_EF_CONSTRUCTION, num_threads: int = -1) -> None:
        if not isinstance(dim, int) or dim < 1:
            raise ValueError(f"dim must be a positive int, got {dim!r}")
        if backend not in BACKENDS:
            raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
        if not isinstance(hnsw_min_size, int) or hnsw_min_size < 2:
            raise ValueError(f"hnsw_min_size must be an int >= 2, got {hnsw_min_size!r}")
        if not isinstance(ef, int) or ef < 1:
            raise ValueError(f"ef must be a positive int, got {ef!r}")
        if not isinstance(M, int) or M < 2:
            raise ValueError(f"M must be an int >= 2, got {M!r}")
        if not isinstance(ef_construction, int) or ef_construction < 1:
            raise ValueError(f"ef_construction must be a positive int, got {ef_construction!r}")
        if not isinstance(num_threads, int) or num_threads == 0 or num_threads < -1:
            raise ValueError(f"num_threads must be -1 (all cores) or a positive int, got {num_threads!r}")
        self.dim = dim
        self.mode = backend
        self.hnsw_min_size = hnsw_min_size
        self.M = M
        self.ef_construction = ef_construction
        self.num_threads = num_threads
        self._ef = ef
        self._lock = threading.RLock()
        self._impl: _Exact | _Hnsw = self._new_hnsw(0) if backend == "hnsw" else _Exact(dim)

    # -- introspection -------------------------------------------------------------------------------------------
    @property
    def backend(self) -> str:
        """The backend in use now: "exact" or "hnsw"."""
        return self._impl.kind

    @property
    def ef(self) -> int:
        """Search width of the hnsw backend (kept while exact, applied when hnsw is built or loaded)."""
        return self._ef

    @ef.setter
    def ef(self, value: int) -> None:
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"ef must be a positive int, got {value!r}")
        with self._lock:
            self._ef = value
            if isinstance(self._impl, _Hnsw):
                self._impl.set_ef(value)

    @property
    def hnsw(self) -> Any:
        """The underlying hnswlib.Index while the hnsw backend is active, else None (for inspection and tests)."""
        return self._impl.index if isinstance(self._impl, _Hnsw) else None

    def __len__(self) -> int:
        with self._lock:
            return len(self._impl)

    def __contains__(self, label: object) -> bool:
        try:
            key = int(label)  # type: ignore[call-overload]
        except (TypeError, ValueError):
            return False
        with self._lock:
            return key in self._impl

    def labels(self) -> np.ndarray:
        """Live labels as an int64 array (no particular order)."""
        with self._lock:
            return self._impl.labels()

    def __repr__(self) -> str:
        return f"VectorIndex(dim={self.dim}, backend={self.backend!r}, mode={self.mode!r}, n={len(self)})"

    # -- mutation ------------------------------------------------------------------------------------------------
    def add(self, labels: np.ndarray, vectors: np.ndarray) -> None:
        """Add or replace vectors under the given labels; within one call a later duplicate label wins."""
        labs = _as_labels(labels)
        vecs = _as_unit_rows(vectors, self.dim)
        if labs.size != vecs.shape[0]:
            raise ValueError(f"{labs.size} labels for {vecs.shape[0]} vectors")
        if labs.size == 0:
            return
        keep = _last_occurrence(labs)
        if keep.size != labs.size:
            labs, vecs = labs[keep], vecs[keep]
        with self._lock:
            if self.mode == "auto" and isinstance(self._impl, _Exact):
                n_new = sum(1 for lab in labs.tolist() if lab not in self._impl)
                if len(self._impl) + n_new >= self.hnsw_min_size:
                    self._impl.add(labs, vecs)
                    self._switch_to_hnsw()
                    return
            self._impl.add(labs, vecs)

    def remove(self, labels: Iterable[int]) -> None:
        """Remove labels; unknown or already removed labels are ignored."""
        keys = [int(x) for x in (labels.ravel().tolist() if isinstance(labels, np.ndarray) else labels)]
        with self._lock:
            self._impl.remove(keys)
            self._rebalance()

    def compact(self) -> None:
        """Rebuild the hnsw graph from the live vectors, dropping deleted slots (useful after heavy churn)."""
        with self._lock:
            if isinstance(self._impl, _Hnsw):
                self._switch_to_hnsw()

    # -- search --------------------------------------------------------------------------------------------------
    def query(self, vectors: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """Top-k labels (m, k) int64 and cosine similarities (m, k) float32, descending; padded with -1 / -inf."""
        if not isinstance(k, (int, np.integer)) or k < 0:
            raise ValueError(f"k must be a non-negative int, got {k!r}")
        k = int(k)
        q = _as_unit_rows(vectors, self.dim)
        m = q.shape[0]
        out_l = np.full((m, k), -1, dtype=np.int64)
        out_s = np.full((m, k), -np.inf, dtype=np.float32)
        if m == 0 or k == 0:
            return out_l, out_s
        with self._lock:
            if len(self._impl) == 0:
                return out_l, out_s
            if isinstance(self._impl, _Hnsw) and k > self._ef:
                self._impl.set_ef(k)
                try:
                    labs, sims = self._impl.query(q, k)
                finally:
                    self._impl.set_ef(self._ef)
            else:
                labs, sims = self._impl.query(q, k)
        kk = labs.shape[1]
        out_l[:, :kk] = labs
        out_s[:, :kk] = np.clip(sims, -1.0, 1.0)
        return out_l, out_s

    # -- backend switching ---------------------------------------------------------------------------------------
    def _new_hnsw(self, n: int) -> _Hnsw:
        return _Hnsw(self.dim, M=self.M, ef_construction=self.ef_construction, ef=self._ef,
                     num_threads=self.num_threads, capacity=max(1024, 2 * n))

    def _switch_to_hnsw(self) -> None:
        labs, vecs = self._impl.vectors()
        impl = self._new_hnsw(labs.size)
        if labs.size:
            impl.add(labs, vecs)
        self._impl = impl

    def _switch_to_exact(self) -> None:
        labs, vecs = self._impl.vectors()
        impl = _Exact(self.dim, capacity=max(64, 2 * labs.size))
        if labs.size:
            impl.add(labs, vecs)
        self._impl = impl

    def _rebalance(self) -> None:
        """Move to the backend the mode asks for, with hysteresis in "auto"."""
        n = len(self._impl)
        if self.mode == "exact" or (self.mode == "auto" and isinstance(self._impl, _Hnsw)
                                    and n < int(self.hnsw_min_size * SHRINK_FRACTION)):
            if isinstance(self._impl, _Hnsw):
                self._switch_to_exact()
        elif self.mode == "hnsw" or (self.mode == "auto" and n >= self.hnsw_min_size):
            if isinstance(self._impl, _Exact):
                self._switch_to_hnsw()

    # -- persistence ---------------------------------------------------------------------------------------------
    def save(self, path: Path) -> None:
        """Write the index to one file atomically (temp file in the same folder, fsync, os.replace)."""
        path = Path(path)
        with self._lock:
            impl = self._impl
            header: dict[str, Any] = {
                "format": FORMAT_NAME, "version": FORMAT_VERSION, "dim": self.dim, "backend": impl.kind,
                "count": len(impl), "ef": self._ef, "M": self.M, "ef_construction": self.ef_construction,
                "space": "cosine",
            }
            labs = impl.labels() if isinstance(impl, _Hnsw) else None
            hnsw_tmp: Path | None = None
            try:
                if isinstance(impl, _Exact):
                    labs, vecs = impl.vectors()
                    payload: bytes | Path = np.ascontiguousarray(vecs, dtype="<f4").tobytes()
                else:
                    hnsw_tmp = _temp_path(path, ".hnsw")
                    impl.index.save_index(str(hnsw_tmp))
                    header["element_count"] = impl.index.element_count
                    header["max_elements"] = impl.index.max_elements
                    payload = hnsw_tmp
                label_bytes = np.ascontiguousarray(labs, dtype="<i8").tobytes()
                _write_container(path, header, label_bytes, payload)
            finally:
                if hnsw_tmp is not None:
                    hnsw_tmp.unlink(missing_ok=True)

    @classmethod
    def load(cls, path: Path, dim: int, **kw: Any) -> "VectorIndex":
        """Read an index written by ``save``; raise IndexLoadError rather than return anything doubtful.

        Keyword arguments go to the constructor; ``ef`` defaults to the saved value, and the backend then follows
        ``backend`` (with "auto", the saved backend is kept unless the count is outside the hysteresis band).
        """
        path = Path(path)
        try:
            f = open(path, "rb")
        except OSError as e:
            raise IndexLoadError(f"cannot open vector index {path}: {e}") from e
        with f:
            header, sections = _read_container(f, path)
            if header.get("dim") != dim:
                raise IndexLoadError(f"vector index {path} has dim {header.get('dim')!r}, expected {dim}")
            kind = header.get("backend")
            count = header.get("count")
            if kind not in ("exact", "hnsw") or not isinstance(count, int) or count < 0:
                raise IndexLoadError(f"vector index {path} has a malformed header")
            saved_ef = header.get("ef")
            kw.setdefault("ef", saved_ef if isinstance(saved_ef, int) and saved_ef >= 1 else DEFAULT_EF)
            for key in ("M", "ef_construction"):
                if isinstance(header.get(key), int) and header[key] >= 1:
                    kw.setdefault(key, header[key])
            try:
                idx = cls(dim, **kw)
            except ValueError as e:
                raise IndexLoadError(f"vector index {path}: {e}") from e
            labs = _labels_section(f, sections[0], count, path)
            if kind == "exact":
                idx._impl = _load_exact(f, sections[1], labs, dim, path)
            else:
                idx._impl = _load_hnsw(f, sections[1], header, labs, idx, path)
        idx._rebalance()
        return idx

    @classmethod
    def load_or_none(cls, path: Path, dim: int, **kw: Any) -> "VectorIndex | None":
        """Like ``load`` but return None where ``load`` would raise IndexLoadError."""
        try:
            return cls.load(path, dim, **kw)
        except IndexLoadError:
            return None


# -- container file helpers ------------------------------------------------------------------------------------
def _temp_path(path: Path, suffix: str) -> Path:
    fd, name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=suffix + ".tmp", dir=path.parent)
    os.close(fd)
    return Path(name)


def _write_container(path: Path, header: dict[str, Any], label_bytes: bytes, payload: bytes | Path) -> None:
    """Write magic, header and the two sections to a temp file, fsync it, then rename it over ``path``."""
    if isinstance(payload, Path):
        with open(payload, "rb") as src:
            crc, size = 0, 0
            while chunk := src.read(_CHUNK):
                crc, size = zlib.crc32(chunk, crc), size + len(chunk)
    else:
        crc, size = zlib.crc32(payload), len(payload)
    header = dict(header, sections=[
        {"name": "labels", "bytes": len(label_bytes), "crc32": zlib.crc32(label_bytes)},
        {"name": header["backend"], "bytes": size, "crc32": crc},
    ])
    head = json.dumps(header, sort_keys=True).encode("utf-8")
    tmp = _temp_path(path, "")
    try:
        with open(tmp, "wb") as out:
            out.write(_MAGIC + _U64.pack(len(head)) + head + label_bytes)
            if isinstance(payload, Path):
                with open(payload, "rb") as src:
                    while chunk := src.read(_CHUNK):
                        out.write(chunk)
            else:
                out.write(payload)
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    try:  # make the rename itself durable; not every platform lets a directory be opened
        dfd = os.open(path.parent, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(dfd)
    except OSError:
        pass
    finally:
        os.close(dfd)


def _read_container(f: BinaryIO, path: Path) -> tuple[dict[str, Any], list[dict[str, int]]]:
    """Parse and check magic, header and section sizes; return the header and the sections with offsets."""
    lead = f.read(len(_MAGIC) + _U64.size)
    if len(lead) != len(_MAGIC) + _U64.size or lead[: len(_MAGIC)] != _MAGIC:
        raise IndexLoadError(f"{path} is not a CHAI vector index (bad magic or truncated)")
    (head_len,) = _U64.unpack(lead[len(_MAGIC):])
    if head_len > _MAX_HEADER:
        raise IndexLoadError(f"{path} has an implausible header length {head_len}")
    raw = f.read(head_len)
    try:
        header = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise IndexLoadError(f"{path} has an unreadable header: {e}") from e
    if not isinstance(header, dict) or header.get("format") != FORMAT_NAME:
        raise IndexLoadError(f"{path} is not a CHAI vector index")
    if header.get("version") != FORMAT_VERSION:
        raise IndexLoadError(f"{path} has format version {header.get('version')!r}, expected {FORMAT_VERSION}")
    secs = header.get("sections")
    if not isinstance(secs, list) or len(secs) != 2:
        raise IndexLoadError(f"{path} has a malformed section table")
    offset = len(lead) + head_len
    out = []
    for s in secs:
        if not (isinstance(s, dict) and isinstance(s.get("bytes"), int) and isinstance(s.get("crc32"), int)
                and s["bytes"] >= 0):
            raise IndexLoadError(f"{path} has a malformed section table")
        out.append({"offset": offset, "bytes": s["bytes"], "crc32": s["crc32"]})
        offset += s["bytes"]
    size = os.fstat(f.fileno()).st_size
    if size != offset:
        raise IndexLoadError(f"{path} is {size} bytes, its header describes {offset} (truncated or damaged)")
    return header, out


def _read_section(f: BinaryIO, sec: dict[str, int], path: Path) -> bytes:
    f.seek(sec["offset"])
    data = f.read(sec["bytes"])
    if len(data) != sec["bytes"] or zlib.crc32(data) != sec["crc32"]:
        raise IndexLoadError(f"{path}: a section fails its checksum (corrupt file)")
    return data


def _labels_section(f: BinaryIO, sec: dict[str, int], count: int, path: Path) -> np.ndarray:
    if sec["bytes"] != 8 * count:
        raise IndexLoadError(f"{path}: label section does not hold {count} labels")
    labs = np.frombuffer(_read_section(f, sec, path), dtype="<i8").astype(np.int64)
    if labs.size and (labs.min() < 0 or np.unique(labs).size != labs.size):
        raise IndexLoadError(f"{path}: labels are negative or repeated")
    return labs


def _load_exact(f: BinaryIO, sec: dict[str, int], labs: np.ndarray, dim: int, path: Path) -> _Exact:
    if sec["bytes"] != 4 * dim * labs.size:
        raise IndexLoadError(f"{path}: vector section does not hold {labs.size} x {dim} float32")
    vecs = np.frombuffer(_read_section(f, sec, path), dtype="<f4").reshape(labs.size, dim).astype(np.float32)
    if not np.isfinite(vecs).all():
        raise IndexLoadError(f"{path}: stored vectors are not finite")
    impl = _Exact(dim, capacity=max(64, 2 * labs.size))
    if labs.size:
        try:
            impl.add(labs, _as_unit_rows(vecs, dim))
        except ValueError as e:
            raise IndexLoadError(f"{path}: {e}") from e
    return impl


def _load_hnsw(f: BinaryIO, sec: dict[str, int], header: dict[str, Any], labs: np.ndarray,
               idx: VectorIndex, path: Path) -> _Hnsw:
    import hnswlib

    element_count = header.get("element_count")
    max_elements = header.get("max_elements")
    if not (isinstance(element_count, int) and isinstance(max_elements, int)
            and labs.size <= element_count <= max_elements):
        raise IndexLoadError(f"{path}: malformed hnsw header")
    # hnswlib reads only from a path: copy the (checksummed) graph out to a temp file next to the index.
    try:
        tmp = _temp_path(path, ".hnsw")
    except OSError:
        fd, name = tempfile.mkstemp(suffix=".hnsw.tmp")
        os.close(fd)
        tmp = Path(name)
    try:
        f.seek(sec["offset"])
        crc, left = 0, sec["bytes"]
        with open(tmp, "wb") as out:
            while left:
                chunk = f.read(min(_CHUNK, left))
                if not chunk:
                    break
                crc = zlib.crc32(chunk, crc)
                out.write(chunk)
                left -= len(chunk)
        if left or crc != sec["crc32"]:
            raise IndexLoadError(f"{path}: hnsw section fails its checksum (corrupt file)")
        index = hnswlib.Index(space="cosine", dim=idx.dim)
        try:
            index.load_index(str(tmp), max_elements=max_elements, allow_replace_deleted=True)
        except (RuntimeError, ValueError, MemoryError) as e:
            raise IndexLoadError(f"{path}: hnswlib cannot read the graph: {e}") from e
    finally:
        tmp.unlink(missing_ok=True)
    if index.dim != idx.dim or index.element_count != element_count:
        raise IndexLoadError(f"{path}: hnsw graph disagrees with its header")
    if labs.size and not set(labs.tolist()) <= set(index.get_ids_list()):
        raise IndexLoadError(f"{path}: live labels missing from the hnsw graph")
    return _Hnsw(idx.dim, M=idx.M, ef_construction=idx.ef_construction, ef=idx.ef,
                 num_threads=idx.num_threads, index=index, live=labs.tolist())
