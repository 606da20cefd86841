"""One lookup, the same for every backend: index search, the hit rule, ranking over postings, loading the donor.

A backend supplies a `lookup.source.LookupSource`: its entity index (an IndexKeeper), a `db` the ranking queries run
on (the SQL contract is written down there), and how to read, touch and set aside an entry; everything that
decides a hit or names a miss is here, once.
"""
from __future__ import annotations

import itertools
import logging
import time
from typing import Sequence

from ..entities.roles import SCENE
from ..errors import CacheEntryError
from ..types import EmbeddedEntities, EntryInfo, LookupResult, shape_key
from . import ranking
from .source import LookupSource
from .rule import HitRule, SceneKeys

log = logging.getLogger(__name__)


def lookup(src: LookupSource, entities: EmbeddedEntities, fingerprint: str, shape: Sequence[int], rule: HitRule,
           touch: bool = True, load: bool = True) -> LookupResult:
    """Best compatible entry that `rule` lets serve the request, or a miss with its reason."""
    threshold = rule.threshold
    timings: dict[str, float] = {}
    t0 = time.perf_counter()
    if len(entities) == 0:
        return LookupResult(False, "the prompt has no entities to match", timings=timings)
    if "\0" in fingerprint:  # no backend stores one (PostgreSQL text cannot hold NUL): the same miss on both
        return LookupResult(False, "the model fingerprint holds a NUL character; no entry can match it",
                            timings=timings)
    stored = src.stored_embedder()
    if stored is None:
        return LookupResult(False, "the cache is empty", timings=timings)
    if stored != entities.embedder:
        return LookupResult(False, f"the cache was built with embedder {stored!r}, this lookup used "
                                   f"{entities.embedder!r}; use the same embedder or another cache name",
                            timings=timings)
    src.keeper.sync()
    found = src.keeper.query(entities.vectors, ranking.NEIGHBOURS)
    if found is None:
        return LookupResult(False, "the cache is empty", timings=timings)
    labels, sims = found
    timings["index"] = time.perf_counter() - t0
    t1 = time.perf_counter()
    db = src.db
    matched = [(q, int(lab), float(sim)) for q in range(len(entities))
               for lab, sim in zip(labels[q], sims[q]) if lab >= 0 and sim >= threshold]
    if not matched:
        timings["select"] = time.perf_counter() - t1
        return LookupResult(False, ranking.no_match_reason(db, entities, labels, sims, threshold), timings=timings)
    grouped = ranking.by_identity(db, matched)
    carried = ranking.borrowable(db, entities, grouped, rule)
    scenes = ranking.agreeing_scenes(entities, grouped) if rule.scenes_must_agree else None
    candidates = _rank(src, carried, fingerprint, shape, rule, scenes) if carried else []
    if not candidates and carried and scenes is not None:
        refused = _rank(src, carried, fingerprint, shape, rule)  # all of another scene
        if refused:
            timings["select"] = time.perf_counter() - t1
            here = next(e.text for e in entities.entities if e.role == SCENE)
            return LookupResult(False, f"the entries that share the main subject show another scene ('{here}' "
                                       f"here, '{ranking.entry_scene(db, refused[0])}' there); a donor from another "
                                       "scene leaks its look into the video, so this is a miss", timings=timings)
    candidates = ranking.same_prompt_first(db, entities.prompt, candidates)
    refusal: list[str] = []
    keeper = src.keeper
    accepted = ranking.decide(db, entities, candidates, rule, refusal, src.postings,
                              (id(keeper), keeper.epoch, keeper.resets), keeper.gen)
    first = next(accepted, None)
    timings["select"] = time.perf_counter() - t1
    if first is None and refusal:
        return LookupResult(False, refusal[0], timings=timings)
    if first is None:
        if not _rank(src, grouped, fingerprint, shape, rule.any_role()):
            return LookupResult(False, ranking.incompatible_reason(db, matched, fingerprint, shape), timings=timings)
        return LookupResult(False, ranking.secondary_reason(db, entities, matched, rule), timings=timings)
    t2 = time.perf_counter()
    damaged: list[tuple[EntryInfo | int, str]] = []
    for entry_id in itertools.chain([first], accepted):  # the next accepted donor only when one is damaged
        entry = src.entry(entry_id)
        if entry is None:
            if db.query("SELECT 1 FROM entries WHERE id = ?", (entry_id,)):
                damaged.append((entry_id, "its manifest row is malformed"))
            continue  # else evicted since it was ranked (by another process): nothing to set aside
        tensors = None
        if load:
            try:
                tensors = src.read_entry(entry)
            except CacheEntryError as exc:
                log.warning("[CHAI] skipping cache entry %d: %s", entry_id, exc)
                damaged.append((entry, str(exc)))
                continue
        if touch:
            entry = src.touch_best_effort(entry)
        timings["load"] = time.perf_counter() - t2
        src.set_aside(damaged)
        return LookupResult(True, "shared entities", entry=entry, latents=tensors, timings=timings,
                            matches=ranking.matches_for(db, entry_id, entities, carried))
    src.set_aside(damaged)
    timings["load"] = time.perf_counter() - t2
    return LookupResult(False, "the matching entries were unreadable (damaged files); they were set aside",
                        timings=timings)


def _rank(src: LookupSource, matched: ranking.Matched, fingerprint: str, shape: Sequence[int], rule: HitRule,
          scenes: SceneKeys | None = None) -> list[int]:
    """`ranking.rank`, from the source's held postings when it keeps them and every match names an identity."""
    held = src.postings
    if held is None or matched.entities or not matched:
        return ranking.rank(src.db, matched, fingerprint, shape_key(shape), rule, scenes)
    group = src.db.query("SELECT id FROM groups WHERE fingerprint=? AND shape=?", (fingerprint, shape_key(shape)))
    if not group:
        return []
    keeper = src.keeper
    return held.rank(src.db, (id(keeper), keeper.epoch, keeper.resets), keeper.gen, int(group[0][0]), matched, rule,
                     scenes, ranking.CANDIDATES)
