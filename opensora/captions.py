"""Caption handling as OpenSora 1.2 applies it before T5: score suffixes, caption cleaning, 300-token limit.

Order in OpenSora's inference script: append the score suffixes to the raw prompt, then clean the whole string
twice (``text_preprocessing`` runs the PixArt/DeepFloyd ``clean_caption`` two times), then tokenize with
``max_length=300`` and truncation (299 text tokens plus ``</s>``).

The cleaning here is our own implementation of the same rules, standard library only. Known differences from
upstream, which uses ftfy and BeautifulSoup:

- ftfy's mojibake repair (text decoded with the wrong codec, e.g. "cafÃ©") is not reproduced; the rest of
  ``ftfy.fix_text`` that can change a prompt (C1 controls read as Windows-1252, Latin ligatures, full-width
  characters, curly quotes, line breaks, surrogates, control characters, terminal escapes, NFC) is.
- HTML is stripped with the standard ``html.parser`` (the parser BeautifulSoup was told to use); comments and
  the contents of ``<script>``/``<style>`` are dropped; unknown entities without ``;`` follow
  ``html.unescape`` instead of BeautifulSoup's table.
- Loop prompts (``|0| ... |1| ...``) and trailing JSON reference blocks are not parsed.
"""

from __future__ import annotations

import html
import html.entities
import re
import unicodedata
import urllib.parse
from collections.abc import Callable, Sequence
from html.parser import HTMLParser
from typing import TypeVar

MAX_TOKENS = 300  # T5 model_max_length in OpenSora 1.2, including the closing </s>
T5_EOS_ID = 1
DEFAULT_AESTHETIC_SCORE = 6.5

T = TypeVar("T")

# ---------------------------------------------------------------------------------------------------------------
# Score suffixes


def append_scores(
    prompt: str,
    aesthetic_score: float | None = DEFAULT_AESTHETIC_SCORE,
    motion_score: float | None = None,
    camera_motion: str | None = None,
) -> str:
    """Append OpenSora's optional " aesthetic score: 6.5." / " motion score: 5.0." / " camera motion: x." suffixes."""
    # A suffix is skipped when the prompt already carries that label, as OpenSora does (case-sensitive test).
    text = prompt
    if aesthetic_score is not None and "aesthetic score:" not in prompt:
        text += f" aesthetic score: {aesthetic_score:.1f}."
    if motion_score is not None and "motion score:" not in prompt:
        text += f" motion score: {motion_score:.1f}."
    if camera_motion is not None and "camera motion:" not in prompt:
        text += f" camera motion: {camera_motion}."
    return text


# ---------------------------------------------------------------------------------------------------------------
# Caption cleaning


class _TextOnly(HTMLParser):
    """Collect the text of an HTML fragment the way BeautifulSoup's html.parser tree builder reports it."""

    _SKIPPED = frozenset({"script", "style"})

    def __init__(self) -> None:
        # References are decoded by the handlers below, not by the parser, to match BeautifulSoup's rules.
        super().__init__(convert_charrefs=False)
        self.parts: list[str] = []
        self._skip_depth = 0

    def handle_starttag(self, tag: str, attrs: list) -> None:
        if tag in self._SKIPPED:
            self._skip_depth += 1

    def handle_endtag(self, tag: str) -> None:
        if tag in self._SKIPPED and self._skip_depth:
            self._skip_depth -= 1

    def handle_data(self, data: str) -> None:
        if not self._skip_depth:
            self.parts.append(data)

    def handle_entityref(self, name: str) -> None:
        # A known name decodes with or without ";"; an unknown one stays as "&name" (its ";" is lost).
        self.handle_data(html.entities.html5.get(name + ";", "&" + name))

    def handle_charref(self, name: str) -> None:
        try:
            code = int(name[1:], 16) if name[:1] in ("x", "X") else int(name)
        except ValueError:
            self.handle_data("\ufffd")
            return
        text = "\ufffd" if code == 0 else ""
        if 0 < code < 256:  # small numeric references are read as Windows-1252, as browsers do
            try:
                text = bytes([code]).decode("cp1252")
            except UnicodeDecodeError:
                text = ""
        if not text:
            try:
                text = chr(code)
            except (ValueError, OverflowError):
                text = "\ufffd"
        self.handle_data(text)


def strip_html(text: str) -> str:
    """Text content of an HTML fragment (tags removed, references decoded); unparsable markup is kept as is."""
    parser = _TextOnly()
    try:
        parser.feed(text)
        parser.close()
    except (AssertionError, ValueError):  # e.g. a malformed "<![" section; upstream raises here
        return text
    return "".join(parser.parts)


_TLDS = "com|co|ru|net|org|edu|gov|it"


def _url_rule(scheme: str) -> re.Pattern[str]:
    # Removes "scheme:" plus its slashes (or the next character), and bare host names with one of a few TLDs
    # plus the path characters that follow. Query strings survive, as upstream.
    return re.compile(rf"\b(?:{scheme}:(?:/{{1,3}}|[a-zA-Z0-9%])|[a-zA-Z0-9.\-]+\.(?:{_TLDS})[\w/-]*\b/?(?!@))")


# Unicode dash punctuation folded to "-" (the upstream list; U+2E5D and U+10EAD are not in it).
_DASHES = "".join(
    chr(c)
    for c in (
        0x002D, 0x058A, 0x05BE, 0x1400, 0x1806, *range(0x2010, 0x2016), 0x2E17, 0x2E1A, 0x2E3A, 0x2E3B, 0x2E40,
        0x301C, 0x3030, 0x30A0, 0xFE31, 0xFE32, 0xFE58, 0xFE63, 0xFF0D,
    )
)
_BAD_PUNCT = "#®•©™&@·º½¾¿¡§~()[]{}|\\/*"
_FILE_EXTS = "png|jpg|jpeg|bmp|webp|eps|pdf|apk|mp4"

# Ordered rules of one cleaning pass, before the ftfy/unescape step ("basic clean").
_RULES_BEFORE: list[tuple[re.Pattern[str], str]] = [
    (re.compile(r"<person>"), "person"),
    (_url_rule("https?"), ""),
    (_url_rule("www"), ""),
]
# After HTML stripping.
_RULES_MIDDLE: list[tuple[re.Pattern[str], str]] = [
    (re.compile(r"@\w+\b"), ""),  # @handles
    (re.compile("[\u31c0-\u9fff]+"), ""),  # CJK strokes .. unified ideographs (kana and hangul are kept)
    (re.compile("[" + re.escape(_DASHES) + "]+"), "-"),
    (re.compile("[`\u00b4\u00ab\u00bb\u201c\u201d\u00a8]"), '"'),
    (re.compile("[\u2018\u2019]"), "'"),
    (re.compile(r"&quot;?"), ""),
    (re.compile(r"&amp"), ""),
    (re.compile(r"\d{1,3}\.\d{1,3}\.\d{1,3}\.\d{1,3}"), " "),  # IP addresses
    (re.compile(r"\d:\d\d\s+$"), ""),  # trailing "article ids"
    (re.compile(r"\\n"), " "),  # a literal backslash-n
    (re.compile(r"#\d{1,3}\b"), ""),
    (re.compile(r"#\d{5,}\b"), ""),
    (re.compile(r"\b\d{6,}\b"), ""),
    (re.compile(rf"\S+\.(?:{_FILE_EXTS})"), ""),  # file names
    (re.compile(r"[\"']{2,}"), '"'),
    (re.compile(r"\.{2,}"), " "),
    (re.compile("[" + re.escape(_BAD_PUNCT) + "]+"), " "),
    (re.compile(r"\s+\.\s+"), " "),
]
_SEPARATORS = re.compile(r"[-_]")
# After the basic clean.
_RULES_AFTER: list[tuple[re.Pattern[str], str]] = [
    (re.compile(r"\b[a-zA-Z]{1,3}\d{3,15}\b"), ""),  # product codes: jc6640
    (re.compile(r"\b[a-zA-Z]+\d+[a-zA-Z]+\b"), ""),  # jc6640vc
    (re.compile(r"\b\d+[a-zA-Z]+\d+\b"), ""),  # 6640vc231
    (re.compile(r"(worldwide\s+)?(free\s+)?shipping"), ""),
    (re.compile(r"(free\s)?download(\sfree)?"), ""),
    (re.compile(r"\bclick\b\s(?:for|on)\s\w+"), ""),
    # No trailing \b upstream either: "epsilon" loses its "eps".
    (re.compile(rf"\b(?:{_FILE_EXTS})(\simages?)?"), ""),
    (re.compile(r"\bpage\s+\d+\b"), ""),
    (re.compile(r"\b\d*[a-zA-Z]+\d+[a-zA-Z]+\d+[a-zA-Z\d]*\b"), " "),  # j2d1a2a...
    (re.compile("\\b\\d+\\.?\\d*[x\u0445\u00d7]\\d+\\.?\\d*\\b"), ""),  # sizes: 1920x1080 (latin x, cyrillic, times)
    (re.compile(r"\b\s+:\s+"), ": "),
    (re.compile(r"(\D[,./])\b"), r"\1 "),  # a space after punctuation glued to the next word
    (re.compile(r"\s+"), " "),
    (re.compile(r"^[\"']([\w\W]+)[\"']$"), r"\1"),  # surrounding quotes
    (re.compile(r"^['_,\-:;]"), ""),
    (re.compile(r"['_,\-:+]$"), ""),
    (re.compile(r"^\.\S+$"), ""),
]

# --- the parts of ftfy.fix_text that matter for prompts, reimplemented -------------------------------------------
_TERMINAL_ESCAPE = re.compile(r"\x1b\[[\d;]*[a-zA-Z]")
_C1_CONTROL = re.compile("[\x80-\x9f]")
# Latin ligatures; each is replaced by its one-level compatibility decomposition ("ﬁ" -> "fi", "ǆ" -> "dž").
_LIGATURES = "".join(
    chr(c) for c in (0x0132, 0x0133, 0x0149, *range(0x01C4, 0x01CD), *range(0x01F1, 0x01F4), *range(0xFB00, 0xFB07))
)
_CONTROL_CHARS = frozenset(
    [*range(0x00, 0x09), 0x0B, *range(0x0E, 0x20), 0x7F, *range(0x206A, 0x2070), 0xFEFF, *range(0xFFF9, 0xFFFD)]
)


def _c1_as_cp1252(match: re.Match[str]) -> str:
    try:
        return match.group().encode("latin-1").decode("cp1252")
    except UnicodeDecodeError:  # 0x81, 0x8d, 0x8f, 0x90, 0x9d are undefined in cp1252: leave them
        return match.group()


def _compat_decomposition(char: str) -> str:
    parts = unicodedata.decomposition(char).split()
    return "".join(chr(int(p, 16)) for p in parts if not p.startswith("<")) or char


_LIGATURE_MAP = {ord(c): _compat_decomposition(c) for c in _LIGATURES}
_WIDTH_MAP = {0x3000: " "}
# Full-width and half-width forms fold to their usual characters ("Ａ" -> "A", U+3000 -> " ").
_WIDTH_MAP.update(
    {c: folded for c in range(0xFF01, 0xFFF0) if (folded := unicodedata.normalize("NFKC", chr(c))) != chr(c)}
)
_QUOTE_MAP = {0x02BC: "'", **{c: "'" for c in range(0x2018, 0x201C)}, **{c: '"' for c in range(0x201C, 0x2020)}}


def fix_text(text: str) -> str:
    """Standard-library stand-in for ``ftfy.fix_text`` with its defaults, minus mojibake repair."""
    text = _TERMINAL_ESCAPE.sub("", text)
    text = _C1_CONTROL.sub(_c1_as_cp1252, text)
    text = text.translate(_LIGATURE_MAP).translate(_WIDTH_MAP).translate(_QUOTE_MAP)
    text = text.replace("\r\n", "\n").translate({0x0D: "\n", 0x2028: "\n", 0x2029: "\n", 0x85: "\n"})
    if any(0xD800 <= ord(c) <= 0xDFFF for c in text):  # pair up surrogates, lone ones become U+FFFD
        text = text.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "replace")
    text = "".join(c for c in text if ord(c) not in _CONTROL_CHARS)
    return unicodedata.normalize("NFC", text)


def _basic_clean(text: str) -> str:
    return html.unescape(html.unescape(fix_text(text))).strip()


def _apply(rules: list[tuple[re.Pattern[str], str]], text: str) -> str:
    for pattern, replacement in rules:
        text = pattern.sub(replacement, text)
    return text


def clean_caption_once(caption: str) -> str:
    """One pass of the PixArt/DeepFloyd caption cleaning that OpenSora's T5 encoder applies."""
    text = urllib.parse.unquote_plus(str(caption))
    text = text.strip().lower()
    text = _apply(_RULES_BEFORE, text)
    text = strip_html(text)
    text = _apply(_RULES_MIDDLE, text)
    if len(_SEPARATORS.findall(text)) > 3:  # this-is-my-cute-cat / this_is_my_cute_cat
        text = _SEPARATORS.sub(" ", text)
    text = _basic_clean(text)
    text = _apply(_RULES_AFTER, text)
    return text.strip()


def clean_caption(caption: str) -> str:
    """OpenSora's text preprocessing: the caption cleaning applied twice (lower-cases, strips URLs/HTML/symbols)."""
    return clean_caption_once(clean_caption_once(caption))


def prepare_caption(
    prompt: str,
    aesthetic_score: float | None = DEFAULT_AESTHETIC_SCORE,
    motion_score: float | None = None,
    camera_motion: str | None = None,
    clean: bool = True,
) -> str:
    """The text OpenSora feeds to T5 for a prompt: suffixes appended, then cleaned (or only lower-cased)."""
    text = append_scores(prompt, aesthetic_score, motion_score, camera_motion)
    return clean_caption(text) if clean else text.lower().strip()


# ---------------------------------------------------------------------------------------------------------------
# Truncation to the T5 limit

_APPROX_PIECES = re.compile(r"[^\W\d_]+|\d+|[^\w\s]|_")


def approx_token_count(text: str) -> int:
    """Rough T5 token count without a tokenizer (no </s>); about 1% off in total on VBench, ±25% per prompt."""
    count = 0
    for piece in _APPROX_PIECES.findall(text):
        if piece[0].isalpha():
            # SentencePiece splits rare long words; a lone letter costs "▁" plus the letter.
            count += 1 + (len(piece) - 1) // 6 + (1 if len(piece) == 1 else 0)
        elif piece[0].isdigit():
            count += 1 + (len(piece) - 1) // 2
        else:
            count += 1
    return count


def truncate_tokens(
    tokens: Sequence[T], max_tokens: int = MAX_TOKENS, eos: int = T5_EOS_ID, key: Callable[[T], int] | None = None
) -> list[T]:
    """Cut a token sequence to OpenSora's limit: at most max_tokens - 1 text tokens, plus the final </s> if present."""
    if max_tokens < 2:
        raise ValueError(f"max_tokens must be >= 2 (text plus </s>), got {max_tokens}")
    items = list(tokens)
    has_eos = bool(items) and (key(items[-1]) if key is not None else items[-1]) == eos
    body = items[:-1] if has_eos else items
    body = body[: max_tokens - 1]
    return body + [items[-1]] if has_eos else body


def truncate_caption(
    text: str, tokenize: Callable[[str], Sequence[int]] | None = None, max_tokens: int = MAX_TOKENS
) -> str:
    """Longest whole-word prefix of text that fits in max_tokens with </s>; tokenize returns ids without </s>."""
    # tokenize must not add special tokens, e.g. ``lambda s: tok.encode(s, add_special_tokens=False).ids``.
    # T5's SentencePiece never merges across spaces, so with a real tokenizer the result is OpenSora's token
    # prefix rounded down to a word boundary (OpenSora may keep the first pieces of the cut word). Without a
    # tokenizer the count is approx_token_count's estimate.
    if max_tokens < 2:
        raise ValueError(f"max_tokens must be >= 2 (text plus </s>), got {max_tokens}")
    count: Callable[[str], int] = (lambda s: len(tokenize(s))) if tokenize is not None else approx_token_count
    budget = max_tokens - 1
    if count(text) <= budget:
        return text
    words = text.split()
    lo, hi = 0, len(words)  # invariant: words[:lo] fits, words[:hi + 1] does not (or hi == len)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if count(" ".join(words[:mid])) <= budget:
            lo = mid
        else:
            hi = mid - 1
    return " ".join(words[:lo])
