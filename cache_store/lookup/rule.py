"""The hit rule: which entity matches make an earlier generation worth borrowing from (the one place it lives).

`HitRule` holds the Python predicates the benches measure (`carries`, `same_thing`, `scenes_agree`) side by side
with the SQL the stores run (`roles_sql`, `scenes_sql`, `identity_sql`, used by `ranking.rank`); tests/test_hit_rule.py
checks that both agree. `ChaiCache` builds one rule per lookup and passes it to `store.lookup`.

A match pairs an entity of the request with an entity of a cached entry at cosine similarity >= the threshold.
The rule proposes donors; its `decision` (a model fitted to labelled pairs, `lookup.decision`) then accepts or
refuses each proposed donor from everything the two prompts' entities share (`ranking.decide`).
It can carry a hit only when both entities are the main subject or the scene of their prompts (`roles`): a donor
that shares only a prop, a background object or a generic bystander would lead Cache Attention to a different
video, not a cheaper road to the same one. Those matches are still reported, as secondary. When both prompts
name a scene, the scenes must match too (`scenes_must_agree`): the same main subject in another place is a miss.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from functools import lru_cache
from typing import Any

from ..entities.lexicon import (COVER_WORDS, cover_forms, covers_named, kinds_differ, places_of_a_kind,
                                same_kind_of_place, scene_words_name)
from ..entities.names import shares_a_name
from ..entities.roles import BORROWABLE, GENERIC_PEOPLE, MAIN, ROLES, SCENE
from ..naming import encodable_text
from .decision import DecisionModel, default_decision


@dataclass(frozen=True)
class HitRule:
    """Similarity threshold, the roles that may carry a hit (on both sides of a match), the identity threshold
    for compounds and the scene policy: one object, built by ChaiCache and passed to `store.lookup`."""

    threshold: float
    roles: frozenset[str] = BORROWABLE
    # Same head, a noun compounded on one side only ("sea lion" / "lion", "humpback whale" / "whale"): 0.70, chosen
    # held out once likenesses ("teddy bear") were refused by their words (issue 25; it was 0.85 by hand before).
    identity_threshold: float = 0.70
    # A donor showing another scene than the request's is refused: in the quality lab such donors (the same main
    # subject elsewhere) leaked their scene's colours into the hit at every step count (docs/quality-lab.md).
    scenes_must_agree: bool = True
    # The learned decision over the donors this rule proposes (lookup/decision.py); None = the rule alone.
    decision: DecisionModel | None = field(default_factory=default_decision, compare=False, hash=False)

    def __post_init__(self) -> None:
        if not 0.0 < float(self.threshold) <= 1.0:
            raise ValueError(f"the similarity threshold must lie in (0, 1], got {self.threshold!r}")
        unknown = set(self.roles) - set(ROLES)
        if unknown or not self.roles:
            raise ValueError(f"HitRule.roles must be a non-empty subset of {ROLES}, got {sorted(self.roles)}")

    def carries(self, query_role: str, stored_role: str, similarity: float) -> bool:
        """True when a match of these roles at this similarity may make a hit."""
        return similarity >= self.threshold and query_role in self.roles and stored_role in self.roles

    def same_thing(self, query: Any, stored: Any, similarity: float) -> bool:
        """Whether two entities (text, head, core, kind) name the same kind of thing, not just similar words.

        A word that is one side's head and only a modifier on the other names another thing ("sausage dog" /
        "sausage", "fire truck" / "fire"); the same head with a noun compounded onto one side only needs a
        higher similarity between objects ("humpback whale" / "whale") and is never a likeness of the other
        ("teddy bear" / "bear", "toy car" / "car": `lexicon.DEPICTION_WORDS`) nor a kind whose name is no kind of
        its noun ("red panda" / "panda", "sea lion" / "lion": `lexicon.NAMED_KINDS`; `kinds_differ`); places keep
        their compounds ("city street" / "street"). Compounds written as one word count the same way
        (`closed_compound`: "dragonfly" / "dragon" and "batter" / "bat" are other things, "seahorse" / "horse" needs
        the higher similarity, "hot-dog" / "dog" is another kind), and so do two objects with other heads
        ("motorcycle" / "bicycle" 0.68, "cat" / "dog" 0.66: under it).
        """
        if query.text == stored.text and query.head == stored.head:
            return True  # the same words name the same thing, whichever parse wrote the stored identity
        if shares_a_name(query, stored.identity):
            return True  # one named character, product or vehicle ("the Aurelia" / "Aurelia GT")
        closed = closed_compound(query.head, stored.head)
        if "object" in (query.kind, stored.kind) and query.head != stored.head:
            if query.head in _modifiers(stored) or stored.head in _modifiers(query) or closed == MODIFIER:
                return False
            if closed == COMPOUND and kinds_differ(query.identity, stored.identity):
                return False  # "hot-dog" / "dog"
        if query.head == stored.head and query.kind == stored.kind == "object" and query.head not in GENERIC_PEOPLE:
            if query.identity != stored.identity:
                return not kinds_differ(query.identity, stored.identity) and similarity >= self.identity_threshold
        if query.head != stored.head and query.kind == stored.kind == "object":
            # Two objects named by other nouns ("seahorse" / "horse", "motorcycle" / "bicycle", "cat" / "dog") are
            # one kind of thing only as close as a compound must be.
            return similarity >= self.identity_threshold
        return True

    def identity_filter(self, query: Any, core: str, head: str, similarity: float) -> IdentityFilter | None:
        """`same_thing` for every stored entity of one identity (`core`, `head`) at once: None when it refuses them
        all, else the part that still depends on each one's kind and words (the ranking runs it as `identity_sql`)."""
        if shares_a_name(query, core or head):
            return IdentityFilter()
        if query.head != head:
            applies_to_all = query.kind == "object"  # else only stored objects are tested
            closed = closed_compound(query.head, head)
            if head in _modifiers(query) or closed == MODIFIER or (closed == COMPOUND
                                                                   and kinds_differ(query.identity, core or head)):
                return None if applies_to_all else IdentityFilter(drop_object=True)
            distant = applies_to_all and similarity < self.identity_threshold
            return IdentityFilter(drop_object=distant, ban=query.head, ban_any=applies_to_all)
        if query.kind == "object" and head not in GENERIC_PEOPLE and query.identity != (core or head):
            if similarity < self.identity_threshold or kinds_differ(query.identity, core or head):
                return IdentityFilter(drop_object=True, keep=query.text)
        return IdentityFilter()

    @staticmethod
    def identity_sql(match: str, entity: str, instr: str) -> str:
        """The SQL twin of `IdentityFilter.admits`: `match` names a row with columns drop_object, ban, ban_any and
        keep, `entity` a row of entities, `instr` the backend's substring position function (0 = absent)."""
        return (f"({match}.keep <> '' AND {entity}.text = {match}.keep OR "
                f"NOT ({match}.drop_object = 1 AND {entity}.kind = 'object') AND ({match}.ban = '' OR "
                f"({match}.ban_any = 0 AND {entity}.kind <> 'object') OR "
                f"{instr}(' ' || {entity}.text || ' ', ' ' || {match}.ban || ' ') = 0))")

    def scenes_agree(self, request: Sequence[Any], donor: Sequence[Any], sim: Callable[[Any, Any], float]) -> bool:
        """Whether two prompts' entities leave no scene disagreement: either names no scene, or some pair of their
        scenes reaches the threshold, names one kind of place (`lexicon.same_kind_of_place`) or is covered by what
        the other is (`lexicon.scene_words_name`: "snowy forest" / "snow"). The lookup applies the same tests to
        the index's neighbours, to the stored scenes' heads and to their words (`SceneKeys`)."""
        here = [e for e in request if e.role == SCENE]
        there = [e for e in donor if e.role == SCENE]
        return (not self.scenes_must_agree or not here or not there
                or any(same_kind_of_place(q.head, d.head) or scene_words_name(q.text, q.head, d.head)
                       or scene_words_name(d.text, d.head, q.head) or sim(q, d) >= self.threshold
                       for q in here for d in there))

    def scenes_sql(self, scenes: SceneKeys | None, instr: str = "instr") -> tuple[str, list[Any]]:
        """The SQL twin of `scenes_agree`, for the ranking's `best` rows: a WHERE clause (and its parameters)
        keeping entries that name no scene or one of `scenes`, the stored scenes the request's scenes match
        (`instr`: the backend's substring position function).
        `scenes` None (the request names no scene, or the rule lets scenes differ): no clause."""
        if scenes is None or not self.scenes_must_agree:
            return "", []
        clause = "WHERE (NOT EXISTS (SELECT 1 FROM postings sp WHERE sp.entry_id = best.entry_id AND sp.role = ?)"
        if not scenes:
            return clause + ") ", [SCENE]
        terms = ["(se.core = ? AND se.head = ?)"] * len(scenes.identities)
        if scenes.ids:
            terms.append(f"se.id IN ({','.join('?' * len(scenes.ids))})")
        if scenes.words:
            # a word saying a stored scene is covered by a request scene's head ("snow" / "snowy forest"), not its head
            terms.extend([f"({instr}(' ' || se.text || ' ', ?) > 0 AND se.head <> ? "
                          "AND NOT (se.head = '' AND (se.text = ? OR se.text LIKE ?)))"] * len(scenes.words))
        v1_heads: list[str] = []
        if scenes.heads:
            terms.append(f"se.head IN ({','.join('?' * len(scenes.heads))})")
            # a row of format v1 names no head: its text's last word is one (lexicon heads hold no LIKE wildcard)
            terms.append(f"(se.head = '' AND ({' OR '.join(['se.text = ? OR se.text LIKE ?'] * len(scenes.heads))}))")
            v1_heads = [x for h in scenes.heads for x in (h, f"% {h}")]
        return (clause + " OR EXISTS (SELECT 1 FROM postings sp JOIN entities se ON se.id = sp.entity_id "
                f"WHERE sp.entry_id = best.entry_id AND sp.role = ? AND ({' OR '.join(terms)}))) ",
                [SCENE, SCENE, *(x for pair in scenes.identities for x in pair), *scenes.ids,
                 *(x for w in scenes.words for x in (f" {w} ", w, w, f"% {w}")), *scenes.heads, *v1_heads])

    def roles_sql(self, column: str) -> tuple[str, list[Any]]:
        """The SQL twin of `carries`' role test: `column` holds one of the rule's roles."""
        return f"{column} IN ({','.join('?' * len(self.roles))})", sorted(self.roles)

    def any_role(self) -> "HitRule":
        """The same rule with every role allowed (to tell a miss by role from a miss by model or shape)."""
        return replace(self, roles=frozenset(ROLES))

    def accepts(self, query: Any, stored: Any, similarity: float) -> bool:
        """`carries` by role and similarity, and `same_thing`."""
        return self.carries(query.role, stored.role, similarity) and self.same_thing(query, stored, similarity)


@dataclass(frozen=True)
class SceneKeys:
    """The stored scenes a request's scenes match: identities (`core`, `head`), entity ids of rows of format v1, and
    the heads of the places of the request's scenes' kinds (`lexicon.places_of_a_kind`)."""

    identities: tuple[tuple[str, str], ...] = ()
    ids: tuple[int, ...] = ()
    heads: tuple[str, ...] = ()
    words: tuple[str, ...] = ()  # a stored scene naming one of these among its other words agrees

    def __bool__(self) -> bool:
        return bool(self.identities or self.ids or self.heads or self.words)

    @staticmethod
    def kind_heads(request: Sequence[Any]) -> tuple[str, ...]:
        """The scene heads that agree with the request's scenes by their kind of place or by the request scenes'
        words saying they are covered ("snow" for "snowy forest": `lexicon.covers_named`)."""
        scenes = [e for e in request if e.role == SCENE]
        return tuple(sorted({h for e in scenes for h in places_of_a_kind(e.head)}
                            | {c for e in scenes for c in covers_named(e.text, e.head)}))

    @staticmethod
    def scene_words(request: Sequence[Any]) -> tuple[str, ...]:
        """The words saying a place is covered by a request scene's head, where that head is a cover ("snowy",
        "snow-covered" for "snow": `lexicon.cover_forms`); a stored scene holding one besides its head agrees. Their
        letters and hyphens hold no LIKE wildcard."""
        return tuple(sorted({f for e in request if e.role == SCENE and e.head in COVER_WORDS
                             for f in cover_forms(e.head)}))

    def admits(self, core: str, head: str, entity_id: int, text: str) -> bool:
        """Whether a stored scene row is one the request's scenes match (`HitRule.scenes_sql` in Python)."""
        if (core, head) in self.identities or entity_id in self.ids:
            return True
        head = stored_head(head, text)
        return head in self.heads or any(w in self.words for w in text.split() if w != head)


@dataclass(frozen=True)
class IdentityFilter:
    """What of `HitRule.same_thing` depends on the stored entity once its identity is known: stored objects
    refused outright (`drop_object`), and a word (`ban`) whose presence refuses a stored entity (an object, or any
    kind when `ban_any`). A word is found between single spaces, as the extractor writes texts."""

    drop_object: bool = False
    ban: str = ""
    ban_any: bool = False
    keep: str = ""  # the request entity's text: a stored entity of the same words passes whatever else

    def admits(self, kind: str, text: str) -> bool:
        """Whether a stored entity of this kind and text passes (`HitRule.identity_sql` in Python)."""
        if self.keep and text == self.keep:
            return True
        if self.drop_object and kind == "object":
            return False
        return not self.ban or (not self.ban_any and kind != "object") or f" {self.ban} " not in f" {text} "

    def row(self) -> tuple[int, str, int, str]:
        """The filter as the ranking's SQL reads it: (drop_object, ban, ban_any, keep)."""
        # A word that is in no stored text (stores write NUL and lone surrogates as U+FFFD, and PostgreSQL refuses
        # them as parameters) bans nothing and keeps nothing.
        keep = self.keep if encodable_text(self.keep) == self.keep else ""
        if encodable_text(self.ban) != self.ban:
            return int(self.drop_object), "", 0, keep
        return int(self.drop_object), self.ban, int(self.ban_any), keep


MODIFIER, COMPOUND = "modifier", "compound"
MIN_COMPOUND_PART = 3


@lru_cache(maxsize=65536)  # the decision tests every pair of two prompts' entities; heads recur
def closed_compound(a: str, b: str) -> str:
    """How two one-word heads relate when one is written into the other: MODIFIER when the shorter begins the
    longer ("dragon" / "dragonfly", "bat" / "batter", "cat" / "caterpillar": the shorter names another thing),
    COMPOUND when it ends it ("horse" / "seahorse", "fish" / "starfish": a kind that may or may not be one), ''
    otherwise. Each part has at least `MIN_COMPOUND_PART` letters ("bee" / "beer" is no compound)."""
    short, long_ = (a, b) if len(a) < len(b) else (b, a)
    if len(short) < MIN_COMPOUND_PART or len(long_) - len(short) < MIN_COMPOUND_PART or " " in long_:
        return ""
    if long_.startswith(short):
        return MODIFIER
    if long_.endswith(short):
        return COMPOUND
    return ""


def _modifiers(entity: Any) -> frozenset[str]:
    """The words of an entity other than its head ("sausage" in "sausage dog", "guitar" in "man playing guitar")."""
    return _words_besides(entity.text, entity.head)


@lru_cache(maxsize=65536)
def _words_besides(text: str, head: str) -> frozenset[str]:
    return frozenset(w for w in text.split() if w != head)


def stored_head(head: str, text: str) -> str:
    """A stored entity's head: a row of format v1 names none, and its text's last word is one."""
    return head or text.rsplit(" ", 1)[-1]


def matched_role(query_role: str, stored_role: str) -> str:
    """How a hit-carrying match is reported: 'main subject' or 'scene' (the request's side decides)."""
    return {MAIN: "main subject", SCENE: "scene"}.get(query_role, query_role)


__all__ = ["COMPOUND", "HitRule", "IdentityFilter", "MODIFIER", "SceneKeys", "closed_compound", "kinds_differ",
           "matched_role", "stored_head"]
