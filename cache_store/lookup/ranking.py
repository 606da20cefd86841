"""Lookup ranking over the manifest's postings, and the reasons a lookup missed."""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Iterator, Sequence

import numpy as np

from ..entities.roles import SCENE
from ..types import EmbeddedEntities, Match, shape_key
from . import mention_order, prompt_vector
from .decision import features, side_of
from .rule import HitRule, IdentityFilter, SceneKeys, matched_role, stored_head

NEIGHBOURS = 16          # stored entities considered per query entity (postings make popularity free)
CANDIDATES = 8           # entries tried in order when the best one turns out unreadable
SCENE_WINDOW = 64        # best entries the scene clause is tried on before it runs on all of them
SIM_STEP = 2.0 ** -16    # similarities are ranked in steps of this (exact binary fractions: sums never round)


def ranked_sim(sim: float) -> float:
    """A similarity as the ranking orders it: float noise below SIM_STEP (hnswlib's 1 - distance against numpy's
    product, 0.99999994 against 1.0) must not decide between two donors; equal matches go to the newest entry."""
    return round(sim / SIM_STEP) * SIM_STEP


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


def entity_rows(manifest: Any, columns: str, ids: Sequence[int]) -> list[tuple]:
    """`SELECT id, <columns>` of these entity ids, 500 ids a statement."""
    ids = sorted(set(ids))
    rows: list[tuple] = []
    for start in range(0, len(ids), 500):
        part = ids[start:start + 500]
        rows += manifest.query(f"SELECT id, {columns} FROM entities WHERE id IN ({','.join('?' * len(part))})", part)
    return rows


def stored_entities(manifest: Any, ids: Sequence[int]) -> dict[int, StoredEntity]:
    """Manifest rows of these entity ids."""
    return {eid: StoredEntity(text, kind, stored_head(head, text), core)
            for eid, text, kind, head, core in entity_rows(manifest, "text, kind, head, core", ids)}


@dataclass(frozen=True)
class IdentityMatch:
    """A request entity matching every stored entity of one identity (`core`, `head`) at `sim`, less those the
    hit rule's `same_thing` refuses by their own kind or words (`only`)."""

    q: int
    core: str
    head: str
    sim: float
    only: IdentityFilter = IdentityFilter()


@dataclass(frozen=True)
class Matched:
    """A lookup's matches: by identity (the many texts of one thing share its vector, so a match stands for all of
    them), and by stored entity id for rows of format v1, which name no identity."""

    identities: tuple[IdentityMatch, ...] = ()
    entities: tuple[tuple[int, int, float], ...] = ()  # (query entity, stored entity id, similarity)

    def __bool__(self) -> bool:
        return bool(self.identities or self.entities)

    def admits(self, q: int, stored: StoredEntity, entity_id: int, v1: bool) -> float | None:
        """The best similarity at which query entity `q` matches this stored entity, or None."""
        sims = ([s for qq, eid, s in self.entities if qq == q and eid == entity_id] if v1 else
                [m.sim for m in self.identities if m.q == q and (m.core, m.head) == (stored.core, stored.head)
                 and m.only.admits(stored.kind, stored.text)])
        return max(sims) if sims else None


def by_identity(manifest: Any, matched: list[tuple[int, int, float]]) -> Matched:
    """The index's neighbours grouped by what they are: each query entity's best similarity to each identity."""
    identity = {int(eid): (core, head) for eid, core, head in
                entity_rows(manifest, "core, head", [eid for _, eid, _ in matched])}
    best: dict[tuple[int, str, str], float] = {}
    old: dict[tuple[int, int], float] = {}
    for q, eid, sim in matched:
        if eid not in identity:
            continue  # gone since the index answered
        core, head = identity[eid]
        if head:
            best[(q, core, head)] = max(best.get((q, core, head), -2.0), sim)
        else:
            old[(q, eid)] = max(old.get((q, eid), -2.0), sim)
    return Matched(tuple(IdentityMatch(q, core, head, sim) for (q, core, head), sim in best.items()),
                   tuple((q, eid, sim) for (q, eid), sim in old.items()))


def borrowable(manifest: Any, entities: EmbeddedEntities, matched: Matched, rule: HitRule) -> Matched:
    """The matches that may carry a hit: the request's main subject or scene naming the same kind of thing as
    the stored entities (whose role in each entry the ranking checks)."""
    query_ok = {q for q, e in enumerate(entities.entities) if e.role in rule.roles}
    kept = []
    for m in matched.identities:
        if m.q in query_ok:
            only = rule.identity_filter(entities.entities[m.q], m.core, m.head, m.sim)
            if only is not None:
                kept.append(replace(m, only=only))
    old = [m for m in matched.entities if m[0] in query_ok]
    stored = stored_entities(manifest, [eid for _, eid, _ in old])
    return Matched(tuple(kept), tuple((q, eid, sim) for q, eid, sim in old
                                      if eid in stored and rule.same_thing(entities.entities[q], stored[eid], sim)))


def rank(manifest: Any, matched: Matched, fingerprint: str, shape: str, rule: HitRule,
         scenes: SceneKeys | None = None) -> list[int]:
    """Compatible entries, where the matched entities hold one of the rule's roles, ordered by matched query
    entities, then summed similarity, then newest. With `scenes` (the stored scenes the request's scenes match),
    the rule's scene clause runs too, before the candidate limit."""
    group = manifest.query("SELECT id FROM groups WHERE fingerprint=? AND shape=?", (fingerprint, shape))
    if not group or not matched:
        return []
    roles, role_params = rule.roles_sql("p.role")
    where, where_params = rule.scenes_sql(scenes, manifest.INSTR)
    join, scan = manifest.PINNED_JOIN, manifest.POSTINGS_SCAN
    tables: list[str] = []
    parts: list[str] = []
    params: list[Any] = []
    part_params: list[Any] = []
    # Joins pinned to matches -> their stored entities -> their postings in this group (index range scans each):
    # SQLite's CROSS JOIN; PostgreSQL plans that order by itself and spells it JOIN.
    if matched.identities:
        tables.append(f"mi(q, core, head, sim, drop_object, ban, ban_any, keep) AS (VALUES "
                      f"{','.join(['(?,?,?,?,?,?,?,?)'] * len(matched.identities))})")
        params += [x for m in matched.identities for x in (m.q, m.core, m.head, ranked_sim(m.sim), *m.only.row())]
        parts.append(f"SELECT p.entry_id AS entry_id, mi.q AS q, mi.sim AS sim FROM mi {join} entities e "
                     f"ON e.core = mi.core AND e.head = mi.head AND {rule.identity_sql('mi', 'e', manifest.INSTR)} "
                     f"{join} {scan} ON p.group_id = ? AND p.entity_id = e.id AND {roles}")
        part_params += [group[0][0], *role_params]
    if matched.entities:
        tables.append(f"me(q, eid, sim) AS (VALUES {','.join(['(?,?,?)'] * len(matched.entities))})")
        params += [x for q, eid, sim in matched.entities for x in (q, eid, ranked_sim(sim))]
        parts.append(f"SELECT p.entry_id AS entry_id, me.q AS q, me.sim AS sim FROM me {join} {scan} "
                     f"ON p.group_id = ? AND p.entity_id = me.eid AND {roles}")
        part_params += [group[0][0], *role_params]
    best = (f"WITH {', '.join(tables)}, best AS (SELECT entry_id, q, MAX(sim) AS sim FROM "
            f"({' UNION ALL '.join(parts)}) AS h GROUP BY entry_id, q)")
    head = params + part_params
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


def donor_side(manifest: Any, entry_id: int, dim: int, embedder: str | None = None) -> Any:
    """A stored entry's entities, roles and vectors, as the decision reads them (`decision.Side`), in its prompt's
    order when the entry keeps it (`mention_order`), with its prompt vector when `embedder` is given and the entry
    keeps one of that embedder."""
    rows = manifest.query("SELECT e.text, e.kind, e.head, e.core, e.vector, p.role FROM postings p JOIN entities e "
                          "ON e.id = p.entity_id WHERE p.entry_id = ? ORDER BY e.id", (entry_id,))
    rows = [r for r in rows if r[4] is not None and len(bytes(r[4])) == 4 * dim]
    meta = manifest.query("SELECT meta FROM entries WHERE id = ?", (entry_id,))
    meta = prompt_vector.as_mapping(meta[0][0]) if meta else None  # parsed once, for both readers
    # the prompt's order, not the ids' (rows are shared by text): the subject rule reads the first-named main subject
    rows = [rows[i] for i in mention_order.in_mention_order([r[0] for r in rows], mention_order.order_of(meta))]
    ents = [StoredEntity(text, kind, stored_head(head, text), core) for text, kind, head, core, _, _ in rows]
    vectors = [np.frombuffer(bytes(r[4]), dtype=np.float32) for r in rows]
    prompt = prompt_vector.decoded(meta, embedder, dim) if embedder is not None and meta is not None else None
    return side_of(ents, [r[5] for r in rows], np.stack(vectors) if vectors else np.zeros((0, dim), np.float32),
                   prompt)


def decide(manifest: Any, entities: EmbeddedEntities, candidates: list[int], rule: HitRule,
           refusal: list[str], held: Any = None, base: Any = None, generation: int = 0) -> Iterator[int]:
    """The proposed donors the rule's learned decision accepts, in order, decided one at a time as the caller asks
    (a hit loads the first; the others only stand in for a damaged one); when none is accepted, `refusal` ends up
    holding why the best refused one was refused. All of them when the rule has no decision or it was fitted on
    another embedder. `held` (a `PostingCache`) keeps donors read before, under the change log `base` at
    `generation`."""
    model = rule.decision
    if model is None or not candidates or not model.applies_to(entities.embedder):
        yield from candidates
        return
    request = side_of(entities.entities, [e.role for e in entities.entities], entities.vectors)
    dim, embedder = entities.vectors.shape[1], entities.embedder if model.reads_prompt else None
    best = -1.0
    for entry_id in candidates:
        if held is None:
            donor = donor_side(manifest, entry_id, dim, embedder)
        else:
            donor = held.side(base, generation, (entry_id, dim, embedder),
                              lambda entry_id=entry_id: donor_side(manifest, entry_id, dim, embedder))
        deciding = model.for_donor(donor)
        values = features(request, donor, rule)
        if deciding.accepts(values):
            yield entry_id
            continue
        p = deciding.probability(values)
        if p > best:
            best = p
            refusal[:] = [f"the entries that share entities were refused by the hit decision (best p {p:.2f} < "
                          f"{deciding.threshold:.2f}: {explain(values)})"]


BACKDROP = 0.5  # a request entity this far from the donor's whole prompt is at most a backdrop of it


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
    if 0.0 < values.get("donor_prompt_best", 0.0) < BACKDROP:
        why.append(f"what the request names is not what the donor is about (prompt similarity "
                   f"{values['donor_prompt_best']:.2f})")
    return "; ".join(why) or "too little shared"


def agreeing_scenes(entities: EmbeddedEntities, matched: Matched) -> SceneKeys | None:
    """The stored scenes the request's scenes match (None when the request names no scene: no scene filter).

    Only identities among the index's nearest stored entities of each scene are candidates (`NEIGHBOURS`), so a
    stored scene past them counts as another scene (unless it names the same kind of place: `SceneKeys.heads`): a
    miss that could have been a hit, never a hit from another scene.
    """
    scenes = {q for q, e in enumerate(entities.entities) if e.role == SCENE}
    if not scenes:
        return None
    return SceneKeys(tuple(sorted({(m.core, m.head) for m in matched.identities if m.q in scenes})),
                     tuple(sorted({eid for q, eid, _ in matched.entities if q in scenes})),
                     SceneKeys.kind_heads(entities.entities), SceneKeys.scene_words(entities.entities))


def entry_scene(manifest: Any, entry_id: int) -> str:
    """The text of an entry's scene ('' when it names none): what a miss refused for another scene names."""
    rows = manifest.query("SELECT e.text FROM postings p JOIN entities e ON e.id = p.entity_id "
                          "WHERE p.entry_id = ? AND p.role = ? ORDER BY e.id LIMIT 1", (entry_id, SCENE))
    return rows[0][0] if rows else ""


def matches_for(manifest: Any, entry_id: int, entities: EmbeddedEntities, matched: Matched) -> list[Match]:
    """What of the request an entry matches: each query entity's best match among the entry's entities."""
    best: dict[int, tuple[float, str, str]] = {}
    for eid, text, kind, head, core, role in manifest.query(
            "SELECT e.id, e.text, e.kind, e.head, e.core, p.role FROM postings p JOIN entities e "
            "ON e.id = p.entity_id WHERE p.entry_id=?", (entry_id,)):
        stored = StoredEntity(text, kind, head, core)
        for q in range(len(entities)):
            sim = matched.admits(q, stored, int(eid), v1=not head)
            if sim is not None and sim > best.get(q, (-2.0, "", ""))[0]:
                best[q] = (sim, text, role)
    return [Match(entities.entities[q].text, text, sim, matched_role(entities.entities[q].role, role))
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
