"""Word classes of English from the pipeline's own lemmatizer tables, and a typo-tolerant lookup of common nouns.

spaCy's rule lemmatizer ships the base forms of English nouns, verbs, adjectives and adverbs (WordNet's lists).
Extraction reads them to undo tagger mistakes the parse alone cannot see: "A lion changes from big to small"
(sm tags "changes" as a plural noun and "small" as a noun object), and to repair misspelt nouns ("a grizly bear
in a rivr") before parsing. A pipeline without these tables gets empty classes: no repair, nothing else changes.
"""
from __future__ import annotations

import re
import string
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from spacy.language import Language

_CLASSES = ("noun", "verb", "adj", "adv")
MIN_TYPO_CHARS = 4  # shorter words have too many one-edit neighbours to correct safely
_ES_PLURALS = ("ses", "xes", "zes", "ches", "shes", "oes")
_WORD = re.compile(r"[A-Za-z]+(?:'[A-Za-z]+)?")
_LETTERS = string.ascii_lowercase


def _inflection_bases(word: str) -> list[str]:
    """The word and the base forms an English inflection could come from (dogs, boxes, puppies, running, made)."""
    out = [word]
    for suffix, repl in (("ies", "y"), ("ied", "y"), ("es", ""), ("s", ""), ("ed", ""), ("ed", "e"), ("d", ""),
                         ("ing", ""), ("ing", "e"), ("er", ""), ("er", "e"), ("est", ""), ("ly", ""), ("'s", "")):
        if word.endswith(suffix) and len(word) - len(suffix) >= 2:
            stem = word[: len(word) - len(suffix)] + repl
            out.append(stem)
            if len(stem) > 2 and stem[-1] == stem[-2] and not repl:
                out.append(stem[:-1])  # running -> runn -> run
    return out


@dataclass(frozen=True)
class WordClasses:
    """Base forms of English nouns, verbs, adjectives and adverbs (empty when the pipeline has no tables)."""

    nouns: frozenset[str] = frozenset()
    verbs: frozenset[str] = frozenset()
    adjectives: frozenset[str] = frozenset()
    adverbs: frozenset[str] = frozenset()
    irregular: frozenset[str] = frozenset()  # inflected forms the tables list as exceptions (mice, ran)
    protected: frozenset[str] = frozenset()  # words never corrected (the pack's own lexicons, function words)
    lexicon: frozenset[str] = frozenset()  # the pack's own lexicons' words: a typo's tie goes to one of them

    def __bool__(self) -> bool:
        return bool(self.nouns)

    def known(self, word: str) -> bool:
        """Whether the word, or a base form it inflects from, is in any class."""
        w = word.lower()
        if w in self.irregular or w in self.protected:
            return True
        return any(b in self.nouns or b in self.verbs or b in self.adjectives or b in self.adverbs
                   for b in _inflection_bases(w))

    def is_verb_form(self, word: str) -> bool:
        """Whether the word is a verb's base or -s form ("changes", "orbits", "zoom")."""
        w = word.lower()
        return any(b in self.verbs for b in _inflection_bases(w)[:5])

    def singular(self, word: str) -> str:
        """A plural's singular that the noun table knows ("pandas", "boxes", "puppies"), else the word; lower case.
        An -es is a plural's only after a hiss or an o ("boxes", "tomatoes"; "Angeles" is no "angel")."""
        w = word.lower()
        if w in self.nouns or w in self.irregular or not w.endswith("s") or w.endswith("ss"):
            return w  # an irregular plural ("leaves") is the lemmatiser's, not a rule's
        bases = (w[:-1], w[:-2] if w.endswith(_ES_PLURALS) else "", w[:-3] + "y" if w.endswith("ies") else "")
        return next((b for b in bases if b in self.nouns), w)

    def is_adjective(self, word: str) -> bool:
        """Whether the word is an adjective's base form ("big", "small")."""
        return word.lower() in self.adjectives

    def correct(self, word: str) -> str | None:
        """The one common noun a single edit away from an unknown word ("rivr" -> "river", "mountians" ->
        "mountains"; of two, the one in the pack's lexicons: "feild" -> "field", not "felid"), or, for a long word,
        the one with two vowels swapped ("leapord" -> "leopard"), or the -ing form of a verb written without its g
        ("sleepin"), else None."""
        w = word.lower()
        if len(w) < MIN_TYPO_CHARS or not self.nouns or self.known(w):
            return None
        if w.endswith("in") and any(b in self.verbs for b in _inflection_bases(w + "g")[1:]):
            return w + "g"  # "sleepin", "crashin", "flyin": a dropped g, not a noun's typo
        if w.endswith("s") and not w.endswith("ss"):
            singular = self._noun_edit(w[:-1])
            if singular is not None:
                return singular + "s"
        return self._noun_edit(w)

    def _noun_edit(self, w: str) -> str | None:
        """The one common noun nearest `w` by `_edits`' tiers (unique within its tier, or the only one of the tier
        in `lexicon`), else None."""
        if len(w) < MIN_TYPO_CHARS or self.known(w):
            return None
        for candidates in _edits(w):
            # Typos keep the first letter: "backlight" is no "jacklight", "rivr" is a "river".
            hits = {c for c in candidates if c in self.nouns and len(c) >= MIN_TYPO_CHARS - 1 and c[0] == w[0]}
            ours = hits & self.lexicon  # of two equally near nouns, one in the pack's lexicons ("feild": field)
            if len(hits) == 1 or len(ours) == 1:
                return (hits if len(hits) == 1 else ours).pop()
            if hits:
                return None  # two equally likely nouns: leave the word
        return None

    def correct_text(self, text: str) -> str:
        """The text with each misspelt lower-case word replaced by its one-edit common noun (names untouched)."""
        if not self.nouns:
            return text

        def fix(m: "re.Match[str]") -> str:
            word = m.group(0)
            if not word.islower():
                return word  # "Kyoto", "NASA": names and acronyms are not typos of nouns
            fixed = self.correct(word)
            return fixed if fixed is not None else word
        return _WORD.sub(fix, text)


def _edits(w: str) -> list[set[str]]:
    """One-edit neighbours in order of how typos usually happen: a doubled letter, two letters swapped ("palce" is
    "place" before it is "palace"), a missing letter, then an extra or a wrong one."""
    splits = [(w[:i], w[i:]) for i in range(len(w) + 1)]
    doubled = {a + b[0] + b for a, b in splits if b} | {a + b[1:] for a, b in splits if len(b) > 1 and b[0] == b[1]}
    inserts = {a + c + b for a, b in splits for c in _LETTERS}
    deletes = {a + b[1:] for a, b in splits if b}
    swaps = {a + b[1] + b[0] + b[2:] for a, b in splits if len(b) > 1}
    replaces = {a + c + b[1:] for a, b in splits if b for c in _LETTERS if c != b[0]}
    # An extra or a wrong letter in a short word more often makes another word than a typo ("vlog", "hoodie").
    return [doubled, swaps, inserts, deletes if len(w) >= 6 else set(), replaces if len(w) >= 7 else set(),
            _vowel_swaps(w) if len(w) >= VOWEL_SWAP_CHARS else set()]


VOWEL_SWAP_CHARS = 7  # in a shorter word two vowels swapped make another word as often as a typo
_VOWELS = frozenset("aeiouy")


def _vowel_swaps(w: str) -> set[str]:
    """Two vowels either side of one consonant swapped, a spelling by sound two edits away ("leapord" ->
    "leopard", "bycicle" -> "bicycle"); the first letter is kept. (Any vowel written as another, "astronot" ->
    "astronaut", was measured and left out: it turned lower-case names into nouns, "grayson" -> "grison",
    "greenfield" -> "grainfield".)"""
    out: set[str] = set()
    for i in range(1, len(w) - 2):
        a, c, b = w[i], w[i + 1], w[i + 2]
        if a in _VOWELS and b in _VOWELS and c not in _VOWELS and a != b:
            out.add(w[:i] + b + c + a + w[i + 3:])
    return out


_BY_PIPELINE: dict[int, tuple[Any, WordClasses]] = {}
# Prepositions and conjunctions spaCy's stop list lacks: never typos ("amid" is no "amide", "whilst" no "whist"), never
# nouns the tagger took for prepositions (`repair`; "despite", "till" and "cause" are in the noun table).
FUNCTION_WORDS = frozenset({"amid", "amidst", "whilst", "atop", "unto", "betwixt", "alongside", "underneath",
                            "versus", "midst", "tho", "thru", "cuz", "despite", "till", "barring", "pending",
                            "notwithstanding", "cause"})


def word_classes(nlp: "Language", protected: frozenset[str] = frozenset()) -> WordClasses:
    """The word classes of a loaded pipeline (read once per pipeline object)."""
    seen = _BY_PIPELINE.get(id(nlp))
    if seen is not None and seen[0] is nlp:
        return seen[1]
    # Function words ("beside", "upon", "toward") are in no lemmatizer table; they are never typos of a noun
    # ("beside" is not "bedside").
    stop_words = frozenset(getattr(getattr(nlp, "Defaults", None), "stop_words", ()) or ()) | FUNCTION_WORDS
    lexicon = protected - stop_words
    protected = protected | stop_words
    classes = WordClasses(protected=protected, lexicon=lexicon)
    try:
        lookups = nlp.get_pipe("lemmatizer").lookups  # type: ignore[attr-defined]
        index, exc = lookups.get_table("lemma_index"), lookups.get_table("lemma_exc")
        strings = nlp.vocab.strings
        sets = {c: frozenset(index[strings[c]]) if strings[c] in index else frozenset() for c in _CLASSES}
        irregular = frozenset(w for c in _CLASSES if strings[c] in exc for w in exc[strings[c]])
        classes = WordClasses(sets["noun"], sets["verb"], sets["adj"], sets["adv"], irregular, protected, lexicon)
    except (KeyError, ValueError, AttributeError):
        pass  # no rule lemmatizer tables: no repairs
    _BY_PIPELINE[id(nlp)] = (nlp, classes)
    return classes


__all__ = ["MIN_TYPO_CHARS", "WordClasses", "word_classes"]
