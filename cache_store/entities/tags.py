"""Tag-list prompts ("masterpiece, best quality, 1girl, silver hair, (red dress:1.2), forest") as plain phrases.

ComfyUI users often write prompts as comma-separated tags in the style of image-board taggers, with emphasis
weights and quality words. Before parsing, every prompt loses its weight syntax ("(red dress:1.2)", "[[dress]]",
"{dress}" -> "red dress"); a prompt that reads as a tag list (many short comma-separated parts, or weights, or
count tags such as "1girl") is then split into its tags, the quality, rating and framing tags are dropped (see
data/tag_words.txt), and count tags become the person they name ("1girl" -> "a girl"), so the subject tag is the
first phrase and becomes the main subject.
"""
from __future__ import annotations

import re
from functools import lru_cache
from pathlib import Path

from .lexicon import PERSON_ROLES, names_one_of

TAG_WORDS_FILE = Path(__file__).resolve().parent / "data" / "tag_words.txt"
MIN_TAGS = 4          # a tag list has at least this many comma-separated parts ...
MAX_MEAN_WORDS = 3.5  # ... of at most this many words on average
_WEIGHTED = re.compile(r"[(\[{]+\s*([^()\[\]{}:]*?)\s*(?::\s*-?\d+(?:\.\d+)?)?\s*[)\]}]+")
_LORA = re.compile(r"<[^<>]{0,200}>")  # "<lora:name:0.8>" and other angle-bracket directives
_COUNT_TAG = re.compile(r"^(\d+|multiple|many)\s*(girl|boy|woman|man|other|person|people|kid|child)s?$")
_COUNT_WORDS = {"1": "a", "2": "two", "3": "three", "4": "four", "5": "five", "6": "six"}
_SPLIT = re.compile(r"\s*[,|;\n]\s*")


@lru_cache(maxsize=1)
def tag_words() -> frozenset[str]:
    """Quality, rating, framing and style tags that say nothing about what the video shows."""
    lines = TAG_WORDS_FILE.read_text(encoding="utf-8").splitlines()
    return frozenset(w for w in (line.split("#", 1)[0].strip().lower() for line in lines) if w)


def strip_weights(text: str) -> str:
    """The text without emphasis weights and brackets: "(red dress:1.2)" -> "red dress"; LoRA tags removed."""
    text = _LORA.sub(" ", text)
    previous = None
    while previous != text:  # nested "((red dress))"
        previous, text = text, _WEIGHTED.sub(lambda m: m.group(1), text)
    return text


def _count_tag(tag: str) -> str | None:
    m = _COUNT_TAG.match(tag)
    if m is None:
        return None
    number, noun = m.groups()
    plural = number not in ("1",)
    noun = {"other": "person", "person": "person"}.get(noun, noun)
    if plural:
        noun = {"man": "men", "woman": "women", "person": "people", "people": "people", "child": "children"}.get(
            noun, noun + "s")
    return f"{_COUNT_WORDS.get(number, 'several')} {noun}".replace("several people", "people")


def is_tag_list(parts: list[str], had_weights: bool) -> bool:
    """Whether comma-separated parts read as tags rather than sentences."""
    if len(parts) < 2:
        return False
    if had_weights or any(_COUNT_TAG.match(p.lower()) for p in parts):
        return True
    mean = sum(len(p.split()) for p in parts) / len(parts)
    return len(parts) >= MIN_TAGS and mean <= MAX_MEAN_WORDS


def normalise_tags(text: str) -> str:
    """A prompt ready for parsing: weights stripped; a tag list as its content tags, the subject first."""
    stripped = strip_weights(text)
    had_weights = stripped != text
    parts = [p.strip() for p in _SPLIT.split(stripped) if p.strip()]
    if not is_tag_list(parts, had_weights):
        return stripped
    drop = tag_words()
    subjects, rest = [], []
    for part in parts:
        tag = " ".join(part.lower().replace("_", " ").split())
        person = _count_tag(tag)
        if person is not None:
            subjects.append(person)
        elif tag not in drop and not tag.startswith(("score ", "by ", "artist:")):
            rest.append(part.replace("_", " "))
    one = bool(subjects) and subjects[-1].startswith(("a ", "an "))
    # a plural role after "1girl" names other people ("1girl, running, zombies"); only a singular one is what she is
    at = next((k for k, tag in enumerate(rest) if _role_tag(tag) and not (one and _plural_tag(tag))), None) \
        if subjects else None
    if at is not None:
        # "1girl, red hair, astronaut": the subject is what the person is ("an astronaut"); the count tag's generic
        # person follows it as a detail, so two tag lists of girls doing other things share no main subject.
        role = " ".join(rest.pop(at).lower().split())
        article = ("an " if role[0] in "aeiou" else "a ") if one else ""
        rest.insert(0, subjects[-1])
        subjects[-1] = f"{article}{role}"
    # One sentence a tag: the first sentence names the main subject, the others are secondary or scenes.
    return ". ".join(subjects + rest)


def _plural_tag(tag: str) -> bool:
    """Whether a tag's last word reads as a plural ("zombies", "students"; not "boss", "waitress")."""
    word = tag.lower().split()[-1] if tag.split() else ""
    return word.endswith("s") and not word.endswith(("ss", "us", "is"))


def _role_tag(tag: str) -> bool:
    """Whether a tag names what a person is ("astronaut", "police officer", "samurais")."""
    return names_one_of(" ".join(tag.lower().split()), PERSON_ROLES)


__all__ = ["is_tag_list", "normalise_tags", "strip_weights", "tag_words"]
