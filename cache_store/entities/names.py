"""Proper names in an entity: the words that tie one character, product or vehicle across a project's prompts."""
from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from .wordclass import WordClasses

if TYPE_CHECKING:
    from spacy.tokens import Token

MIN_NAME_CHARS = 3
# Abbreviated titles the word tables do not know ("Sgt. Reyes", "Capt. Marrow"); spelt-out ones ("Captain") are
# English words, which are never names here.
TITLES = frozenset({"capt", "cmdr", "det", "insp", "mlle", "mme", "mrs", "prof", "sgt", "sra"})


def name_words(tokens: Iterable["Token"], words: WordClasses) -> tuple[str, ...]:
    """The words written as a name (capitalised, letters only, not an acronym) that no English word table knows:
    "Aurelia" in "Aurelia GT", "Osei" in "Dr. Osei", "Vantra" in "the Vantra Glide". A name common words spell
    ("Miso", "Luna") is left out: it may name the thing the word does. Without word tables: none."""
    if not words:
        return ()
    return tuple(dict.fromkeys(
        t.lower_ for t in tokens
        if t.is_alpha and len(t.text) >= MIN_NAME_CHARS and t.text[0].isupper() and not t.text.isupper()
        and t.lower_ not in TITLES and not words.known(t.lower_)))


def shares_a_name(entity: object, identity: str) -> bool:
    """Whether a name of `entity` (its `names`) is a word of another entity's identity: one character, product or
    vehicle however each prompt calls it ("Amara Osei" / "Dr. Osei", "the Aurelia" / "Aurelia GT")."""
    names = getattr(entity, "names", ())
    return bool(names) and any(n in identity.split() for n in names)
