"""Is a prompt English? The extractor parses with an English pipeline, and a prompt in another language parses
into nonsense entities ("un", "ein koch"), so such a prompt has no entities: a clean miss, never a wrong hit."""
from __future__ import annotations

import re
from functools import lru_cache

# Languages whose function words are told apart from English ones (their stop lists ship with spaCy).
OTHER_LANGUAGES = ("de", "es", "fr", "it", "nl", "pt")
LANGUAGE_NAMES = {"de": "German", "es": "Spanish", "fr": "French", "it": "Italian", "nl": "Dutch", "pt": "Portuguese"}
_WORD = re.compile(r"[^\W\d_]+", re.UNICODE)


@lru_cache(maxsize=1)
def _stop_words() -> tuple[frozenset[str], dict[str, frozenset[str]]]:
    from spacy.lang.de.stop_words import STOP_WORDS as DE
    from spacy.lang.en.stop_words import STOP_WORDS as EN
    from spacy.lang.es.stop_words import STOP_WORDS as ES
    from spacy.lang.fr.stop_words import STOP_WORDS as FR
    from spacy.lang.it.stop_words import STOP_WORDS as IT
    from spacy.lang.nl.stop_words import STOP_WORDS as NL
    from spacy.lang.pt.stop_words import STOP_WORDS as PT

    english = frozenset(EN)
    lists = dict(zip(OTHER_LANGUAGES, (DE, ES, FR, IT, NL, PT)))
    return english, {code: frozenset(w for w in words if w not in english) for code, words in lists.items()}


def foreign_language(text: str) -> str | None:
    """The code of a language with at least two function words in `text` and no fewer than English has, or None.

    Capitalised words after the first are names ("Van Gogh", "La Paz") and are not counted.
    """
    found = _WORD.findall(text)
    words = [w.lower() for i, w in enumerate(found) if i == 0 or not w[:1].isupper()]
    english, others = _stop_words()
    n_english = sum(w in english for w in words)
    best, count = None, 0
    for code, stops in others.items():
        n = sum(w in stops for w in words)
        if n > count:
            best, count = code, n
    return best if count >= 2 and count >= n_english else None


def language_name(code: str) -> str:
    """'German' for 'de'; the code itself for a language without a name here."""
    return LANGUAGE_NAMES.get(code, code)


def english_only_note(code: str) -> str:
    """What a user reads when a prompt in another language has no entities: why, and what to do."""
    return (f"entity extraction is English-only: this prompt looks {language_name(code)}, so it has no entities, "
            "every lookup misses and nothing is stored for it. To use the cache, give CHAI Entity Extract an "
            "English description of the same video (its prompt input can be a separate English text; the text "
            "encoder keeps yours).")


__all__ = ["LANGUAGE_NAMES", "OTHER_LANGUAGES", "english_only_note", "foreign_language", "language_name"]
