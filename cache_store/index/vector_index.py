"""Cosine vector index over distinct entity vectors: exact numpy search while small (or while hnswlib is not
installed: it is optional), hnswlib once large.

Labels are non-negative int64 entity ids. Similarities are cosines in [-1, 1], sorted descending. Query results
always have shape (m, k); slots past the available matches hold label -1 and similarity -inf (an empty index
returns only padding). The index is derived state: ``load`` raises ``IndexLoadError`` for anything it cannot
trust, and the store then rebuilds it from the manifest.

The backends live in backends.py, the file format in file.py. The switch size and graph parameters
were measured (docs/cache-store.md, "Index parameters").
"""
from __future__ import annotations

import threading
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np

from ..config import INDEX_BACKENDS
from . import ann
from .backends import _as_labels, _as_unit_rows, _Exact, _Hnsw, _last_occurrence
from .file import (FORMAT_NAME, FORMAT_VERSION, IndexLoadError, _labels_section, _load_exact, _load_hnsw,
                   _read_container, _temp_path, _write_container)

__all__ = ["VectorIndex", "IndexLoadError", "HNSW_MIN_SIZE", "DEFAULT_EF", "DEFAULT_M", "DEFAULT_EF_CONSTRUCTION"]

HNSW_MIN_SIZE = 12000  # over twice the measured exact/hnsw crossover at DEFAULT_EF (4.5k-5k at ef 128; 1.5k-2k
                       # at ef 64), so hnsw is never slower while in use ("auto" keeps it down to half this size)
# Search width. Measured when the index held a point per stored text, whose many exact duplicates (every text of
# one identity shares one vector) cost hnswlib recall: on bench_store_scale's 100k entries recall@16 (counted by
# similarity) was 0.936 at ef 64 and 0.998 at 128, for 0.08 ms more per query. The stores' keepers now index one
# point per identity (points.py). Stores pass it on load too (backend.index_options).
DEFAULT_EF = 128
DEFAULT_M = 32
DEFAULT_EF_CONSTRUCTION = 200
# "auto" switches back to exact only below this fraction of hnsw_min_size, so churn near the switch point does
# not rebuild the index back and forth.
SHRINK_FRACTION = 0.5

BACKENDS = INDEX_BACKENDS  # "auto": exact below hnsw_min_size, hnsw above when hnswlib is installed


class VectorIndex:
    """Cosine index over distinct entity vectors, labels are int64 entity ids; exact numpy below a measured size,
    hnswlib above (where it is installed)."""

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
        if backend == "hnsw":
            ann.require_hnswlib("VectorIndex")
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
                    if ann.hnswlib_available():
                        self._switch_to_hnsw()
                    else:
                        ann.note_exact_only(len(self._impl))
                    return
            self._impl.add(labs, vecs)

    def remove(self, labels: Iterable[int]) -> None:
        """Remove labels; unknown or already removed labels are ignored."""
        keys = [int(x) for x in (labels.ravel().tolist() if isinstance(labels, np.ndarray) else labels)]
        with self._lock:
            self._impl.remove(keys)
            self._rebalance()

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
                if self.mode == "hnsw" or ann.hnswlib_available():
                    self._switch_to_hnsw()
                else:
                    ann.note_exact_only(n)

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
            elif not ann.hnswlib_available():
                raise IndexLoadError(f"vector index {path} is an hnswlib graph and hnswlib is not installed here "
                                     "(the index is rebuilt for exact search)")
            else:
                idx._impl = _load_hnsw(f, sections[1], header, labs, idx, path)
        idx._rebalance()
        return idx
