"""Stop entities: extracted phrases with no visual content (camera words, template and style words)."""
from __future__ import annotations

import os
import re
from collections.abc import Iterable
from functools import lru_cache
from pathlib import Path

DEFAULT_STOP_FILE = Path(__file__).resolve().parent / "data" / "stop_entities.txt"
HEAD_PREFIX = "head:"
STRIP_PREFIX = "strip:"
TEMPLATE_PREFIX = "template:"
_SPACES = re.compile(r"\s+")


def normalise_phrase(text: str) -> str:
    """Lower-case and collapse whitespace, the form both entity texts and list entries are compared in."""
    return _SPACES.sub(" ", text).strip().lower()


class StopEntities:
    """A set of stop phrases and stop head nouns; see data/stop_entities.txt for the format and the rules."""

    def __init__(self, phrases: Iterable[str] = (), heads: Iterable[str] = (),
                 strip_heads: Iterable[str] = (), templates: Iterable[str] = ()) -> None:
        self.phrases = frozenset(p for p in map(normalise_phrase, phrases) if p)
        self.heads = frozenset(h for h in map(normalise_phrase, heads) if h)
        self.strip_heads = frozenset(h for h in map(normalise_phrase, strip_heads) if h)
        self.templates = frozenset(t for t in map(normalise_phrase, templates) if t)
        bad = [h for h in self.heads | self.strip_heads if " " in h]
        if bad:
            raise ValueError(f"head and strip entries must be single words, got {sorted(bad)}")
        words = sorted(self.templates, key=len, reverse=True)
        alternatives = "|".join(r"\s+".join(map(re.escape, t.split())) for t in words)
        self._template_re = re.compile(r"\b(?:" + alternatives + r")\b", re.IGNORECASE) if words else None
        # A template that is a whole piece of a tag list, which `tags.normalise_tags` writes as sentences ("8k.
        # slow motion. hawaii"), goes with the period before it: a comma left between two periods would be a sentence
        # of its own and upset the tagger on the next piece. The period after it stays for the next template of a
        # run ("slow motion. golden hour."). In prose the comma stays ("tracking shot, zoom in, a fox").
        self._piece_re = (re.compile(r"(?:^|\.\s+)(?:" + alternatives + r")\s*(?=\.|$)", re.IGNORECASE)
                          if words else None)

    def mask_templates(self, text: str) -> str:
        """The prompt with template phrases ("depth of field") replaced by a comma, or removed where one is a whole
        piece of a tag list, so no entity comes from them."""
        if self._template_re is None or self._piece_re is None:
            return text
        # The last piece keeps a period: a list's last word without one is read as a verb ("... mane flowing. splash").
        pieces = self._piece_re.sub(lambda m: "." if m.end() == len(text) else "", text)
        if pieces != text:
            pieces = pieces.lstrip(". ")
        return self._template_re.sub(",", pieces)

    @classmethod
    def parse(cls, lines: Iterable[str], source: str = "<lines>") -> "StopEntities":
        """Build from lines in the stop-list format (phrases, `head:` and `strip:` entries, `#` comments)."""
        phrases: list[str] = []
        words: dict[str, list[str]] = {HEAD_PREFIX: [], STRIP_PREFIX: []}
        templates: list[str] = []
        for number, raw in enumerate(lines, 1):
            line = raw.split("#", 1)[0].strip()
            if not line:
                continue
            if line.lower().startswith(TEMPLATE_PREFIX):
                templates.append(line[len(TEMPLATE_PREFIX):])
                continue
            prefix = next((p for p in words if line.lower().startswith(p)), None)
            if prefix is None:
                phrases.append(line)
                continue
            word = normalise_phrase(line[len(prefix):])
            if not word or " " in word:
                raise ValueError(f"{source}:{number}: {prefix!r} needs exactly one word, got {raw.strip()!r}")
            words[prefix].append(word)
        return cls(phrases, words[HEAD_PREFIX], words[STRIP_PREFIX], templates)

    @classmethod
    def from_file(cls, path: str | os.PathLike) -> "StopEntities":
        """Load a stop list file (UTF-8)."""
        path = Path(path)
        with path.open(encoding="utf-8") as fh:
            return cls.parse(fh, source=str(path))

    @classmethod
    def default(cls) -> "StopEntities":
        """The list shipped with the package (loaded once per process)."""
        return _default_stop_entities()

    @classmethod
    def empty(cls) -> "StopEntities":
        """A list that stops nothing."""
        return cls()

    def is_stop(self, entity_text: str, head: str | None = None) -> bool:
        """True when the phrase is listed or its head noun (default: its last word) is a head or strip entry."""
        text = normalise_phrase(entity_text)
        if not text:
            return True
        if text in self.phrases:
            return True
        head = normalise_phrase(head) if head else text.rsplit(" ", 1)[-1]
        return head in self.heads or head in self.strip_heads

    def __len__(self) -> int:
        return len(self.phrases) + len(self.heads) + len(self.strip_heads) + len(self.templates)

    def __repr__(self) -> str:
        return (f"StopEntities({len(self.phrases)} phrases, {len(self.heads)} heads, "
                f"{len(self.strip_heads)} strip heads)")


@lru_cache(maxsize=1)
def _default_stop_entities() -> StopEntities:
    return StopEntities.from_file(DEFAULT_STOP_FILE)
