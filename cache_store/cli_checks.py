"""What the CLI knows about its commands whatever the backend: which ones must not create a cache, and how text
from the cache reaches the terminal (without its control characters)."""
from __future__ import annotations

import unicodedata

READ_ONLY = ("stats", "list", "verify")  # a missing cache is an error, not created (opening would create it)
_BIDI = set(range(0x202A, 0x202F)) | set(range(0x2066, 0x206A))  # overrides that reorder what a terminal shows


def printable(text: str) -> str:
    """`text` with control characters (terminal escape sequences, bidi overrides) written as escapes."""
    out = []
    for ch in text:
        if unicodedata.category(ch) == "Cc" or ord(ch) in _BIDI:
            out.append(ch.encode("unicode_escape").decode("ascii"))
        else:
            out.append(ch)
    return "".join(out)
