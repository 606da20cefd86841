"""Proper names in an entity: the words that tie one character, product or vehicle across a project's prompts."""
from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from .wordclass import WordClasses

if TYPE_CHECKING:
    from spacy.tokens import Token

MIN_NAME_CHARS = 3
# Titles written before a name, no part of it ("Dr. Osei", "Captain Ilse Marrow", "Sgt. Reyes"): never a name, and
# allowed beside one in an identity that is only a name.
TITLES = frozenset({"capt", "captain", "cmdr", "commander", "det", "detective", "doctor", "dr", "general", "insp",
                    "inspector", "king", "lady", "lieutenant", "lord", "madam", "miss", "mlle", "mme", "mr", "mrs",
                    "ms", "officer", "prince", "princess", "prof", "professor", "queen", "sergeant", "sgt", "sir",
                    "sra"})


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
    """Whether `entity` and another entity's identity are one character, product or vehicle however each prompt
    calls it ("Amara Osei" / "Dr. Osei", "the Aurelia" / "Aurelia GT"): both identities hold nothing but the
    entity's names (`names`), titles and codes ("gt", "x1"), and share a name. A likeness or a part of the named
    thing ("Aurelia GT keychain", "Majestik lion statue") names another thing, and the rule's usual tests decide."""
    names = frozenset(getattr(entity, "names", ()))
    if not names:
        return False
    own, other = _words(getattr(entity, "identity", "")), _words(identity)
    return bool(names.intersection(other)) and _only_names(own, names) and _only_names(other, names)


def _words(identity: str) -> list[str]:
    return identity.replace(".", " ").split()  # an older store's cores keep an abbreviation's period ("dr. osei")


def _only_names(words: list[str], names: frozenset[str]) -> bool:
    return all(w in names or w in TITLES or len(w) <= 2 or any(c.isdigit() for c in w) for w in words)
