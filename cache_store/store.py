"""One cache folder: latent files + SQLite manifest + entity vector index, kept consistent across processes."""
from __future__ import annotations

import json
import logging
import os
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np
from filelock import FileLock, Timeout

from . import latents as lat
from .config import StoreConfig
from .errors import CacheEntryError, CacheError, EmbedderMismatchError, EntryTooLargeError
from .index import IndexLoadError, VectorIndex
from .manifest import LOG_KEEP, MANIFEST_NAME, Manifest, shape_key
from .naming import is_entry_file_name
from .types import EmbeddedEntities, EntryInfo, InsertResult, LookupResult, Match, StoreStats, VerifyReport

log = logging.getLogger(__name__)

LATENT_DIR = "latents"
INDEX_DIR = "index"
INDEX_STATE = "state.json"
LOCK_NAME = ".writer.lock"
SAVE_INDEX_EVERY = 1000  # logged entity changes before this process persists the index again ...
SAVE_INDEX_INTERVAL = 300.0  # ... but at most every 5 minutes: a save writes the whole index (~90 MB at 100k);
                             # a reopen replays whatever the index_log recorded since the last save
NEIGHBOURS = 16          # stored entities considered per query entity (postings make popularity free)
CANDIDATES = 8           # entries tried in order when the best one turns out unreadable


class NothingToStoreError(CacheError):
    """An insert without entities: such an entry could never be found again."""


class CacheStore:
    """A persistent, budgeted, entity-indexed store of donor latents (see DESIGN.md section 4)."""

    def __init__(self, root: str | os.PathLike, config: StoreConfig, *, lock_timeout: float = 120.0,
                 index_kwargs: Mapping[str, Any] | None = None) -> None:
        self.root = Path(root)
        self.config = config
        self.latent_dir = self.root / LATENT_DIR
        self.index_dir = self.root / INDEX_DIR
        self.latent_dir.mkdir(parents=True, exist_ok=True)
        self.index_dir.mkdir(exist_ok=True)
        self._writer = FileLock(str(self.root / LOCK_NAME), timeout=lock_timeout)
        self._mem = threading.RLock()
        self._index_kwargs = dict(index_kwargs or {})
        self._index: VectorIndex | None = None
        self._index_seq = 0
        self._index_epoch = -1
        self._index_gen = -1
        self._unsaved = 0
        self._last_save = time.monotonic()
        with self._writer_lock():
            self.manifest = self._open_manifest()
            with self.manifest.write() as cur:
                Manifest.set_meta(cur, "budget_bytes", str(config.budget_bytes))
                Manifest.set_meta(cur, "policy", config.policy)
            self._reconcile_files(VerifyReport())
            self._recount_bytes()
            self._sweep_index_temporaries()
            self._load_index()

    # ------------------------------------------------------------------ opening and recovery
    def _writer_lock(self) -> FileLock:
        return self._writer

    def _open_manifest(self) -> Manifest:
        path = self.root / MANIFEST_NAME
        try:
            manifest = Manifest(path)
            manifest.query("SELECT COUNT(*) FROM entries")
            return manifest
        except sqlite3.DatabaseError as exc:
            log.warning("[CHAI] cache manifest %s is unreadable (%s); rebuilding it from the latent files", path, exc)
            self._quarantine_manifest()
            manifest = Manifest(path)
            self._recover_from_files(manifest)
            return manifest

    def _quarantine_manifest(self) -> None:
        stamp = time.strftime("%Y%m%d-%H%M%S")
        for suffix in ("", "-wal", "-shm"):
            src = self.root / (MANIFEST_NAME + suffix)
            if src.exists():
                os.replace(src, self.root / f"manifest.corrupt-{stamp}.sqlite{suffix}")

    def _recover_from_files(self, manifest: Manifest) -> int:
        """Rebuild manifest rows from the metadata every latent file carries; return entries recovered."""
        recovered, embedder = 0, None
        for path in sorted(self.latent_dir.glob("*.safetensors")):
            found = lat.read_for_recovery(path) if is_entry_file_name(path.name) else None
            if found is None:
                continue
            tensors, meta, data = found
            vectors = tensors.pop(lat.VECTORS_KEY, None)
            ents = meta.get("entities") or []
            if vectors is None or len(ents) != vectors.shape[0] or not ents:
                continue
            embedder = embedder or meta.get("embedder")
            if meta.get("embedder") != embedder:
                continue
            with manifest.write() as cur:
                self._insert_rows(cur, manifest, meta["prompt"], [(e["text"], e.get("kind", "object")) for e in ents],
                                  vectors.numpy().astype(np.float32), embedder, meta["fingerprint"], meta["shape"],
                                  meta.get("dtype", "float32"), path.name, len(data), lat.checksum(data),
                                  meta.get("sigmas", []), sorted(tensors), meta.get("extra", {}))
                Manifest.bump(cur, "index_epoch")
            recovered += 1
        log.warning("[CHAI] recovered %d cache entries from latent files", recovered)
        return recovered

    def _reconcile_files(self, report: VerifyReport) -> None:
        """Drop rows whose file is gone or the wrong size, and files no row vouches for (writer lock held)."""
        on_disk: dict[str, int] = {}
        for item in os.scandir(self.latent_dir):
            if item.name.startswith(lat.TMP_PREFIX):
                lat.remove_files(self.latent_dir, [item.name])
                report.problems.append(f"leftover temporary file {item.name}")
                report.repaired.append(f"removed {item.name}")
            elif is_entry_file_name(item.name):
                on_disk[item.name] = item.stat().st_size
        rows = self.manifest.query("SELECT id, file, nbytes FROM entries")
        bad: list[int] = []
        for row in rows:
            name = row["file"]
            if not is_entry_file_name(name):
                report.problems.append(f"entry {row['id']}: invalid file name {name!r} in the manifest")
                bad.append(row["id"])
            elif name not in on_disk:
                report.problems.append(f"entry {row['id']}: latent file {name} is missing")
                bad.append(row["id"])
            elif on_disk[name] != row["nbytes"]:
                report.problems.append(f"entry {row['id']}: latent file {name} has {on_disk[name]} bytes, "
                                       f"expected {row['nbytes']}")
                bad.append(row["id"])
        if bad:
            self._drop_entries(bad, keep_files=False)
            report.repaired.append(f"dropped {len(bad)} entries with missing or damaged files")
        vouched = {row["file"] for row in rows}
        orphans = [name for name in on_disk if name not in vouched]
        if orphans:
            lat.remove_files(self.latent_dir, orphans)
            report.problems.append(f"{len(orphans)} latent file(s) not in the manifest")
            report.repaired.append(f"removed {len(orphans)} orphan latent file(s)")

    def _sweep_index_temporaries(self) -> None:
        """Remove temporary files an interrupted index save left behind (writer lock held)."""
        stale = [p.name for p in self.index_dir.iterdir()
                 if p.name.startswith(lat.TMP_PREFIX) or (p.name.startswith(".") and p.name.endswith(".tmp"))]
        lat.remove_files(self.index_dir, stale)

    # ------------------------------------------------------------------ index maintenance
    def _new_index(self, dim: int) -> VectorIndex:
        return VectorIndex(dim, **self._index_kwargs)

    def _dim(self) -> int | None:
        value = self.manifest.meta("dim")
        return int(value) if value else None

    def _load_index(self) -> None:
        """Load the persisted index if it matches the manifest, else rebuild it from the manifest."""
        with self._mem:
            dim = self._dim()
            epoch = int(self.manifest.meta("index_epoch", "0") or 0)
            self._index, self._index_seq, self._index_epoch, self._index_gen = None, 0, epoch, -1
            if dim is None:
                return
            state_path = self.index_dir / INDEX_STATE
            try:
                state = json.loads(state_path.read_text())
                if state["epoch"] != epoch or state["dim"] != dim or state["embedder"] != self.manifest.meta("embedder"):
                    raise IndexLoadError("index state belongs to another epoch or embedder")
                name = state["file"]
                if not isinstance(name, str) or "/" in name or "\\" in name or name.startswith("."):
                    raise IndexLoadError("invalid index file name")
                self._index = VectorIndex.load(self.index_dir / name, dim, **self._index_kwargs)
                self._index_seq = int(state["seq"])
                self._sync_index(force=True)
                if len(self._index) != int(self.manifest.query("SELECT COUNT(*) FROM entities")[0][0]):
                    raise IndexLoadError("index disagrees with the manifest")
            except (OSError, ValueError, KeyError, TypeError, IndexLoadError) as exc:
                log.info("[CHAI] rebuilding the entity index from the manifest (%s)", exc)
                self._rebuild_index(dim, epoch)
                if self._unsaved >= SAVE_INDEX_EVERY:  # a large rebuild is slow: persist it at once (lock held)
                    self._save_index()

    def _rebuild_index(self, dim: int, epoch: int) -> None:
        with self._mem:
            with self.manifest.read() as cur:
                seq = cur.execute("SELECT COALESCE(MAX(seq), 0) FROM index_log").fetchone()[0]
                gen = int(cur.execute("SELECT value FROM meta WHERE key='generation'").fetchone()[0])
            labels, vectors = self.manifest.entity_vectors()
            index = self._new_index(dim)
            if len(labels):
                index.add(labels, vectors)
            self._index, self._index_seq, self._index_epoch, self._index_gen = index, seq, epoch, gen
            self._unsaved = len(labels)

    def _sync_index(self, force: bool = False) -> None:
        """Apply entity additions and deletions other processes (or this one) logged since the last sync."""
        with self._mem:
            with self.manifest.read() as cur:
                meta = dict(cur.execute("SELECT key, value FROM meta WHERE key IN "
                                        "('generation', 'index_epoch', 'dim')").fetchall())
                gen = int(meta.get("generation", 0))
                epoch = int(meta.get("index_epoch", 0) or 0)
                if not force and gen == self._index_gen and epoch == self._index_epoch:
                    return
                if "dim" not in meta:
                    self._index, self._index_gen, self._index_epoch = None, gen, epoch
                    return
                first = cur.execute("SELECT MIN(seq) FROM index_log").fetchone()[0]
                rows = cur.execute("SELECT seq, entity_id, op FROM index_log WHERE seq > ? ORDER BY seq",
                                   (self._index_seq,)).fetchall()
            lagging = first is not None and first > self._index_seq + 1 and self._index_seq > 0
            if self._index is None or epoch != self._index_epoch or lagging:
                self._rebuild_index(int(meta["dim"]), epoch)
                return
            final: dict[int, str] = {}
            for row in rows:
                final[row["entity_id"]] = row["op"]
            removed = [eid for eid, op in final.items() if op == "del"]
            added = [eid for eid, op in final.items() if op == "add"]
            if removed:
                self._index.remove(removed)
            if added:
                labels, vectors = self.manifest.entity_vectors(added)
                if len(labels):
                    self._index.add(labels, vectors)
            if rows:
                self._index_seq = rows[-1]["seq"]
            self._unsaved += len(rows)
            self._index_gen = gen

    def _save_index(self) -> None:
        """Persist the index with the log position it reflects (writer lock held)."""
        with self._mem:
            if self._index is None or self._dim() is None:
                return
            name = f"entities-{self._index_epoch}-{self._index_seq}.idx"
            self._index.save(self.index_dir / name)
            state = {"file": name, "seq": self._index_seq, "epoch": self._index_epoch, "dim": self._dim(),
                     "embedder": self.manifest.meta("embedder")}
            lat.write_atomic(self.index_dir, INDEX_STATE, json.dumps(state).encode())
            for old in self.index_dir.iterdir():
                if old.name.startswith("entities-") and not old.name.startswith(name):
                    try:
                        old.unlink()
                    except OSError:
                        pass
            self._unsaved = 0
            self._last_save = time.monotonic()

    # ------------------------------------------------------------------ writing
    @staticmethod
    def _insert_rows(cur: sqlite3.Cursor, manifest: Manifest, prompt: str, ents: Sequence[tuple[str, str]],
                     vectors: np.ndarray, embedder: str, fingerprint: str, shape: Sequence[int], dtype: str,
                     file: str, nbytes: int, digest: str, sigmas: Sequence[float], tensors: Sequence[str],
                     extra: Mapping[str, Any]) -> int:
        stored = cur.execute("SELECT value FROM meta WHERE key='embedder'").fetchone()
        if stored is None:
            Manifest.set_meta(cur, "embedder", embedder)
            Manifest.set_meta(cur, "dim", str(vectors.shape[1]))
        elif stored[0] != embedder:
            raise EmbedderMismatchError(
                f"this cache holds vectors of embedder {stored[0]!r}; it cannot store vectors of {embedder!r}. "
                "Use the same embedder, or another cache name")
        tick = Manifest.bump(cur, "tick")
        now = time.time()
        key = shape_key(shape)
        cur.execute("INSERT OR IGNORE INTO groups(fingerprint, shape) VALUES (?, ?)", (fingerprint, key))
        group_id = cur.execute("SELECT id FROM groups WHERE fingerprint=? AND shape=?", (fingerprint, key)).fetchone()[0]
        cur.execute(
            "INSERT INTO entries(prompt, fingerprint, shape, dtype, file, nbytes, checksum, sigmas, tensors, meta, "
            "created, last_used, use_tick, hits, group_id) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,0,?)",
            (prompt, fingerprint, key, dtype, file, nbytes, digest,
             json.dumps([float(s) for s in sigmas]), json.dumps(list(tensors)), json.dumps(dict(extra)),
             now, now, tick, group_id))
        cur.execute("UPDATE meta SET value = CAST(value AS INTEGER) + ? WHERE key='total_bytes'", (nbytes,))
        entry_id = cur.lastrowid
        seen: set[str] = set()
        for (text, kind), vector in zip(ents, vectors):
            if text in seen:
                continue
            seen.add(text)
            row = cur.execute("SELECT id FROM entities WHERE text=?", (text,)).fetchone()
            if row is None:
                cur.execute("INSERT INTO entities(text, kind, vector) VALUES (?,?,?)",
                            (text, kind, np.ascontiguousarray(vector, np.float32).tobytes()))
                entity_id = cur.lastrowid
                cur.execute("INSERT INTO index_log(entity_id, op) VALUES (?, 'add')", (entity_id,))
            else:
                entity_id = row[0]
            cur.execute("INSERT OR IGNORE INTO postings(group_id, entity_id, entry_id) VALUES (?,?,?)",
                        (group_id, entity_id, entry_id))
        Manifest.bump(cur, "generation")
        return entry_id

    @staticmethod
    def _delete_rows(cur: sqlite3.Cursor, entry_ids: Sequence[int]) -> list[str]:
        """Delete entries, their postings and entities no entry holds any more; return their file names."""
        files: list[str] = []
        for start in range(0, len(entry_ids), 500):
            ids = list(entry_ids[start:start + 500])
            marks = ",".join("?" * len(ids))
            rows = cur.execute(f"SELECT file, nbytes FROM entries WHERE id IN ({marks})", ids).fetchall()
            files += [r[0] for r in rows]
            cur.execute("UPDATE meta SET value = CAST(value AS INTEGER) - ? WHERE key='total_bytes'",
                        (sum(r[1] for r in rows),))
            cands = [r[0] for r in cur.execute(
                f"SELECT DISTINCT entity_id FROM postings WHERE entry_id IN ({marks})", ids)]
            cur.execute(f"DELETE FROM postings WHERE entry_id IN ({marks})", ids)
            cur.execute(f"DELETE FROM entries WHERE id IN ({marks})", ids)
            for c in range(0, len(cands), 500):
                part = cands[c:c + 500]
                pm = ",".join("?" * len(part))
                gone = [r[0] for r in cur.execute(
                    f"SELECT id FROM entities WHERE id IN ({pm}) AND NOT EXISTS "
                    "(SELECT 1 FROM postings WHERE postings.entity_id = entities.id)", part)]
                if gone:
                    gm = ",".join("?" * len(gone))
                    cur.execute(f"DELETE FROM entities WHERE id IN ({gm})", gone)
                    cur.executemany("INSERT INTO index_log(entity_id, op) VALUES (?, 'del')", [(g,) for g in gone])
        if entry_ids:
            Manifest.bump(cur, "generation")
        return files

    @staticmethod
    def _total_bytes(cur: sqlite3.Cursor) -> int:
        """Bytes of all entries, kept in meta by every insert and delete (recounted on open)."""
        return int(cur.execute("SELECT value FROM meta WHERE key='total_bytes'").fetchone()[0])

    def _recount_bytes(self) -> None:
        """Make the byte counter agree with the rows (writer lock held); a scan, so only on open and repair."""
        with self.manifest.write() as cur:
            total = cur.execute("SELECT COALESCE(SUM(nbytes), 0) FROM entries").fetchone()[0]
            Manifest.set_meta(cur, "total_bytes", str(total))

    def _victims(self, cur: sqlite3.Cursor, need: int) -> list[int]:
        """Entries to evict, in policy order, freeing at least `need` bytes."""
        order = "use_tick" if self.config.policy == "lru" else "hits, use_tick"
        victims, freed = [], 0
        for row in cur.execute(f"SELECT id, nbytes FROM entries ORDER BY {order}"):
            if freed >= need:
                break
            victims.append(row[0])
            freed += row[1]
        return victims

    def _drop_entries(self, entry_ids: Sequence[int], keep_files: bool = False) -> None:
        with self.manifest.write() as cur:
            files = self._delete_rows(cur, entry_ids)
        if not keep_files:
            lat.remove_files(self.latent_dir, [f for f in files if is_entry_file_name(f)])

    def insert(self, prompt: str, entities: EmbeddedEntities, fingerprint: str, latents: Mapping[str, Any],
               sigmas: Sequence[float], shape: Sequence[int] | None = None,
               meta: Mapping[str, Any] | None = None) -> InsertResult:
        """Store a full-mode generation's donor latents, evicting by policy so the budget holds on return."""
        if len(entities) == 0:
            raise NothingToStoreError("the prompt has no entities, so the entry could never be matched; not stored")
        if not fingerprint:
            raise ValueError("a model fingerprint is required")
        tensors = dict(latents)
        if not tensors:
            raise ValueError("an entry needs at least one latent tensor")
        first = next(iter(tensors.values()))
        shape = tuple(int(s) for s in (shape if shape is not None else first.shape))
        for name, tensor in tensors.items():
            if tuple(tensor.shape) != shape:
                raise ValueError(f"latent {name!r} has shape {tuple(tensor.shape)}, expected {shape}")
        dtype = str(first.dtype).replace("torch.", "")
        ents = [(e.text, e.kind) for e in entities.entities]
        record = {"prompt": prompt, "fingerprint": fingerprint, "shape": list(shape), "dtype": dtype,
                  "sigmas": [float(s) for s in sigmas], "embedder": entities.embedder,
                  "entities": [{"text": t, "kind": k} for t, k in ents], "extra": dict(meta or {})}
        data = lat.encode_entry(tensors, entities.vectors, record)
        if len(data) > self.config.budget_bytes:
            raise EntryTooLargeError(
                f"this entry needs {len(data) / 1e6:.2f} MB but the whole cache budget is "
                f"{self.config.budget_bytes / 1e6:.2f} MB; raise the budget (GB) to store it")
        name = lat.new_entry_file_name()
        with self._writer_lock():
            stored = self.manifest.meta("embedder")
            if stored is not None and stored != entities.embedder:
                raise EmbedderMismatchError(
                    f"this cache holds vectors of embedder {stored!r}; it cannot store vectors of "
                    f"{entities.embedder!r}. Use the same embedder, or another cache name")
            dim = self._dim()
            if dim is not None and entities.vectors.shape[1] != dim:
                raise EmbedderMismatchError(f"vectors have {entities.vectors.shape[1]} dimensions, the cache {dim}")
            lat.write_atomic(self.latent_dir, name, data)
            try:
                with self.manifest.write() as cur:
                    victims = self._victims(cur, self._total_bytes(cur) + len(data) - self.config.budget_bytes)
                    evicted_files = self._delete_rows(cur, victims)
                    entry_id = self._insert_rows(cur, self.manifest, prompt, ents, entities.vectors,
                                                 entities.embedder, fingerprint, shape, dtype, name, len(data),
                                                 lat.checksum(data), sigmas, sorted(tensors), meta or {})
                    self._compact_log(cur)
            except BaseException:
                lat.remove_files(self.latent_dir, [name])
                raise
            lat.remove_files(self.latent_dir, [f for f in evicted_files if is_entry_file_name(f)])
            self._sync_index()
            if (self._unsaved >= SAVE_INDEX_EVERY
                    and time.monotonic() - self._last_save >= SAVE_INDEX_INTERVAL):
                self._save_index()
        return InsertResult(entry_id=entry_id, nbytes=len(data), evicted=tuple(victims))

    @staticmethod
    def _compact_log(cur: sqlite3.Cursor) -> None:
        last = cur.execute("SELECT COALESCE(MAX(seq), 0) FROM index_log").fetchone()[0]
        if last % 1000 == 0 and last > LOG_KEEP:
            cur.execute("DELETE FROM index_log WHERE seq <= ?", (last - LOG_KEEP,))

    # ------------------------------------------------------------------ reading
    @property
    def generation(self) -> int:
        """Changes whenever entries are added, evicted or cleared (by any process)."""
        return int(self.manifest.meta("generation", "0") or 0)

    def lookup(self, entities: EmbeddedEntities, fingerprint: str, shape: Sequence[int], threshold: float,
               touch: bool = True, load: bool = True) -> LookupResult:
        """Best compatible entry sharing an entity at similarity >= threshold, or a miss with its reason."""
        timings: dict[str, float] = {}
        t0 = time.perf_counter()
        if len(entities) == 0:
            return LookupResult(False, "the prompt has no entities to match", timings=timings)
        stored = self.manifest.meta("embedder")
        if stored is None:
            return LookupResult(False, "the cache is empty", timings=timings)
        if stored != entities.embedder:
            return LookupResult(False, f"the cache was built with embedder {stored!r}, this lookup used "
                                       f"{entities.embedder!r}; use the same embedder or another cache name",
                                timings=timings)
        self._sync_index()
        with self._mem:
            index = self._index
            if index is None or len(index) == 0:
                return LookupResult(False, "the cache is empty", timings=timings)
            labels, sims = index.query(entities.vectors, min(NEIGHBOURS, len(index)))
        timings["index"] = time.perf_counter() - t0
        t1 = time.perf_counter()
        matched = [(q, int(lab), float(sim)) for q in range(len(entities))
                   for lab, sim in zip(labels[q], sims[q]) if lab >= 0 and sim >= threshold]
        if not matched:
            timings["select"] = time.perf_counter() - t1
            return LookupResult(False, self._no_match_reason(entities, labels, sims, threshold), timings=timings)
        candidates = self._rank(matched, fingerprint, shape_key(shape))
        timings["select"] = time.perf_counter() - t1
        if not candidates:
            return LookupResult(False, self._incompatible_reason(matched, fingerprint, shape), timings=timings)
        t2 = time.perf_counter()
        dropped = []
        for entry_id in candidates:
            entry = self.manifest.entry(entry_id)
            if entry is None:
                continue
            tensors = None
            if load:
                try:
                    tensors = lat.read_verified(self.latent_dir / entry.file, self._checksum(entry_id))
                except CacheEntryError as exc:
                    log.warning("[CHAI] dropping cache entry %d: %s", entry_id, exc)
                    dropped.append(entry_id)
                    continue
            if touch:
                self.touch(entry_id)
                entry = self.manifest.entry(entry_id) or entry
            timings["load"] = time.perf_counter() - t2
            result = LookupResult(True, "shared entities", entry=entry,
                                  matches=self._matches_for(entry_id, entities, matched), latents=tensors,
                                  timings=timings)
            self._drop_quietly(dropped)
            return result
        self._drop_quietly(dropped)
        timings["load"] = time.perf_counter() - t2
        return LookupResult(False, "the matching entries were unreadable (damaged files) and have been removed",
                            timings=timings)

    def _checksum(self, entry_id: int) -> str:
        rows = self.manifest.query("SELECT checksum FROM entries WHERE id=?", (entry_id,))
        return rows[0][0] if rows else ""

    def _drop_quietly(self, entry_ids: list[int]) -> None:
        if not entry_ids:
            return
        try:
            with self._writer_lock():
                self._drop_entries(entry_ids)
        except (Timeout, sqlite3.Error) as exc:  # another writer is busy: the next open reconciles
            log.warning("[CHAI] could not drop damaged entries now: %s", exc)

    def _rank(self, matched: list[tuple[int, int, float]], fingerprint: str, shape: str) -> list[int]:
        """Compatible entries ordered by matched query entities, then summed similarity, then newest."""
        group = self.manifest.query("SELECT id FROM groups WHERE fingerprint=? AND shape=?", (fingerprint, shape))
        if not group:
            return []
        values = ",".join(["(?,?,?)"] * len(matched))
        params: list[Any] = [x for triple in matched for x in triple]
        # CROSS JOIN pins the loop order: matched entities -> their postings in this group (one range scan each).
        sql = (f"WITH m(q, eid, sim) AS (VALUES {values}), "
               "best AS (SELECT p.entry_id AS entry_id, m.q AS q, MAX(m.sim) AS sim "
               "FROM m CROSS JOIN postings p ON p.group_id = ? AND p.entity_id = m.eid GROUP BY p.entry_id, m.q) "
               "SELECT entry_id, COUNT(*) AS n, SUM(sim) AS s FROM best GROUP BY entry_id "
               "ORDER BY n DESC, s DESC, entry_id DESC LIMIT ?")
        rows = self.manifest.query(sql, params + [group[0][0], CANDIDATES])
        return [r[0] for r in rows]

    def _matches_for(self, entry_id: int, entities: EmbeddedEntities,
                     matched: list[tuple[int, int, float]]) -> list[Match]:
        held = {r[0]: r[1] for r in self.manifest.query(
            "SELECT e.id, e.text FROM postings p JOIN entities e ON e.id = p.entity_id WHERE p.entry_id=?",
            (entry_id,))}
        best: dict[int, tuple[float, str]] = {}
        for q, eid, sim in matched:
            if eid in held and sim > best.get(q, (-2.0, ""))[0]:
                best[q] = (sim, held[eid])
        return [Match(entities.entities[q].text, text, sim) for q, (sim, text) in sorted(best.items())]

    def _entity_texts(self, ids: Sequence[int]) -> dict[int, str]:
        if not ids:
            return {}
        marks = ",".join("?" * len(ids))
        return {r[0]: r[1] for r in self.manifest.query(f"SELECT id, text FROM entities WHERE id IN ({marks})",
                                                         list(ids))}

    def _no_match_reason(self, entities: EmbeddedEntities, labels: np.ndarray, sims: np.ndarray,
                         threshold: float) -> str:
        best_q, best_col, best = -1, -1, -2.0
        for q in range(labels.shape[0]):
            if labels.shape[1] and labels[q, 0] >= 0 and sims[q, 0] > best:
                best_q, best_col, best = q, 0, float(sims[q, 0])
        if best_q < 0:
            return "the cache is empty"
        text = self._entity_texts([int(labels[best_q, best_col])]).get(int(labels[best_q, best_col]), "?")
        return (f"no cached entity reaches similarity {threshold:.2f} (closest: "
                f"'{entities.entities[best_q].text}'~'{text}' {best:.3f})")

    def _incompatible_reason(self, matched: list[tuple[int, int, float]], fingerprint: str,
                             shape: Sequence[int]) -> str:
        ids = sorted({eid for _, eid, _ in matched})[:500]
        marks = ",".join("?" * len(ids))
        rows = self.manifest.query(
            f"SELECT e.fingerprint, e.shape FROM entries e WHERE e.id IN "
            f"(SELECT entry_id FROM postings WHERE entity_id IN ({marks})) LIMIT 50", ids)
        if not rows:
            return "matched entities have no entries any more"
        if all(r[0] != fingerprint for r in rows):
            return (f"entries share entities but were made with another model (fingerprint {rows[0][0][:16]}..., "
                    f"this run {fingerprint[:16]}...)")
        shapes = sorted({r[1] for r in rows if r[0] == fingerprint})
        return f"entries share entities but have latent shape {', '.join(shapes)}, this run {shape_key(shape)}"

    def load_latents(self, entry_id: int) -> tuple[dict[str, Any], list[float]]:
        """An entry's tensors (checksum verified) and the sigmas they were captured at."""
        entry = self.manifest.entry(entry_id)
        if entry is None:
            raise CacheEntryError(f"cache entry {entry_id} does not exist (evicted?)")
        return lat.read_verified(self.latent_dir / entry.file, self._checksum(entry_id)), list(entry.sigmas)

    def touch(self, entry_id: int, count_hit: bool = True) -> None:
        """Refresh an entry's recency (and its use count for LFU)."""
        with self.manifest.write() as cur:
            tick = Manifest.bump(cur, "tick")
            cur.execute("UPDATE entries SET last_used=?, use_tick=?, hits=hits+? WHERE id=?",
                        (time.time(), tick, int(count_hit), entry_id))

    # ------------------------------------------------------------------ management
    def stats(self) -> StoreStats:
        """Counts, sizes and settings."""
        with self.manifest.read() as cur:
            n, total, hits = cur.execute(
                "SELECT COUNT(*), COALESCE(SUM(nbytes), 0), COALESCE(SUM(hits), 0) FROM entries").fetchone()
            n_ent = cur.execute("SELECT COUNT(*) FROM entities").fetchone()[0]
            meta = dict(cur.execute("SELECT key, value FROM meta").fetchall())
        backend = self._index.backend if self._index is not None else "empty"
        return StoreStats(root=str(self.root), entries=n, entities=n_ent, bytes=total,
                          budget_bytes=self.config.budget_bytes, policy=self.config.policy,
                          embedder=meta.get("embedder"), generation=int(meta.get("generation", 0)),
                          format_version=int(meta.get("format_version", 0)), total_hits=hits, index_backend=backend)

    def entries(self, limit: int | None = None) -> list[EntryInfo]:
        """Entries, most recently used first."""
        return self.manifest.entries(limit)

    def prune(self, budget_bytes: int | None = None) -> list[int]:
        """Evict by policy until the latents fit `budget_bytes` (default: the configured budget)."""
        budget = self.config.budget_bytes if budget_bytes is None else int(budget_bytes)
        with self._writer_lock():
            with self.manifest.write() as cur:
                total = self._total_bytes(cur)
                victims = self._victims(cur, total - budget) if total > budget else []
                files = self._delete_rows(cur, victims)
            lat.remove_files(self.latent_dir, [f for f in files if is_entry_file_name(f)])
            self._sync_index()
        return victims

    def clear(self) -> int:
        """Remove every entry, entity and latent file; return how many entries were removed."""
        with self._writer_lock():
            with self.manifest.write() as cur:
                n = cur.execute("SELECT COUNT(*) FROM entries").fetchone()[0]
                files = [r[0] for r in cur.execute("SELECT file FROM entries")]
                for table in ("postings", "entries", "entities", "index_log", "groups"):
                    cur.execute(f"DELETE FROM {table}")
                cur.execute("DELETE FROM meta WHERE key IN ('embedder', 'dim')")
                Manifest.set_meta(cur, "total_bytes", "0")
                Manifest.bump(cur, "generation")
                Manifest.bump(cur, "index_epoch")
            lat.remove_files(self.latent_dir, [f for f in files if is_entry_file_name(f)])
            for old in self.index_dir.iterdir():
                lat.remove_files(self.index_dir, [old.name])
            self._load_index()
        return n

    def verify(self, repair: bool = False) -> VerifyReport:
        """Check manifest integrity, every file's checksum, orphans and the index; fix them when `repair`."""
        report = VerifyReport()
        with self._writer_lock():
            try:
                status = self.manifest.query("PRAGMA integrity_check")[0][0]
            except sqlite3.DatabaseError as exc:
                status = str(exc)
            if status != "ok":
                report.problems.append(f"manifest integrity check failed: {status}")
                if repair:
                    self.manifest.close()
                    self._quarantine_manifest()
                    self.manifest = Manifest(self.root / MANIFEST_NAME)
                    n = self._recover_from_files(self.manifest)
                    report.repaired.append(f"rebuilt the manifest from {n} latent files")
            rows = self.manifest.query("SELECT id, file, checksum FROM entries")
            report.checked = len(rows)
            bad = []
            for row in rows:
                try:
                    if not is_entry_file_name(row["file"]):
                        raise CacheEntryError(f"invalid file name {row['file']!r}")
                    lat.read_verified(self.latent_dir / row["file"], row["checksum"])
                except CacheEntryError as exc:
                    report.problems.append(f"entry {row['id']}: {exc}")
                    bad.append(row["id"])
            orphan_entities = self.manifest.query(
                "SELECT COUNT(*) FROM entities WHERE NOT EXISTS "
                "(SELECT 1 FROM postings WHERE postings.entity_id = entities.id)")[0][0]
            dangling = self.manifest.query(
                "SELECT COUNT(*) FROM postings WHERE entry_id NOT IN (SELECT id FROM entries)")[0][0]
            counted = self.manifest.query("SELECT COALESCE(SUM(nbytes), 0) FROM entries")[0][0]
            if int(self.manifest.meta("total_bytes", "0") or 0) != counted:
                report.problems.append("the byte counter disagrees with the entries")
            if orphan_entities:
                report.problems.append(f"{orphan_entities} entities belong to no entry")
            if dangling:
                report.problems.append(f"{dangling} postings point to missing entries")
            vouched = {r["file"] for r in rows}
            orphans = [p.name for p in self.latent_dir.iterdir() if p.name not in vouched and
                       (is_entry_file_name(p.name) or p.name.startswith(lat.TMP_PREFIX))]
            if orphans:
                report.problems.append(f"{len(orphans)} file(s) in {self.latent_dir} not in the manifest")
            self._sync_index()
            n_entities = self.manifest.query("SELECT COUNT(*) FROM entities")[0][0]
            if self._index is not None and len(self._index) != n_entities:
                report.problems.append(f"index holds {len(self._index)} vectors, manifest {n_entities} entities")
            if repair:
                if bad:
                    self._drop_entries(bad)
                    report.repaired.append(f"dropped {len(bad)} damaged entries")
                if orphan_entities or dangling:
                    with self.manifest.write() as cur:
                        cur.execute("DELETE FROM postings WHERE entry_id NOT IN (SELECT id FROM entries)")
                        gone = [r[0] for r in cur.execute(
                            "SELECT id FROM entities WHERE NOT EXISTS "
                            "(SELECT 1 FROM postings WHERE postings.entity_id = entities.id)")]
                        for g in gone:
                            cur.execute("DELETE FROM entities WHERE id=?", (g,))
                            cur.execute("INSERT INTO index_log(entity_id, op) VALUES (?, 'del')", (g,))
                        Manifest.bump(cur, "generation")
                    report.repaired.append("removed orphan entities and dangling postings")
                self._reconcile_files(report)
                self._recount_bytes()
                dim = self._dim()
                if dim is not None:
                    self._rebuild_index(dim, int(self.manifest.meta("index_epoch", "0") or 0))
                    self._save_index()
                    report.repaired.append("rebuilt the entity index")
        return report

    def repair(self) -> VerifyReport:
        """verify(repair=True)."""
        return self.verify(repair=True)

    def flush(self) -> None:
        """Persist the entity index now."""
        with self._writer_lock():
            self._sync_index()
            self._save_index()

    def close(self) -> None:
        """Persist the index if it changed and close the manifest."""
        try:
            if self._unsaved:
                self.flush()
        except (Timeout, OSError, sqlite3.Error) as exc:
            log.warning("[CHAI] could not save the entity index on close: %s", exc)
        finally:
            self.manifest.close()

    def __enter__(self) -> "CacheStore":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
