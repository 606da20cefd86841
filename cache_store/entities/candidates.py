"""Where a prompt's noun phrases are (spaCy's noun chunks and runs of nominal tokens), and where each breaks into
the candidates that become entities (`extract`)."""
from __future__ import annotations

import re
from collections.abc import Iterable
from typing import TYPE_CHECKING

from .lexicon import CONDITION_COMPOUNDS, CONDITION_HEADS, ING_NOUNS, SCENE_HEADS
from .repair import Repairs, is_glue_hyphen

if TYPE_CHECKING:
    from spacy.tokens import Doc, Token

_RUN_POS = frozenset({"DET", "ADJ", "NUM", "NOUN", "PROPN"})
HEAD_POS = frozenset({"NOUN", "PROPN"})
# A `compound` token joins a run unless it is a function word or a verb ("zoom in", "a panda drinking coffee").
NOT_COMPOUND_POS = frozenset({"VERB", "AUX", "ADP", "PART", "PUNCT", "CCONJ", "SCONJ", "PRON", "SYM",
                               "SPACE", "DET", "INTJ"})
_LATIN_OR_DIGIT = re.compile(r"[0-9A-Za-z\u00c0-\u024f]")
MAX_WORD_CHARS = 40


def is_wordlike(tok: "Token") -> bool:
    """A Latin-script word or a number of sane length: the English pipeline cannot analyse other scripts."""
    return (len(tok.text) <= MAX_WORD_CHARS and _LATIN_OR_DIGIT.search(tok.text) is not None
            and not tok.like_url and not tok.like_email)


def is_head(tok: "Token", nominal: Repairs) -> bool:
    return ((tok.pos_ in HEAD_POS or tok.i in nominal) and tok.i not in nominal.verbal and tok.i not in nominal.looks
            and is_wordlike(tok))


def _is_participle(doc: "Doc", i: int, nominal: Repairs) -> bool:
    """An -ing word right after a noun ("a dog drinking water", "Corgi playing"): the sm tagger calls it NN."""
    tok = doc[i]
    word = tok.lower_
    if i == 0 or tok.pos_ == "PROPN" or not word.endswith("ing") or word in ING_NOUNS:
        return False
    if not any(ch in "aeiouy" for ch in word[:-3]):
        return False  # ring, king, thing, string, swing: no verb stem before "ing"
    return is_head(doc[i - 1], nominal)


def _split(doc: "Doc", indices: Iterable[int], nominal: Repairs) -> list[list[int]]:
    """Break a candidate at punctuation (not a glue hyphen), conjunctions, participles after a noun and "mid-"
    states, between a place and the time or weather after it, and around a condition inside a casual run-on."""
    parts: list[list[int]] = [[]]
    indices = list(indices)
    members = set(indices)
    # a run-on without an article: "a framed beach sunset painting" is one picture, "cabin snow fireplace" is not
    run_on = not any(doc[j].pos_ == "DET" for j in indices)
    seen, drop = -1, False  # a "mid-" moment is dropped unless only adjectives precede it in its part: then sm
    for i in indices:  # has misread the noun ("a skateboarder frozen mid-kickflip") and the moment stays its head
        tok = doc[i]
        if i > seen and (end := _mid_state_end(doc, i)) >= 0:
            seen = end
            drop = not (parts[-1] and end in members and all(doc[j].pos_ not in HEAD_POS for j in parts[-1]))
        if ((i <= seen and drop) or (tok.is_punct and not is_glue_hyphen(doc, i)) or tok.pos_ == "CCONJ"
                or i in nominal.verbal or _is_participle(doc, i, nominal)):
            parts.append([])
        elif _time_after_place(doc, i, parts[-1]):
            parts.append([i])
        elif run_on and i + 1 in members and _condition_between_nouns(doc, i, parts[-1]):
            parts.extend(([i], []))
        else:
            parts[-1].append(i)
    return [p for p in parts if p]


# Conditions a casual prompt writes after its place ("beach sunset", "dark ocean fog"); "spring", "hour", "day",
# "breeze" and "wind" also end compounds that name other things ("mountain spring", "rush hour", "field day", "sea
# breeze", "desert wind").
_TIME_AFTER_PLACE = CONDITION_HEADS - {"spring", "hour", "day", "breeze", "wind"}


def _time_after_place(doc: "Doc", i: int, part: list[int]) -> bool:
    """Whether token i is a time, season or weather noun right after a place noun of the same candidate, and the
    candidate's last noun: the place and its condition are two entities ("dog on beach sunset" -> "beach", "sunset";
    not "a beach sunset painting", "a city snow globe")."""
    if not part or part[-1] != i - 1 or doc[i].pos_ not in ("NOUN", "PROPN"):
        return False
    prev, nxt = doc[i - 1], doc[i + 1] if i + 1 < len(doc) else None
    if nxt is not None and nxt.pos_ in ("NOUN", "PROPN"):
        return False
    return doc[i].lemma_.lower() in _TIME_AFTER_PLACE and prev.pos_ in ("NOUN", "PROPN") \
        and prev.lemma_.lower() in SCENE_HEADS


def _mid_state_end(doc: "Doc", i: int) -> int:
    """The last token of the "mid-" moment token i is in ("ballerina mid-spin", "frozen mid-jump", "in midair"), or
    -1: a moment, no thing."""
    if doc[i].lower_ == "midair":
        return i
    start = next((j for j in (i, i - 1, i - 2) if j >= 0 and doc[j].lower_ == "mid"), -1)
    return start + 2 if start >= 0 and start + 2 < len(doc) and is_glue_hyphen(doc, start + 1) else -1


def _condition_between_nouns(doc: "Doc", i: int, part: list[int]) -> bool:
    """Whether token i is a time, season or weather noun between two nouns of a casual run-on (a candidate with no
    article), where it names neither ("cozy cabin snow fireplace", "vintage car rain neon night", "lighthouse storm
    waves"); after an adjective or another condition it stays compounded ("soft morning fog", "bustling night
    market")."""
    if not part or part[-1] != i - 1 or i + 1 >= len(doc) or doc[i].lemma_.lower() not in _TIME_AFTER_PLACE:
        return False
    prev, nxt = doc[i - 1], doc[i + 1]
    return (prev.pos_ in ("NOUN", "PROPN") and prev.lemma_.lower() not in CONDITION_HEADS
            and nxt.pos_ in ("NOUN", "PROPN")
            and f"{doc[i].lemma_.lower()} {nxt.lemma_.lower()}" not in CONDITION_COMPOUNDS)


def chunk_candidates(doc: "Doc", nominal: Repairs) -> list[list[int]]:
    if not doc.has_annotation("DEP"):
        return []
    out: list[list[int]] = []
    for chunk in doc.noun_chunks:
        dropped: set[int] = set()
        for tok in chunk:
            if tok.dep_ == "poss":
                dropped.update(t.i for t in tok.subtree)
        out.extend(_split(doc, (t.i for t in chunk if t.i not in dropped), nominal))
    return out


def _in_run(tok: "Token", nominal: Repairs) -> bool:
    if tok.i in nominal.verbal:
        return False
    if tok.pos_ in _RUN_POS or tok.i in nominal:
        return True
    return tok.dep_ == "compound" and tok.pos_ not in NOT_COMPOUND_POS


def run_candidates(doc: "Doc", nominal: Repairs) -> list[list[int]]:
    out: list[list[int]] = []
    current: list[int] = []
    for tok in doc:
        if _in_run(tok, nominal) or (current and is_glue_hyphen(doc, tok.i)):
            current.append(tok.i)
        else:
            if current:
                out.append(current)
            current = []
    if current:
        out.append(current)
    return [part for run in out for part in _split(doc, run, nominal)]
