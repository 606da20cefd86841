"""Lookup ranking over the manifest's postings, and the reasons a lookup missed."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from ..entities.roles import SCENE
from ..types import EmbeddedEntities, Match, shape_key
from .decision import features, side_of
from .rule import HitRule, matched_role

NEIGHBOURS = 16          # stored entities considered per query entity (postings make popularity free)
CANDIDATES = 8           # entries tried in order when the best one turns out unreadable
DECIDED_SPARES = 2       # proposed entries the decision accepts before it stops asking
SCENE_WINDOW = 64        # best entries the scene clause is tried on before it runs on all of them
SIBLINGS = 512           # stored entities of one identity a matched entity stands for (the newest) ...
SIBLINGS_TOTAL = 2048    # ... and of all identities of one lookup, the closest identities first (bounds the worst)


@dataclass(frozen=True)
class StoredEntity:
    """What the manifest knows of a stored entity (head and core are '' for entities of format v1)."""

    text: str
    kind: str
    head: str
    core: str

    @property
    def identity(self) -> str:
        """What the thing is (as `Entity.identity`)."""
        return self.core or self.head


def stored_entities(manifest: Any, ids: Sequence[int]) -> dict[int, StoredEntity]:
    """Manifest rows of these entity ids."""
    out: dict[int, StoredEntity] = {}
    ids = sorted(set(ids))
    for start in range(0, len(ids), 500):
        part = ids[start:start + 500]
        marks = ",".join("?" * len(part))
        for eid, text, kind, head, core in manifest.query(
                f"SELECT id, text, kind, head, core FROM entities WHERE id IN ({marks})", part):
            out[eid] = StoredEntity(text, kind, head or text.rsplit(" ", 1)[-1], core)
    return out


def with_siblings(manifest: Any, matched: list[tuple[int, int, float]]
                  ) -> tuple[list[tuple[int, int, float]], dict[int, StoredEntity]]:
    """The matches, plus every other stored entity of a matched entity's identity at the same similarity (the
    newest SIBLINGS of each), and the manifest rows of the siblings read on the way. Texts of one identity share
    one vector ("red car", "old car": "car"), so in a large cache the index's nearest neighbours can all be texts
    of one identity while its other texts, and the entries that hold them, lie past them."""
    ids = sorted({eid for _, eid, _ in matched})
    marks = ",".join("?" * len(ids))
    kind_of = {int(eid): (core, head) for eid, core, head in manifest.query(
        f"SELECT id, core, head FROM entities WHERE id IN ({marks}) AND head <> ''", ids)}  # v1 rows: no identity
    best: dict[tuple[int, int], float] = {}
    by_kind: dict[tuple[int, tuple[str, str]], float] = {}  # (query entity, identity) -> its best similarity
    for q, eid, sim in matched:
        best[(q, eid)] = max(best.get((q, eid), -2.0), sim)
        if eid in kind_of:
            key = (q, kind_of[eid])
            by_kind[key] = max(by_kind.get(key, -2.0), sim)
    closest: dict[tuple[str, str], float] = {}
    for (_, kind), sim in by_kind.items():
        closest[kind] = max(closest.get(kind, -2.0), sim)
    rows: dict[int, StoredEntity] = {}
    family: dict[tuple[str, str], list[int]] = {kind: [] for kind in closest}
    budget = SIBLINGS_TOTAL
    for kind in sorted(closest, key=lambda k: (-closest[k], k)):  # the closest identities first
        if budget <= 0:
            break
        found = manifest.query("SELECT id, text, kind, head, core FROM entities WHERE core = ? AND head = ? "
                               "ORDER BY id DESC LIMIT ?", (*kind, min(SIBLINGS, budget)))
        budget -= len(found)
        family[kind] = [int(r[0]) for r in found]
        rows.update((int(r[0]), StoredEntity(r[1], r[2], r[3], r[4])) for r in found)
    for (q, kind), sim in by_kind.items():  # once per query entity and identity, not per neighbour
        for other in family[kind]:
            best[(q, other)] = max(best.get((q, other), -2.0), sim)
    return [(q, eid, sim) for (q, eid), sim in best.items()], rows


def borrowable(manifest: Any, entities: EmbeddedEntities, matched: list[tuple[int, int, float]],
               rule: HitRule, known: dict[int, StoredEntity] | None = None) -> list[tuple[int, int, float]]:
    """The matches that may carry a hit: the request's main subject or scene naming the same kind of thing as
    the stored entity (whose role in each entry the ranking checks). `known`: manifest rows already read."""
    query_ok = {q for q, e in enumerate(entities.entities) if e.role in rule.roles}
    candidates = [m for m in matched if m[0] in query_ok]
    known = known or {}
    stored = {**stored_entities(manifest, [eid for _, eid, _ in candidates if eid not in known]), **known}
    return [(q, eid, sim) for q, eid, sim in candidates
            if eid in stored and rule.same_thing(entities.entities[q], stored[eid], sim)]


def rank(manifest: Any, matched: list[tuple[int, int, float]], fingerprint: str, shape: str, rule: HitRule,
         scenes: Sequence[int] | None = None) -> list[int]:
    """Compatible entries, where the matched entities hold one of the rule's roles, ordered by matched query
    entities, then summed similarity, then newest. With `scenes` (the stored entity ids the request's scenes
    match), the rule's scene clause runs too, before the candidate limit."""
    group = manifest.query("SELECT id FROM groups WHERE fingerprint=? AND shape=?", (fingerprint, shape))
    if not group:
        return []
    values = ",".join(["(?,?,?)"] * len(matched))
    params: list[Any] = [x for triple in matched for x in triple]
    roles, role_params = rule.roles_sql("p.role")
    where, where_params = rule.scenes_sql(scenes)
    # The join is pinned to matched entities -> their postings in this group (one range scan each): SQLite's
    # CROSS JOIN; PostgreSQL plans that order by itself and spells it JOIN.
    best = (f"WITH m(q, eid, sim) AS (VALUES {values}), "
            "best AS (SELECT p.entry_id AS entry_id, m.q AS q, MAX(m.sim) AS sim "
            f"FROM m {manifest.PINNED_JOIN} postings p ON p.group_id = ? AND p.entity_id = m.eid "
            f"AND {roles} GROUP BY p.entry_id, m.q)")
    head = params + [group[0][0], *role_params]
    order = "ORDER BY n DESC, s DESC, entry_id DESC"
    if where:
        # The scene clause costs two subqueries per entry: run it on the SCENE_WINDOW best entries first (the same
        # order, so the first CANDIDATES that pass there are the first that pass at all), and on every entry only
        # when fewer pass in that window (a miss by scene, or a small cache).
        rows = manifest.query(
            f"{best}, ranked AS (SELECT entry_id, COUNT(*) AS n, SUM(sim) AS s FROM best GROUP BY entry_id {order} "
            f"LIMIT ?) SELECT entry_id, n, s FROM ranked AS best {where}{order} LIMIT ?",  # the clause names `best`
            head + [SCENE_WINDOW, *where_params, CANDIDATES])
        if len(rows) == CANDIDATES:
            return [r[0] for r in rows]
    sql = f"{best} SELECT entry_id, COUNT(*) AS n, SUM(sim) AS s FROM best {where}GROUP BY entry_id {order} LIMIT ?"
    rows = manifest.query(sql, head + [*where_params, CANDIDATES])
    return [r[0] for r in rows]


def same_prompt(a: str, b: str) -> bool:
    """Whether two prompts are the same text up to case and spacing (and not empty)."""
    return " ".join(a.lower().split()) == " ".join(b.lower().split()) != ""


def same_prompt_first(manifest: Any, prompt: str, candidates: list[int]) -> list[int]:
    """The candidates with entries of this very prompt moved to the front (a re-rolled seed finds its own entry,
    which a few-step model can restart from), the order kept otherwise."""
    if not prompt or len(candidates) < 2:
        return candidates
    marks = ",".join("?" * len(candidates))
    prompts = dict(manifest.query(f"SELECT id, prompt FROM entries WHERE id IN ({marks})", list(candidates)))
    first = [c for c in candidates if same_prompt(prompt, str(prompts.get(c, "")))]
    return first + [c for c in candidates if c not in first]


def donor_side(manifest: Any, entry_id: int, dim: int) -> Any:
    """A stored entry's entities, roles and vectors, as the decision reads them (`decision.Side`)."""
    rows = manifest.query("SELECT e.text, e.kind, e.head, e.core, e.vector, p.role FROM postings p JOIN entities e "
                          "ON e.id = p.entity_id WHERE p.entry_id = ? ORDER BY e.id", (entry_id,))
    rows = [r for r in rows if r[4] is not None and len(bytes(r[4])) == 4 * dim]
    ents = [StoredEntity(text, kind, head or text.rsplit(" ", 1)[-1], core) for text, kind, head, core, _, _ in rows]
    vectors = [np.frombuffer(bytes(r[4]), dtype=np.float32) for r in rows]
    return side_of(ents, [r[5] for r in rows], np.stack(vectors) if vectors else np.zeros((0, dim), np.float32))


def decide(manifest: Any, entities: EmbeddedEntities, candidates: list[int], rule: HitRule) -> tuple[list[int], str]:
    """The proposed donors the rule's learned decision accepts, in order, and why the best refused one was
    refused ('' when none was); all of them when the rule has no decision or it was fitted on another embedder."""
    model = rule.decision
    if model is None or not candidates or not model.applies_to(entities.embedder):
        return candidates, ""
    request = side_of(entities.entities, [e.role for e in entities.entities], entities.vectors)
    kept: list[int] = []
    best = (-1.0, "")
    for entry_id in candidates:
        if len(kept) >= DECIDED_SPARES:
            break  # a hit loads the first; the others only stand in for a damaged one
        values = features(request, donor_side(manifest, entry_id, entities.vectors.shape[1]), rule)
        p = model.probability(values)
        if p >= model.threshold:
            kept.append(entry_id)
        elif p > best[0]:
            best = (p, f"the entries that share entities were refused by the hit decision (best p {p:.2f} < "
                       f"{model.threshold:.2f}: {explain(values)})")
    return kept, best[1]


def explain(values: dict[str, float]) -> str:
    """What a refused donor lacked, in words."""
    why = []
    if values.get("primary_missing") or values.get("main_missing"):
        why.append("the request's main subject is not in them")
    if values.get("compound_differs"):
        why.append("a look-alike compound ('sea lion' / 'lion')")
    if values.get("scene_conflict"):
        why.append("another scene")
    if values.get("context_sim", 1.0) < 0.6:
        why.append(f"different surroundings (in-context similarity {values['context_sim']:.2f})")
    return "; ".join(why) or "too little shared"


def agreeing_scenes(entities: EmbeddedEntities, matched: list[tuple[int, int, float]]) -> list[int] | None:
    """Stored entity ids the request's scenes match (None when the request names no scene: no scene filter).

    Only the index's nearest stored entities of each scene are candidates (`NEIGHBOURS`), so a stored scene past
    them counts as another scene: a miss that could have been a hit, never a hit from another scene.
    """
    scenes = {q for q, e in enumerate(entities.entities) if e.role == SCENE}
    if not scenes:
        return None
    return sorted({eid for q, eid, _ in matched if q in scenes})


def entry_scene(manifest: Any, entry_id: int) -> str:
    """The text of an entry's scene ('' when it names none): what a miss refused for another scene names."""
    rows = manifest.query("SELECT e.text FROM postings p JOIN entities e ON e.id = p.entity_id "
                          "WHERE p.entry_id = ? AND p.role = ? ORDER BY e.id LIMIT 1", (entry_id, SCENE))
    return rows[0][0] if rows else ""


def matches_for(manifest: Any, entry_id: int, entities: EmbeddedEntities,
                 matched: list[tuple[int, int, float]]) -> list[Match]:
    held = {r[0]: (r[1], r[2]) for r in manifest.query(
        "SELECT e.id, e.text, p.role FROM postings p JOIN entities e ON e.id = p.entity_id WHERE p.entry_id=?",
        (entry_id,))}
    best: dict[int, tuple[float, str, str]] = {}
    for q, eid, sim in matched:
        if eid in held and sim > best.get(q, (-2.0, "", ""))[0]:
            best[q] = (sim, *held[eid])
    return [Match(entities.entities[q].text, text, sim,
                  matched_role(entities.entities[q].role, role))
            for q, (sim, text, role) in sorted(best.items())]

def entity_texts(manifest: Any, ids: Sequence[int]) -> dict[int, str]:
    if not ids:
        return {}
    marks = ",".join("?" * len(ids))
    return {r[0]: r[1] for r in manifest.query(f"SELECT id, text FROM entities WHERE id IN ({marks})",
                                                     list(ids))}

def no_match_reason(manifest: Any, entities: EmbeddedEntities, labels: np.ndarray, sims: np.ndarray,
                     threshold: float) -> str:
    best_q, best_col, best = -1, -1, -2.0
    for q in range(labels.shape[0]):
        if labels.shape[1] and labels[q, 0] >= 0 and sims[q, 0] > best:
            best_q, best_col, best = q, 0, float(sims[q, 0])
    if best_q < 0:
        return "the cache is empty"
    text = entity_texts(manifest, [int(labels[best_q, best_col])]).get(int(labels[best_q, best_col]), "?")
    return (f"no cached entity reaches similarity {threshold:.2f} (closest: "
            f"'{entities.entities[best_q].text}'~'{text}' {best:.3f})")

def secondary_reason(manifest: Any, entities: EmbeddedEntities, matched: list[tuple[int, int, float]],
                     rule: HitRule) -> str:
    """Why entries that share similar entities are no hit: the best such pair, and what it is to each side."""
    q, eid, sim = max(matched, key=lambda m: m[2])
    stored = stored_entities(manifest, [eid]).get(eid)
    text = stored.text if stored else "?"
    role = entities.entities[q].role
    why = (f"'{entities.entities[q].text}' is a secondary element of this prompt" if role not in rule.roles
           else f"'{text}' is a secondary element of the cached prompts, or names another kind of thing")
    return (f"entries share only secondary elements or look-alike words ('{entities.entities[q].text}'~'{text}' "
            f"{sim:.3f}: {why}); a hit needs the main subject or the scene on both sides")


def incompatible_reason(manifest: Any, matched: list[tuple[int, int, float]], fingerprint: str,
                         shape: Sequence[int]) -> str:
    ids = sorted({eid for _, eid, _ in matched})[:500]
    marks = ",".join("?" * len(ids))
    rows = manifest.query(
        f"SELECT e.fingerprint, e.shape FROM entries e WHERE e.id IN "
        f"(SELECT entry_id FROM postings WHERE entity_id IN ({marks})) LIMIT 50", ids)
    if not rows:
        return "matched entities have no entries any more"
    if all(r[0] != fingerprint for r in rows):
        return (f"entries share entities but were made with another model (fingerprint {rows[0][0][:16]}..., "
                f"this run {fingerprint[:16]}...)")
    shapes = sorted({r[1] for r in rows if r[0] == fingerprint})
    return f"entries share entities but have latent shape {', '.join(shapes)}, this run {shape_key(shape)}"
