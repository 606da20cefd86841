"""Is a prompt English? The extractor parses with an English pipeline, and a prompt in another language parses
into nonsense entities ("un", "ein koch"), so such a prompt has no entities: a clean miss, never a wrong hit,
and the nodes say which language they saw and what to do.

Two signals: the script (a prompt written mostly in Han, kana, Hangul, Cyrillic, Greek, Arabic, Hebrew,
Devanagari or Thai letters is not English), and for Latin-script prompts the function words of six languages
whose stop lists ship with spaCy, helped by the letters only those languages use ("läuft", "niño", "garçon").

No multilingual matching: it would need a multilingual sentence encoder (the smallest of the MiniLM kind,
paraphrase-multilingual-MiniLM-L12-v2, is about 470 MB with twice the layers of the pack's encoder, so about
twice its cost per lookup, and no PyPI package ships its weights) and a parser per language for the roles.
"""
from __future__ import annotations

import re
from functools import lru_cache

# Languages whose function words are told apart from English ones (their stop lists ship with spaCy).
OTHER_LANGUAGES = ("de", "es", "fr", "it", "nl", "pt", "pl", "tr")
LANGUAGE_NAMES = {"de": "German", "es": "Spanish", "fr": "French", "it": "Italian", "nl": "Dutch", "pt": "Portuguese",
                  "pl": "Polish", "tr": "Turkish", "xx": "not English (its letters)",
                  "zh": "Chinese", "ja": "Japanese", "ko": "Korean", "ru": "Russian (Cyrillic script)",
                  "el": "Greek", "ar": "Arabic", "he": "Hebrew", "hi": "Hindi (Devanagari script)", "th": "Thai"}
_WORD = re.compile(r"[^\W\d_]+", re.UNICODE)
# Letters an English prompt does not use, by the languages that do (a hint, counted with the function words).
_LETTERS = {"de": "äöüß", "es": "ñ¿¡áéíóú", "fr": "çèêëàâîïôûœ", "it": "àèéìòù", "nl": "ĳëï", "pt": "ãõçáâêôé",
            "pl": "ąćęłńóśźż", "tr": "çğıöşüİ"}
# Common English words that are function words elsewhere ("car" and "stop" in French, "pan" in Polish): never
# counted for another language.
ENGLISH_LOOKALIKES = frozenset({"car", "stop", "pan", "pit", "son", "fin", "dove", "sale", "come", "die", "mine",
                                "male", "van", "den", "via", "tan", "ten", "bro"})
# A prompt whose words carry letters outside English this often is in another language even when its function
# words are in no list here ("xx").
MARKED_WORD_SHARE = 0.25
# Unicode ranges of other scripts; kana decides Japanese over Chinese.
_SCRIPTS = (("ja", ((0x3040, 0x30FF),)), ("ko", ((0xAC00, 0xD7AF), (0x1100, 0x11FF))),
            ("zh", ((0x4E00, 0x9FFF), (0x3400, 0x4DBF))), ("ru", ((0x0400, 0x04FF),)), ("el", ((0x0370, 0x03FF),)),
            ("ar", ((0x0600, 0x06FF),)), ("he", ((0x0590, 0x05FF),)), ("hi", ((0x0900, 0x097F),)),
            ("th", ((0x0E00, 0x0E7F),)))
_FIRST_SCRIPT_CODE = min(lo for _, ranges in _SCRIPTS for lo, _ in ranges)
_LATIN_CONTENT_WORD = re.compile(r"(?<![^\W\d_])[A-Za-z]{3,}(?![^\W\d_])")
OTHER_SCRIPT_SHARE = 0.3  # share of a prompt's letters in another script that makes it not English


@lru_cache(maxsize=1)
def _stop_words() -> tuple[frozenset[str], dict[str, frozenset[str]]]:
    from spacy.lang.de.stop_words import STOP_WORDS as DE
    from spacy.lang.en.stop_words import STOP_WORDS as EN
    from spacy.lang.es.stop_words import STOP_WORDS as ES
    from spacy.lang.fr.stop_words import STOP_WORDS as FR
    from spacy.lang.it.stop_words import STOP_WORDS as IT
    from spacy.lang.nl.stop_words import STOP_WORDS as NL
    from spacy.lang.pl.stop_words import STOP_WORDS as PL
    from spacy.lang.pt.stop_words import STOP_WORDS as PT
    from spacy.lang.tr.stop_words import STOP_WORDS as TR

    english = frozenset(EN) | ENGLISH_LOOKALIKES
    lists = dict(zip(OTHER_LANGUAGES, (DE, ES, FR, IT, NL, PT, PL, TR)))
    return english, {code: frozenset(w for w in words if w not in english) for code, words in lists.items()}


def other_script(text: str) -> str | None:
    """The language code of the non-Latin script most of the prompt's letters are written in, or None."""
    letters = [ord(ch) for ch in text if ch.isalpha()]
    if not letters or max(letters) < _FIRST_SCRIPT_CODE:  # Latin letters only: no script below can count
        return None
    counts = {code: sum(any(lo <= c <= hi for lo, hi in ranges) for c in letters) for code, ranges in _SCRIPTS}
    if counts["ja"] and counts["ja"] + counts["zh"] >= OTHER_SCRIPT_SHARE * len(letters):
        return "ja"
    code, n = max(counts.items(), key=lambda kv: kv[1])
    return code if n >= OTHER_SCRIPT_SHARE * len(letters) else None


def foreign_language(text: str) -> str | None:
    """The code of the language `text` is written in when it is not English, or None.

    Another script decides when no Latin word of three letters or more stands beside it; in Latin script, a
    language needs at least two of its own function words (or one and a word with a letter only it uses) and no
    fewer than English has. Capitalised words after the first are names ("Van Gogh", "La Paz") and are not counted.
    """
    script = other_script(text)
    if script is not None and not _LATIN_CONTENT_WORD.search(text):
        return script  # with an English word beside it ("Собака бежит, a dog") the English part is parsed
    found = _WORD.findall(text)
    words = [w.lower() for i, w in enumerate(found) if i == 0 or not w[:1].isupper()]
    english, others = _stop_words()
    n_english = sum(w in english for w in words)
    distinct = set(words)
    # Only words with a letter beyond ASCII can carry another language's letters: most prompts have none, and
    # testing every letter of every word for eight languages was most of this function's time.
    unusual = [w for w in words if not w.isascii()]
    best, score = None, 0
    for code, stops in others.items():
        n = len(distinct & stops)
        marked = sum(any(ch in _LETTERS[code] for ch in w) for w in unusual)
        if n >= 2 or (n >= 1 and marked >= 1):
            if n + marked > score and n + marked >= n_english:
                best, score = code, n + marked
    if best is None and words:
        latin = [w for w in unusual if all("a" <= ch <= "z" or "\u00df" <= ch <= "\u024f" for ch in w)]
        n_latin = len(words) - len(unusual) + len(latin)  # ASCII words are lowercased letters: all Latin
        if len(latin) >= 2 and len(latin) >= MARKED_WORD_SHARE * n_latin:
            return "xx"
    return best


def language_name(code: str) -> str:
    """'German' for 'de'; the code itself for a language without a name here."""
    return LANGUAGE_NAMES.get(code, code)


def english_only_note(code: str) -> str:
    """What a user reads when a prompt in another language has no entities: why, and what to do."""
    return (f"entity extraction is English-only: this prompt looks {language_name(code)}, so it has no entities, "
            "every lookup misses and nothing is stored for it. To use the cache, give CHAI Entity Extract an "
            "English description of the same video (its prompt input can be a separate English text; the text "
            "encoder keeps yours).")


__all__ = ["LANGUAGE_NAMES", "OTHER_LANGUAGES", "english_only_note", "foreign_language", "language_name",
           "other_script"]
