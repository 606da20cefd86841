"""Entity extraction: the objects and scenes of a prompt as short normalised noun phrases.

How a prompt becomes entities (all of it linear in the prompt length):

1. Only the first `MAX_PROMPT_CHARS` characters are parsed (cut at a word boundary). Video models read at
   most a few hundred tokens of a prompt anyway; the cap keeps a pasted 10k-word text from costing seconds.
   Tag lists are normalised (`tags`), template phrases masked, casual spellings written out ("thru", "nite";
   `casual`) and misspelt nouns repaired (`wordclass`) before parsing.
2. Candidate spans are spaCy's noun chunks plus part-of-speech runs: maximal runs of DET/ADJ/NUM/NOUN/PROPN
   tokens (and `compound` modifiers, and a hyphen glued between two run tokens) that end in a noun. The runs
   recover caption-style subjects the parser leaves out ("A red sports car drifting ..." where `car` is
   attached as `dep`, or "a stop sign" chunked as "a stop"). Some nouns the taggers mislabel are repaired
   first: a word with a determiner attached ("a stop sign" with `sign` tagged VB by md), a non-stop-word
   ADJ/ADV in a nominal dependency (subject, object, apposition: "on treadmill" tagged JJ), an ADV right
   after a determiner-led run ("A golden retriever" with `retriever` tagged RB by sm), and the only word
   of a one-word prompt ("campsite" tagged VB). An -ing word right after a noun is a participle, not part
   of the noun ("a dog drinking water", tagged NN by sm), unless it is a known -ing noun ("oil painting").
3. Each span is split at punctuation and conjunctions ("an oven and scissors"), and between a place and a time
   or weather noun that ends it ("beach sunset" -> "beach", "sunset"), and cleaned: determiners,
   numbers, quantity words ("two", "several", "a few"), adverbs, possessors ("Van Gogh's selfie" ->
   "selfie"; the possessor is its own run), emoji, URLs and words outside the Latin script (the English
   pipeline cannot analyse them) are dropped, and the span is trimmed to end at its head noun. The head
   noun is lemmatised (plural -> singular, except plural-only nouns such as "clothes"), modifiers are kept
   as written ("sports car" stays), everything is lower-cased, hyphenated words stay one word.
4. A candidate whose tokens lie inside a longer candidate's range is the same mention and is dropped
   ("sunny beach" from the chunk absorbs "beach"); a quantity noun followed by "of" ("a group of people",
   "a bunch of grapes") is dropped in favour of what follows. Equal texts are merged (first position kept,
   "scene" wins over the other kinds). Different mentions of related things ("dog" and "small dog" in two
   places of the prompt) both stay.
5. Stop entities (see `StopEntities` and data/stop_entities.txt) are removed; a `strip:` head gives way to
   the noun before it first, past looks and colours ("desert scene" -> "desert", "windowsill sunny cozy" ->
   "windowsill").

Kinds: "scene" for places and settings (a head-noun lexicon, plus a few nouns such as "water" or "snow" and
proper names that count as a setting only as the object of a locative preposition: "in the water", "in
Paris"); "other" for times of day, seasons, weather and light ("sunset", "night", "fog"); "object" otherwise.
"""
from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from ..naming import encodable_text
from .candidates import HEAD_POS, NOT_COMPOUND_POS, chunk_candidates, is_head, is_wordlike, run_candidates
from .casual import casual_spelling
from .language import foreign_language
from .lexicon import (COLOUR_THINGS, COLOUR_WORDS, CONDITION_HEADS, DEPICTION_WORDS, ING_NOUNS, LEMMA_EXCEPTIONS,
                      LANDMARK_HEADS, LOCATIVE_PREPOSITIONS, LOCATIVE_SCENE_HEADS, PLACE_NAME_PREPOSITIONS,
                      QUANTITY_HEADS, QUANTITY_WORDS, SCENE_HEADS, SCENE_PHRASES, a_decade, kinds_differ, named_kinds)
from .names import name_words
from .roles import GENERIC_PEOPLE, MAIN, ROLES, SCENE, SECONDARY, activity, roles_for
from .spacy_pipeline import resolve_pipeline
from .repair import HYPHENS, Repairs, has_alnum, is_glue_hyphen, repairs
from .stop_entities import StopEntities
from .tags import normalise_tags, tag_words
from .wordclass import WordClasses, word_classes

if TYPE_CHECKING:
    from spacy.tokens import Doc, Token

KINDS = ("object", "scene", "other")
# Words the typo repair never touches: the pack's own lexicons and tag words.
_PROTECTED = frozenset(SCENE_HEADS | LOCATIVE_SCENE_HEADS | CONDITION_HEADS | ING_NOUNS | COLOUR_WORDS
                       | frozenset(LEMMA_EXCEPTIONS) | frozenset(w for t in tag_words() for w in t.split()))
MAX_PROMPT_CHARS = 4000
PIPE_BATCH_SIZE = 64

_MODIFIER_POS = frozenset({"ADJ", "NOUN", "PROPN", "VERB"})
_SPACES = re.compile(r"\s+")
_PLACE_HEADS = SCENE_HEADS | LANDMARK_HEADS


@dataclass(frozen=True)
class Entity:
    """One normalised entity of a prompt: phrase, kind, head noun lemma and role ("main", "scene", "secondary")."""

    text: str
    kind: str
    head: str
    role: str = MAIN  # the extractor always sets it; a hand-made entity may carry a hit
    core: str = ""  # what the thing is: the head with the nouns compounded onto it ("sea lion"); '' = the head
    names: tuple[str, ...] = field(default=(), compare=False)  # its words written as names (`names.name_words`)

    @property
    def identity(self) -> str:
        """What the thing is, the text its vector is made of: its core, else its head."""
        return self.core or self.head

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"Entity.kind must be one of {KINDS}, got {self.kind!r}")
        if self.role not in ROLES:
            raise ValueError(f"Entity.role must be one of {ROLES}, got {self.role!r}")
        if not self.text.strip() or not self.head.strip():
            raise ValueError("Entity.text and Entity.head must be non-empty")


def truncate_prompt(prompt: str, max_chars: int = MAX_PROMPT_CHARS) -> str:
    """Strip the prompt and keep at most `max_chars` characters, cut at the last word boundary."""
    text = prompt.strip()
    if len(text) <= max_chars:
        return text
    cut = text[:max_chars]
    if not text[max_chars].isspace():
        boundary = cut.rfind(" ")
        if boundary > max_chars // 2:
            cut = cut[:boundary]
    return cut.rstrip()


class EntityExtractor:
    """Extract normalised, stop-filtered entities from prompts with a spaCy pipeline (loaded once)."""

    def __init__(self, pipeline: str | None = None, stop_entities: StopEntities | None = None) -> None:
        self.pipeline_name, self._nlp = resolve_pipeline(pipeline)
        self.stop_entities = StopEntities.default() if stop_entities is None else stop_entities
        self.words = word_classes(self._nlp, _PROTECTED)

    def extract(self, prompt: str) -> list[Entity]:
        """The prompt's entities in order of first mention; [] when it has none or is not in English."""
        text = self._prepare(prompt)
        if not text:
            return []
        return self.entities_from_doc(self._nlp(text))

    def extract_many(self, prompts: Sequence[str]) -> list[list[Entity]]:
        """`extract` for many prompts, parsed in batches."""
        texts = [self._prepare(p) for p in prompts]
        docs = self._nlp.pipe(texts, batch_size=PIPE_BATCH_SIZE)
        return [self.entities_from_doc(doc) if text else [] for text, doc in zip(texts, docs)]

    def entities_from_doc(self, doc: "Doc", apply_stop_list: bool = True) -> list[Entity]:
        """Entities of an already parsed document with their roles (optionally without the stop list)."""
        return [e for e, _ in self.entities_with_heads(doc, apply_stop_list)]

    def entities_with_heads(self, doc: "Doc", apply_stop_list: bool = True) -> list[tuple[Entity, int]]:
        """`entities_from_doc`, each entity with the index of its head token in `doc`."""
        found = _entities(doc, self.stop_entities.strip_heads, self.words)
        if apply_stop_list:
            found = [(e, i) for e, i in found if not self.stop_entities.is_stop(e.text, e.head)]
        roles = roles_for(doc, [i for _, i in found], [e.kind for e, _ in found])
        heads = {e.text: i for e, i in found}  # texts are unique; merging keeps the longer text of a pair
        return [(e, heads[e.text]) for e in merge_variants([replace(e, role=r) for (e, _), r in zip(found, roles)])]

    def _prepare(self, prompt: str) -> str:
        """The text to parse: truncated, template phrases masked; '' for a prompt in another language."""
        if not isinstance(prompt, str):
            raise TypeError(f"prompt must be a str, got {type(prompt).__name__}")
        text = truncate_prompt(encodable_text(prompt))
        if foreign_language(text) is not None:
            return ""
        return self.words.correct_text(casual_spelling(self.stop_entities.mask_templates(normalise_tags(text))))


# ---------------------------------------------------------------------------------------------------------
# Extraction from a parsed Doc


_ROLE_RANK = {MAIN: 0, SCENE: 1, SECONDARY: 2}


def merge_variants(entities: list[Entity]) -> list[Entity]:
    """One entity per thing: a bare phrase whose modified form is also in the prompt ("tiger" beside "beige tiger")
    is folded into the longer one, which keeps the stronger role; not into another kind ("a dog ... a hot dog")."""
    out = list(entities)
    for short in entities:
        longer = [e for e in out if e is not short and e.head == short.head and e.text.endswith(" " + short.text)
                  and not kinds_differ(e.identity, short.identity)]
        if short in out and longer:
            target = longer[0]
            out.remove(short)
            if _ROLE_RANK[short.role] < _ROLE_RANK[target.role]:
                out[out.index(target)] = replace(target, role=short.role)
    return out


def _entities(doc: "Doc", strip_heads: frozenset[str] = frozenset(),
              words: WordClasses = WordClasses()) -> list[tuple[Entity, int]]:
    """(entity, head token index) pairs in order of first mention, one per distinct text."""
    nominal = repairs(doc, words)
    raw = chunk_candidates(doc, nominal) + run_candidates(doc, nominal)
    cleaned = [_clean(doc, indices, nominal) for indices in raw]
    merged: dict[str, tuple[Entity, int]] = {}
    for indices in _outermost(cleaned):
        made = _make_entity(doc, indices, nominal, strip_heads, words)
        if made is None:
            continue
        entity = made[0]
        if _adjective_alone(entity.text, words):
            continue  # "A breathtaking aerial shot sweeps ...": the tagger's noun is a look, never an entity alone
        seen = merged.get(entity.text)
        if seen is None or (entity.kind == "scene" and seen[0].kind != "scene"):
            merged[entity.text] = made
    # Order of first mention: dict insertion order follows the candidates' sorted starts.
    return list(merged.values())


def _adjective_alone(text: str, words: WordClasses) -> bool:
    """A one-word entity the tables know only as an adjective ("breathtaking", "medieval"), outside our lexicons."""
    return (" " not in text and "-" not in text and words.is_adjective(text) and text not in words.nouns
            and text not in words.protected)


def _clean(doc: "Doc", indices: Iterable[int], nominal: Repairs) -> list[int]:
    """Keep content tokens and tight hyphens, then trim so the span ends at a noun."""
    kept: list[int] = []
    for i in indices:
        tok = doc[i]
        if is_glue_hyphen(doc, i):
            kept.append(i)
            continue
        if not is_wordlike(tok) or tok.like_num or tok.lower_ in QUANTITY_WORDS or a_decade(tok.lower_):
            continue
        if tok.pos_ in _MODIFIER_POS or tok.i in nominal or (tok.dep_ == "compound"
                                                             and tok.pos_ not in NOT_COMPOUND_POS):
            kept.append(i)
    # A hyphen must glue two kept neighbours; drop it otherwise ("two-" after "two" was removed).
    kept_set = set(kept)
    kept = [i for i in kept if doc[i].text not in HYPHENS or (i - 1 in kept_set and i + 1 in kept_set)]
    while kept and not is_head(doc[kept[-1]], nominal):
        kept.pop()
    while kept and doc[kept[0]].text in HYPHENS:
        kept.pop(0)
    return kept


def _plural_as_written(doc: "Doc", indices: tuple[int, ...], words: WordClasses) -> bool:
    """Whether a head the tagger called a proper noun is a common plural: written in lower case, alone or after
    nouns or adjectives the tables know ("tacos", "wooden cabins", "test tubes"). A name stays as written ("los
    angeles", "Waffles"), and so does a title-cased phrase, a kind's name as often as a band's ("Red Pandas",
    "Black Keys")."""
    modifiers = [doc[i].lower_ for i in indices[:-1] if doc[i].is_alpha]
    return doc[indices[-1]].text.islower() and all(w in words.nouns or w in words.adjectives for w in modifiers)


def _outermost(candidates: list[list[int]]) -> list[tuple[int, ...]]:
    """Cleaned candidates whose token range is not inside another candidate's range (sort and sweep)."""
    ranges: list[tuple[int, int, tuple[int, ...]]] = []
    for indices in candidates:
        if indices:
            ranges.append((indices[0], indices[-1] + 1, tuple(indices)))
    ranges.sort(key=lambda r: (r[0], -r[1]))
    out: list[tuple[int, ...]] = []
    max_end = -1
    for _start, end, span in ranges:
        if end <= max_end:
            continue  # inside an earlier, wider (or equal) candidate
        max_end = end
        out.append(span)
    return out


def _make_entity(doc: "Doc", indices: tuple[int, ...], nominal: Repairs, strip_heads: frozenset[str],
                 words: WordClasses = WordClasses()) -> tuple[Entity, int] | None:
    # "desert scene" -> "desert": a template head gives way to the noun that modifies it, past the looks and
    # colours a casual prompt puts between them ("windowsill sunny cozy" -> "windowsill", "neon colors" -> nothing).
    while len(indices) > 1 and _lemma(doc[indices[-1]]) in strip_heads:
        k = len(indices) - 2
        while k > 0 and _a_look_between(doc[indices[k]], words):
            k -= 1
        thing = doc[indices[k]]
        if not (is_head(thing, nominal) or (thing.lower_ in words.nouns and not words.is_adjective(thing.lower_))):
            break  # "the jungle bright colors": sm calls "jungle" ADJ; the tables know it only as a noun
        indices = indices[:k + 1]
    head_tok = doc[indices[-1]]
    nxt = doc[head_tok.i + 1] if head_tok.i + 1 < len(doc) else None
    head_lemma = _lemma(head_tok)
    if head_tok.tag_ == "VBZ" and head_tok.lemma_.isalpha():  # a plural the tagger read as a verb ("chestnuts")
        head_lemma = head_tok.lemma_.lower()
    elif (head_tok.tag_ in ("NNP", "NNPS") and head_tok.lower_ not in LEMMA_EXCEPTIONS
          and _plural_as_written(doc, indices, words)):
        head_lemma = words.singular(head_lemma)  # "wooden cabins": the lemmatiser leaves names alone
    if head_lemma in QUANTITY_HEADS and nxt is not None and nxt.lower_ == "of":
        return None
    parts: list[str] = []
    for pos, i in enumerate(indices):
        word = head_lemma if i == head_tok.i else doc[i].lower_
        parts.append(word.rstrip(".") or word)  # "4K." at a sentence's end is one token
        if pos + 1 < len(indices):
            glued = indices[pos + 1] == i + 1 and not doc[i].whitespace_
            parts.append("" if glued else " ")
    text = _SPACES.sub(" ", "".join(parts)).strip()
    if not text:
        return None
    head = text.rsplit(" ", 1)[-1]  # a hyphenated head ("close-up") is the whole glued word
    if text in COLOUR_WORDS and not (text in COLOUR_THINGS and any(c.dep_ == "det" for c in head_tok.children)):
        return None  # "black" and "grey" in "a black and grey cat", "a red" cut short, are looks; "an orange" is a thing
    kind = _kind(text, head, doc, indices, head_tok)
    core = _core(doc, indices, head)
    if head in GENERIC_PEOPLE and not _names_a_role(doc, indices[:-1], words):
        doing = activity(doc, head_tok.i, _lemma, nominal)
        text = f"{text} {doing}" if doing else text
        core = text
    names = name_words((doc[i] for i in indices), words)
    return Entity(text=text, kind=kind, head=head, core=core if core != head else "", names=names), head_tok.i


_LOOK_NOUNS = COLOUR_WORDS | {"neon", "pastel"}


def _a_look_between(tok: "Token", words: WordClasses) -> bool:
    """An adjective or a colour between a thing and a mood or template word that gives way to it (a time is a head:
    "a rainy night scene" is the rainy night)."""
    word = tok.lower_
    return word in _LOOK_NOUNS or tok.lemma_.lower() in _LOOK_NOUNS or (word not in words.nouns and (
        tok.pos_ == "ADJ" or words.is_adjective(word)))  # "the jungle bright colors": sm calls "jungle" ADJ


def _names_a_role(doc: "Doc", modifiers: tuple[int, ...], words: WordClasses) -> bool:
    """Whether a noun before a generic person says what the person is ("skater girl", "courier girl", "business
    man"): such a person is no longer generic. Adjectives ("old man", "little girl", "blonde woman") are not."""
    for i in modifiers:
        tok = doc[i]
        word = tok.lower_
        if not tok.is_alpha or word in COLOUR_WORDS:
            continue
        if words and word in words.nouns:
            if not words.is_adjective(word):
                return True
        elif tok.pos_ in ("NOUN", "PROPN") and tok.dep_ == "compound":
            return True
    return False


def _core(doc: "Doc", indices: tuple[int, ...], head: str) -> str:
    """The head and the nouns written right before it ("sports car" in "red sports car"): adjectives describe
    how a thing looks, a noun compounded onto the head can make it another thing ("sea lion", "teddy bear"), and
    so does a depiction word whatever its tag ("robotic dog", "teddy bear": `lexicon.DEPICTION_WORDS`) and a
    kind's name ending at the head or at the noun before it ("red panda", "red panda cub": `lexicon.NAMED_KINDS`).
    A coined brand before a common noun stops it (`_a_brand`: "AeroFlux X1 sneakers" is a "sneaker"), except before a
    place or a landmark (`lexicon.LANDMARK_HEADS`). A noun sm made its head's subject counts ("ramen shop")."""
    words, rest = _named_kind_end(doc, indices, head)
    common_head = doc[indices[-1]].text.islower() and head not in _PLACE_HEADS
    for i in reversed(rest):
        tok = doc[i]
        if tok.lower_ in DEPICTION_WORDS:
            words.insert(0, tok.lower_)
            continue
        compound = tok.dep_ in ("compound", "nmod", "amod") or (tok.dep_ == "nsubj" and tok.head.i == indices[-1])
        if tok.pos_ not in HEAD_POS or not compound or tok.lower_ in COLOUR_WORDS or (common_head and _a_brand(tok)):
            break
        words.insert(0, tok.lower_.rstrip(".") or tok.lower_)  # "Dr. Osei": as the text writes it
    return " ".join(words)


def _a_brand(tok: "Token") -> bool:
    """A coined name, with a capital inside it or a digit ("AeroFlux X1 sneakers", "an iPhone case"): before a
    common noun it says whose thing it is, not what kind, so `_core` leaves it out. A name capitalised only as names
    are is not one ("Komodo dragon", "Christmas tree", "Nike shoes": capitals alone do not tell a brand from a
    kind's name)."""
    text = tok.text
    camel = any(ch.isupper() for ch in text[1:]) and any(ch.islower() for ch in text)
    return camel or any(ch.isdigit() for ch in text)


def _named_kind_end(doc: "Doc", indices: tuple[int, ...], head: str) -> tuple[list[str], tuple[int, ...]]:
    """The core's last words and the modifiers left before them: a kind's name written right before the head or
    ending at it, whatever its words' tags and with hyphens or not ("ice cream cone", "ice-cream cone stand",
    "red pandas"), else the head alone."""
    modifiers = [i for i in indices[:-1] if doc[i].is_alpha]
    words = [doc[i].lower_ for i in modifiers] + [head]
    for name, last in named_kinds(words).items():
        if last < len(words) - 2:
            continue  # a name further from the head names a part of the thing, not the thing
        first = last - len(name.split()) + 1
        between = range(modifiers[first], indices[-1])
        if any(i not in modifiers and doc[i].text != "-" for i in between):
            continue  # the words are not written together ("a hot 3d dog")
        return words[first:], tuple(i for i in indices[:-1] if i < modifiers[first])
    return [head], indices[:-1]


def _lemma(tok: "Token") -> str:
    if tok.lower_ in LEMMA_EXCEPTIONS:
        return LEMMA_EXCEPTIONS[tok.lower_]
    lemma = tok.lemma_.lower().strip() if tok.pos_ == "NOUN" else ""
    if not lemma or " " in lemma or not has_alnum(lemma):
        lemma = tok.lower_
    return lemma


def _kind(text: str, head: str, doc: "Doc", indices: tuple[int, ...], head_tok: "Token") -> str:
    if head in SCENE_HEADS or _is_scene_phrase(text, head) or text == "underwater":
        return "scene"  # a tag list names the setting "underwater" by its adverb; "a manta ray underwater" is the ray
    prep = head_tok.head.lower_ if head_tok.dep_ == "pobj" else ""
    if prep in LOCATIVE_PREPOSITIONS and head in LOCATIVE_SCENE_HEADS:
        return "scene"
    if prep in PLACE_NAME_PREPOSITIONS and all(doc[i].pos_ == "PROPN" for i in indices if doc[i].is_alpha):
        return "scene"  # "in Paris", "across Tokyo"; not "by Hokusai"
    if head in CONDITION_HEADS:
        return "other"
    return "object"


def _is_scene_phrase(text: str, head: str) -> bool:
    return any(text == p or text.endswith(" " + p) for p in _SCENE_PHRASES_BY_HEAD.get(head, ()))


_SCENE_PHRASES_BY_HEAD: dict[str, tuple[str, ...]] = {}
for _phrase in SCENE_PHRASES:
    _h = _phrase.rsplit(" ", 1)[-1]
    _SCENE_PHRASES_BY_HEAD[_h] = _SCENE_PHRASES_BY_HEAD.get(_h, ()) + (_phrase,)
