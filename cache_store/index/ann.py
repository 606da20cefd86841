"""Whether the approximate index library is installed: hnswlib is optional (the pack's `ann` extra).

Without it the entity index stays on exact numpy search at every size, which serves a desktop cache; with it an
index past the measured switch size moves to an hnswlib graph. The import is tried once per process.
"""
from __future__ import annotations

import logging

log = logging.getLogger(__name__)

INSTALL_HINT = "`pip install hnswlib` (the pack's `ann` extra; needs a C++ compiler where no wheel exists)"

_found: dict[str, bool] = {}
_told: set[str] = set()


def hnswlib_available() -> bool:
    """True when hnswlib imports in this process (checked once; `forget` checks again)."""
    if "hnswlib" not in _found:
        try:
            import hnswlib  # noqa: F401
        except ImportError:
            _found["hnswlib"] = False
        else:
            _found["hnswlib"] = True
    return _found["hnswlib"]


def forget() -> None:
    """Check for hnswlib again on the next call, and log the exact-search note again (tests)."""
    _found.clear()
    _told.clear()


def note_exact_only(count: int) -> None:
    """Log once per process that an index past the switch size stays on exact search, and why."""
    if "exact" in _told:
        return
    _told.add("exact")
    log.info("[CHAI] entity index: exact search over %d entities, because hnswlib is not installed (exact search "
             "serves a desktop cache; %s adds the approximate index for large caches)", count, INSTALL_HINT)


def require_hnswlib(what: str) -> None:
    """ValueError naming the fix when `what` asks for the hnsw backend and hnswlib is missing."""
    if not hnswlib_available():
        raise ValueError(f"{what} asks for the hnsw index backend, but hnswlib is not installed: install it with "
                         f"{INSTALL_HINT}, or use index backend 'auto' or 'exact'")
