"""Maintenance of a cache folder: a read-only verify, and repair, prune and clear (the only actions that delete)."""
from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path

import numpy as np

from .. import latents as lat
from .. import regular_files
from ..errors import CacheError
from ..index.keeper import INDEX_STATE, IndexKeeper
from ..index.vector_index import IndexLoadError, VectorIndex
from ..naming import is_entry_file_name
from ..types import VerifyReport, shape_key
from ..validate import UNIT_TOLERANCE
from .layout import INDEX_DIR, LATENT_DIR
from .manifest import MANIFEST_NAME, Manifest
from .recovery import adopt_unlisted, quarantine, rebuild_manifest, sweep_temporaries
from .rows import delete_entries, policy_in, recount_bytes, stored_setting, victims

log = logging.getLogger(__name__)

RECHECKS = 3          # verify looks again this often at files no row lists (while other processes write) ...
RECHECK_WAIT_S = 0.2  # ... this long apart
TMP_IN_FLIGHT_S = 60.0  # a temporary latent file younger than this may be a write in progress, not a leftover


def _age(path: Path) -> float:
    try:
        return time.time() - path.lstat().st_mtime
    except FileNotFoundError:
        return 0.0  # renamed into place meanwhile


def _size(row: dict) -> int | None:
    """The size a row says its file has (None when the row is malformed)."""
    return row["nbytes"] if isinstance(row["nbytes"], int) else None


def _file_problem(latent_dir: Path, row: dict) -> str | None:
    """Why an entry's file cannot serve it, or None when it is intact and matches its row."""
    name = row["file"]
    if not is_entry_file_name(name):
        return f"invalid file name {name!r} in the manifest"
    try:
        record, data = lat.read_entry_file(latent_dir / name, _size(row))
    except OSError as exc:
        return f"latent file {name} is missing or not a regular file ({exc.strerror or exc})"
    except CacheError as exc:
        return f"latent file {name} is damaged: {exc}"
    if len(data) != row["nbytes"] or lat.checksum(data) != row["checksum"]:
        return f"latent file {name} fails its checksum or size (truncated or modified)"
    if shape_key(record.shape) != row["shape"] or record.dtype != row["dtype"]:
        return f"latent file {name} holds {record.dtype} {list(record.shape)}, the manifest says {row['dtype']} " \
               f"{row['shape']}"
    return None


def _unlisted_problem(latent_dir: Path, name: str, limit: int | None = None) -> str:
    try:
        lat.read_entry_file(latent_dir / name, limit)
    except (OSError, CacheError) as exc:
        return f"{name} is not in the manifest and is unusable ({exc}): open or repair quarantines it"
    return f"{name} is not in the manifest: open or repair adopts it"


def _bad_vectors(manifest: Manifest) -> list[int]:
    dim = int(manifest.meta("dim", "0") or 0)
    bad = []
    for eid, blob in manifest.query("SELECT id, vector FROM entities"):
        vec = np.frombuffer(blob, np.float32) if isinstance(blob, bytes) and len(blob) == 4 * dim else None
        if vec is None or not np.isfinite(vec).all() or abs(float(np.linalg.norm(vec)) - 1.0) > UNIT_TOLERANCE:
            bad.append(eid)
    return bad


def _check_manifest(manifest: Manifest, latent_dir: Path, index_dir: Path, report: VerifyReport) -> None:
    status = manifest.query("PRAGMA integrity_check")[0][0]
    if status != "ok":
        report.problems.append(f"manifest integrity check failed: {status}")
    rows = [dict(r) for r in manifest.query("SELECT id, file, nbytes, checksum, shape, dtype FROM entries")]
    report.checked = len(rows)
    bad = [(row, problem) for row in rows if (problem := _file_problem(latent_dir, row))]
    scanned = [p.name for p in sorted(latent_dir.iterdir()) if is_entry_file_name(p.name)]
    bad, unlisted = settled(manifest, latent_dir, bad, scanned)
    report.problems += [f"entry {row['id']}: {problem}" for row, problem in bad]
    limit = stored_setting("budget_bytes", manifest.meta("budget_bytes"))
    report.problems += [_unlisted_problem(latent_dir, name, limit) for name in unlisted]
    counted, counter = manifest.query("SELECT (SELECT COALESCE(SUM(nbytes), 0) FROM entries), "
                                      "(SELECT value FROM meta WHERE key = 'total_bytes')")[0]  # one snapshot
    if int(counter or 0) != counted:
        report.problems.append("the byte counter disagrees with the entries")
    orphans = manifest.query("SELECT COUNT(*) FROM entities WHERE NOT EXISTS "
                             "(SELECT 1 FROM postings WHERE postings.entity_id = entities.id)")[0][0]
    if orphans:
        report.problems.append(f"{orphans} entities belong to no entry")
    dangling = manifest.query("SELECT COUNT(*) FROM postings WHERE entry_id NOT IN (SELECT id FROM entries)")[0][0]
    if dangling:
        report.problems.append(f"{dangling} postings point to missing entries")
    bad_vectors = _bad_vectors(manifest)
    if bad_vectors:
        report.problems.append(f"{len(bad_vectors)} entity vector(s) are not finite unit vectors")
    _check_index(manifest, index_dir, report)


def settled(manifest: Manifest, latent_dir: Path, bad: list[tuple[dict, str]],
            scanned: list[str]) -> tuple[list[tuple[dict, str]], list[str]]:
    """The problems that hold against the manifest as it is after the directory scan: a file a writer renamed
    in just before its row committed is listed by now, a row evicted meanwhile is gone (not a problem)."""
    for attempt in range(RECHECKS + 1):
        listed = {str(r[0]): int(r[1]) for r in manifest.query("SELECT file, id FROM entries")}
        bad = [(row, problem) for row, problem in bad if listed.get(row["file"]) == row["id"]]
        scanned = [name for name in scanned if name not in listed and os.path.lexists(latent_dir / name)]
        if not scanned or attempt == RECHECKS:
            return bad, scanned
        time.sleep(RECHECK_WAIT_S)  # a commit in flight lands within milliseconds; a real stray file stays
    return bad, scanned


def _check_index(manifest: Manifest, index_dir: Path, report: VerifyReport) -> None:
    """Load the saved index the way open would (validated) and say if open would have to rebuild it."""
    dim = manifest.meta("dim")
    state_path = index_dir / INDEX_STATE
    if not dim or not state_path.exists():
        return
    for attempt in (0, 1):  # a writer saving a new index meanwhile replaces the file state.json named
        try:
            state = json.loads(regular_files.read_text(state_path))
            if not lat.is_leaf_name(state["file"]) or state["file"].startswith("."):
                raise IndexLoadError("invalid index file name")
            why = regular_files.refusal(index_dir / state["file"])
            if why:
                raise IndexLoadError(why)
            VectorIndex.load(index_dir / state["file"], int(dim))
            return
        except (OSError, ValueError, KeyError, TypeError, IndexLoadError) as exc:
            if attempt:
                report.problems.append(f"the saved entity index is refused ({exc}); open rebuilds it from the "
                                       "manifest")
            else:
                time.sleep(RECHECK_WAIT_S)


def verify_folder(root: Path) -> VerifyReport:
    """Every problem of a cache folder, read through a read-only manifest connection; nothing is written."""
    report = VerifyReport()
    root = Path(root)
    latent_dir, index_dir = root / LATENT_DIR, root / INDEX_DIR
    if not latent_dir.is_dir():
        report.problems.append(f"{root} has no {LATENT_DIR}/ folder (not a cache, or never opened)")
        return report
    for path in sorted(latent_dir.iterdir()):
        if path.name.startswith(lat.TMP_PREFIX) and _age(path) > TMP_IN_FLIGHT_S:  # younger: a write in flight
            report.problems.append(f"leftover temporary file {path.name} (the next open removes it)")
    manifest_path = root / MANIFEST_NAME
    if not manifest_path.exists():
        report.problems.append("the manifest is missing: the next open rebuilds it from the latent files")
        for path in sorted(latent_dir.iterdir()):
            if is_entry_file_name(path.name):
                report.problems.append(_unlisted_problem(latent_dir, path.name))
        return report
    try:
        manifest = Manifest(manifest_path, readonly=True)
    except CacheError as exc:
        report.problems.append(f"the manifest is unusable ({exc}): open and repair rebuild it from the latent files")
        return report
    try:
        _check_manifest(manifest, latent_dir, index_dir, report)
    except CacheError as exc:
        report.problems.append(f"the manifest could not be read to the end ({exc})")
    finally:
        manifest.close()
    return report


def repair(manifest: Manifest, root: Path, keeper: IndexKeeper, on_open: list[str]) -> VerifyReport:
    """Verify, then fix (the folder's writer lock held): rebuild a damaged manifest in place, drop entries whose
    files are bad (files quarantined), adopt or quarantine unlisted files, drop orphan rows and bad vectors,
    recount, rebuild the index. `on_open`: what opening the folder already adopted or quarantined."""
    latent_dir, index_dir = root / LATENT_DIR, root / INDEX_DIR
    report = verify_folder(root)
    report.repaired += [f"on open: {line}" for line in on_open]
    for name in sweep_temporaries(root, latent_dir, index_dir):
        report.repaired.append(f"removed temporary file {name}")
    if any(p.startswith(("manifest integrity", "the manifest could not")) for p in report.problems):
        manifest.close()
        rebuilt = rebuild_manifest(root, latent_dir, "repair: " + report.problems[0])
        manifest.reopen()
        report.repaired += rebuilt.lines()
    _drop_bad_entries(manifest, root, report)
    with manifest.write() as cur:
        cur.execute("DELETE FROM postings WHERE entry_id NOT IN (SELECT id FROM entries)")
        if cur.rowcount:
            report.repaired.append(f"removed {cur.rowcount} dangling postings")
    bad = _bad_vectors(manifest)
    with manifest.write() as cur:
        gone = [r[0] for r in cur.execute("SELECT id FROM entities WHERE NOT EXISTS "
                                          "(SELECT 1 FROM postings WHERE postings.entity_id = entities.id)")]
        held = [r[0] for r in cur.execute(
            f"SELECT DISTINCT entry_id FROM postings WHERE entity_id IN ({','.join('?' * len(bad))})", bad)]
        files = delete_entries(cur, held) if held else []
        for eid in set(gone) | set(bad):
            cur.execute("DELETE FROM entities WHERE id=?", (eid,))
            cur.execute("DELETE FROM postings WHERE entity_id=?", (eid,))
            cur.execute("INSERT INTO index_log(entity_id, op) VALUES (?, 'del')", (eid,))
        Manifest.bump(cur, "generation")
    _quarantine_files(root, files, "its entry had an invalid entity vector", report)
    if gone:
        report.repaired.append(f"removed {len(gone)} entities that belonged to no entry")
    if bad:
        report.repaired.append(f"removed {len(bad)} invalid entity vectors and the {len(held)} entries "
                               "holding them")
    report.repaired += adopt_unlisted(manifest, root, latent_dir).lines()
    with manifest.write() as cur:
        recount_bytes(cur)
        Manifest.bump(cur, "index_epoch")
    keeper.rebuild()
    keeper.save()
    report.repaired.append("rebuilt and saved the entity index")
    return report


def _drop_bad_entries(manifest: Manifest, root: Path, report: VerifyReport) -> None:
    latent_dir = root / LATENT_DIR
    rows = [dict(r) for r in manifest.query("SELECT id, prompt, file, nbytes, checksum, shape, dtype FROM entries")]
    budget = stored_setting("budget_bytes", manifest.meta("budget_bytes"))
    for row in rows:
        problem = _file_problem(latent_dir, row)
        if problem is None:
            continue
        with manifest.write() as cur:
            delete_entries(cur, [row["id"]])
        path = latent_dir / row["file"]
        moved = ""
        if is_entry_file_name(row["file"]) and (path.exists() or path.is_symlink()):
            try:
                _, data = lat.read_entry_file(path, budget)  # the row may be what is wrong: judge by the budget
                if lat.checksum(data) != row["checksum"]:
                    raise CacheError("the file's bytes differ from what was committed")
                moved = "; its file is intact and is adopted again"
            except (OSError, CacheError):
                quarantine(root, path, f"entry {row['id']}: {problem}")
                moved = "; its file was quarantined"
        report.repaired.append(f"dropped entry {row['id']} ({str(row['prompt'])[:60]!r}): {problem}{moved}")


def _quarantine_files(root: Path, files: list[str], reason: str, report: VerifyReport) -> None:
    for name in files:
        path = root / LATENT_DIR / name
        if is_entry_file_name(name) and (path.exists() or path.is_symlink()):
            quarantine(root, path, reason)
            report.repaired.append(f"quarantined {name}: {reason}")


def prune(manifest: Manifest, latent_dir: Path, keeper: IndexKeeper, budget_bytes: int) -> list[int]:
    """Evict by policy until the latents fit `budget_bytes` (the folder's writer lock held)."""
    with manifest.write() as cur:
        total = int(cur.execute("SELECT value FROM meta WHERE key='total_bytes'").fetchone()[0])
        chosen = victims(cur, total - budget_bytes, policy_in(cur))
        files = delete_entries(cur, chosen)
    lat.remove_files(latent_dir, [f for f in files if is_entry_file_name(f)])
    keeper.sync()
    return chosen


def clear(manifest: Manifest, latent_dir: Path, index_dir: Path, keeper: IndexKeeper) -> int:
    """Remove every entry, entity, latent file and the saved index (the folder's writer lock held); quarantine/
    is left for inspection."""
    with manifest.write() as cur:
        n = cur.execute("SELECT COUNT(*) FROM entries").fetchone()[0]
        files = [r[0] for r in cur.execute("SELECT file FROM entries")]
        for table in ("postings", "entries", "entities", "index_log", "groups"):
            cur.execute(f"DELETE FROM {table}")
        cur.execute("DELETE FROM meta WHERE key IN ('embedder', 'dim')")
        Manifest.set_meta(cur, "total_bytes", "0")
        Manifest.bump(cur, "generation")
        Manifest.bump(cur, "index_epoch")
    lat.remove_files(latent_dir, [f for f in files if is_entry_file_name(f)])
    lat.remove_files(index_dir, [p.name for p in index_dir.iterdir() if p.is_file()])
    keeper.load()
    return n
