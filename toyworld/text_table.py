"""Plain-text output shared by the demo and the benchmarks: aligned tables and shortened prompts."""
from __future__ import annotations

from typing import Sequence


def shorten(text: str, width: int) -> str:
    """Cut text to `width` characters with an ellipsis."""
    return text if len(text) <= width else text[: max(width - 1, 0)] + "\u2026"


def table(headers: Sequence[str], rows: Sequence[Sequence[object]], aligns: str | None = None) -> str:
    """A plain-text table; `aligns` has one 'l' or 'r' per column (default: first left, rest right)."""
    cells = [[str(h) for h in headers]] + [[str(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    aligns = aligns or "l" + "r" * (len(headers) - 1)

    def fmt(row: list[str]) -> str:
        return "  ".join(c.ljust(w) if a == "l" else c.rjust(w) for c, w, a in zip(row, widths, aligns)).rstrip()

    lines = [fmt(cells[0]), "  ".join("-" * w for w in widths)]
    lines += [fmt(r) for r in cells[1:]]
    return "\n".join(lines)
