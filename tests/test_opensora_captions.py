"""OpenSora caption handling: cleaning, score suffixes, 300-token truncation."""

import os
from pathlib import Path

import pytest

from comfyui_chai.opensora.captions import (
    MAX_TOKENS,
    append_scores,
    approx_token_count,
    clean_caption,
    clean_caption_once,
    fix_text,
    prepare_caption,
    strip_html,
    truncate_caption,
    truncate_tokens,
)

# Expected outputs were produced by running OpenSora v1.2's own text_preprocessing (ftfy 6.3.1,
# beautifulsoup4 4.15.0) on these inputs (the fix_text cases: ftfy.fix_text 6.3.1). Quirks such as
# "epsilon" -> "ilon" are upstream behaviour.
UPSTREAM_CASES = [
    ("In a still frame, a stop sign", "in a still frame, a stop sign"),
    (
        "A bustling city street at night, headlights (and) the ambient light",
        "a bustling city street at night, headlights and the ambient light",
    ),
    ("Visit https://example.com/path?x=1 for more &amp; more!!", "visit ?x=1 for more more!!"),
    ("A <b>bold</b> cat &lt;3 &quot;hello&quot; &#39;quoted&#39;", "a bold cat <3 \"hello\" 'quoted"),
    (
        "“Curly quotes” and ‘single’ — dashes – and … ellipsis",
        "\"curly quotes\" and 'single' - dashes - and … ellipsis",
    ),
    ("emoji 🐱🔥 cat   with   spaces\n\nnewlines\ttabs", "emoji 🐱🔥 cat with spaces newlines tabs"),
    (  # CJK ideographs go, kana and hangul stay
        "中文 prompt: 一只猫 sitting on a mat, ひらがな カタカナ 한국어",
        "prompt: sitting on a mat, ひらがな カタカナ 한국어",
    ),
    ("Ｆｕｌｌｗｉｄｔｈ text ＡＢＣ １２３", "fullwidth text abc 123"),
    ("ﬁne ligature ﬂower", "fine ligature flower"),
    (
        "@user check #123 and #tag (parens) [brackets] {braces} a|b back\\slash a/b *stars*",
        "check and tag parens brackets braces a b back slash a b stars",
    ),
    (
        "file image.png and photo.JPG, model jc6640 and 1920x1080 resolution",
        "file and , model and resolution",
    ),
    ("free shipping worldwide, download free, click for details, page 12", "worldwide, ,"),
    ("this-is-my-cute-cat_with_underscores", "this is my cute cat with underscores"),
    ("'quoted whole prompt'", "quoted whole prompt"),
    ("- leading dash, trailing colon:", "leading dash, trailing colon"),
    ("ip 192.168.0.1 and 123456789 numbers", "ip and numbers"),
    ("a+b%20c%2Fd 100% sure", "a b c d 100% sure"),
    ("Epsilon pdfs", "ilon s"),
    ("A cat.A dog,a bird/a fish", "a cat. a dog, a bird a fish"),
    ("<person> walks <script>alert(1)</script> <!-- comment --> away", "person walks away"),
    ("x < y and y > z, <3 hearts", "x < y and y > z, <3 hearts"),
    ("© ® ™ • · º ½ ¾ ¿ ¡ § ~ test", "test"),
    ("&amp;amp; double escaped &amp;lt;b&amp;gt;", "double escaped lt;b gt;"),
    ("A man in a ‘70s-style suit — smiling.", "a man in a '70s-style suit - smiling."),
    ("....dots.... and ...", "dots and"),
    ("a stop sign aesthetic score: 6.5.", "a stop sign aesthetic score: 6.5."),
    (
        "A Cat, aesthetic score: 6.5. motion score: 5.0. camera motion: pan left.",
        "a cat, aesthetic score: 6.5. motion score: 5.0. camera motion: pan left.",
    ),
    ("y&y", "yy"),
    ("word &za; end", "word za end"),
]


@pytest.mark.parametrize("raw, want", UPSTREAM_CASES)
def test_clean_caption_matches_upstream(raw, want):
    assert clean_caption(raw) == want


def test_cleaning_runs_twice():
    # Upstream: one pass turns "%2B" into "+", the second turns that "+" into a space (unquote_plus).
    assert clean_caption_once("a%2Bb") == "a+b"
    assert clean_caption("a%2Bb") == "a b"
    assert clean_caption("%2525 a") == "% a"


@pytest.mark.parametrize(
    "junk", ["", "   ", "<![#“#b>c\"&", "&#0;&#xd800;&#1114112;", "<<<>>>", "\x1b[31mred\x1b[0m", "\ud83d\udc31", "&"]
)
def test_cleaning_never_raises(junk):
    out = clean_caption(junk)
    assert isinstance(out, str) and out == out.strip()


def test_fix_text_pieces():
    assert fix_text("\x1b[31mred\x1b[0m") == "red"
    assert fix_text("\x93hi\x94") == "\"hi\""  # C1 controls read as Windows-1252, then uncurled
    assert fix_text("ǆ ﬃ") == "dž ffi"
    assert fix_text("a\u3000b\uff21") == "a bA"
    assert fix_text("\u201elow\u201f \u02bcx") == "\"low\" 'x"
    assert fix_text("e\u0301") == "é"  # NFC
    assert fix_text("a\x00b\ufeffc\r\nd") == "abc\nd"
    assert fix_text("\ud83d\udc31") == "🐱"


def test_strip_html():
    assert strip_html("<p>a <i>b</i></p><style>p{}</style>c") == "a bc"
    assert strip_html("&copy; &#150; &#x41;") == "© – A"
    assert strip_html("<![broken") == "<![broken"


def test_aesthetic_suffix():
    assert append_scores("a stop sign") == "a stop sign aesthetic score: 6.5."
    assert append_scores("a stop sign", aesthetic_score=7) == "a stop sign aesthetic score: 7.0."
    assert append_scores("a stop sign", aesthetic_score=None) == "a stop sign"
    assert append_scores("x aesthetic score: 5.0.") == "x aesthetic score: 5.0."  # not appended twice
    both = append_scores("a cat", 6.5, motion_score=5, camera_motion="pan right")
    assert both == "a cat aesthetic score: 6.5. motion score: 5.0. camera motion: pan right."


def test_prepare_caption_appends_then_cleans():
    assert prepare_caption("A Stop Sign") == "a stop sign aesthetic score: 6.5."
    assert prepare_caption("A cat (cute)", aesthetic_score=None) == "a cat cute"
    assert prepare_caption("  A cat (cute) ", aesthetic_score=None, clean=False) == "a cat (cute)"
    # suffix after a trailing comma: cleaning sees the whole string
    assert prepare_caption("a cat,") == "a cat, aesthetic score: 6.5."


# ---- truncation -------------------------------------------------------------------------------------------


def test_truncate_tokens_keeps_eos():
    ids = list(range(2, 402)) + [1]
    out = truncate_tokens(ids)
    assert len(out) == MAX_TOKENS and out[-1] == 1 and out[:-1] == ids[:299]
    assert truncate_tokens([5, 6, 1]) == [5, 6, 1]
    assert truncate_tokens(list(range(2, 402))) == list(range(2, 301))  # no </s>: room left for it
    pairs = [(i, 1.0) for i in range(2, 402)] + [(1, 1.0)]
    cut = truncate_tokens(pairs, key=lambda p: p[0])
    assert len(cut) == MAX_TOKENS and cut[-1] == (1, 1.0)
    assert truncate_tokens([7, 8, 9, 1], max_tokens=3) == [7, 8, 1]
    with pytest.raises(ValueError):
        truncate_tokens([1], max_tokens=1)


def _char_tokens(text: str) -> list[int]:
    return [ord(c) for c in text if not c.isspace()]


def test_truncate_caption_with_tokenizer_is_maximal():
    words = [f"w{i:03d}" for i in range(200)]  # 4 tokens per word under _char_tokens
    text = " ".join(words)
    out = truncate_caption(text, _char_tokens, max_tokens=50)
    assert len(_char_tokens(out)) <= 49
    n = len(out.split())
    assert out.split() == words[:n]
    assert len(_char_tokens(" ".join(words[: n + 1]))) > 49
    assert truncate_caption("short text", _char_tokens) == "short text"


def test_truncate_caption_approximate_fallback():
    text = " ".join(["panoramic"] * 400)
    out = truncate_caption(text)
    assert approx_token_count(out) <= MAX_TOKENS - 1
    assert approx_token_count(out + " panoramic") > MAX_TOKENS - 1
    assert truncate_caption("a cat") == "a cat"


def test_approx_token_count():
    assert approx_token_count("") == 0
    assert approx_token_count("a") == 2  # "▁" + "a" in T5
    assert approx_token_count("stop sign") == 2
    assert approx_token_count("score: 6.5.") == 6
    assert approx_token_count("antidisestablishmentarianism") > 3


def _t5_tokenizer_path() -> Path | None:
    root = os.environ.get("COMFYUI_DIR")
    if not root:
        return None
    path = Path(root) / "comfy" / "text_encoders" / "t5_tokenizer" / "tokenizer.json"
    return path if path.is_file() else None


def test_truncation_with_real_t5_tokenizer():
    path = _t5_tokenizer_path()
    if path is None:
        pytest.skip("COMFYUI_DIR unset or without comfy/text_encoders/t5_tokenizer/tokenizer.json")
    tokenizers = pytest.importorskip("tokenizers")
    tok = tokenizers.Tokenizer.from_file(str(path))
    assert tok.encode("a stop sign").ids == [3, 9, 1190, 1320, 1]

    def ids(s: str) -> list[int]:
        return tok.encode(s, add_special_tokens=False).ids

    text = prepare_caption(" ".join(["a golden retriever runs across a sunlit meadow"] * 60))
    full = ids(text)
    assert len(full) > 299
    out = truncate_caption(text, ids)
    cut = ids(out)
    assert 290 <= len(cut) <= 299 and cut == full[: len(cut)]
    assert truncate_tokens(tok.encode(text).ids) == full[:299] + [1]
