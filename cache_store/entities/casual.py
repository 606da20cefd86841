"""Casual spellings of chat and social-media prompts, undone before parsing ("car driving thru desert", "cat
sleepin by window", "penguin slipping on ice lmao").

The typo repair (`wordclass.WordClasses.correct`) maps an unknown word to the one common noun a single edit away;
it would read "thru" as "thrum". Shorthand spellings are mapped here instead, and reactions that name nothing
("lol", "pls") are dropped.
"""
from __future__ import annotations

import re

SPELLINGS: dict[str, str] = {
    "thru": "through", "nite": "night", "tonite": "tonight", "smol": "small", "lil": "little", "w/": "with",
    "w/o": "without", "bc": "because", "cuz": "because", "luv": "love", "gud": "good",
    "kinda": "kind of", "sorta": "sort of", "gonna": "going to", "wanna": "want to", "realy": "really",
}
FILLERS = frozenset({"lol", "lmao", "lmfao", "rofl", "omg", "pls", "plz", "pleas", "tbh", "ngl", "btw", "rn", "af",
                     "idk", "imo", "bruh", "fr", "xd", "haha", "hehe", "yay", "yummy", "uwu"})
_WORD = re.compile(r"(?<![\w'])(w/o|w/|[A-Za-z]+)(?![\w'])")


def casual_spelling(text: str) -> str:
    """The text with shorthand spellings written out and filler reactions removed (case of names kept)."""
    def fix(m: "re.Match[str]") -> str:
        word = m.group(0)
        low = word.lower()
        if low in FILLERS:
            return ""
        return SPELLINGS.get(low, word) if word.islower() else word
    return _WORD.sub(fix, text)


__all__ = ["FILLERS", "SPELLINGS", "casual_spelling"]
