"""Cache names and entry file names that can never point outside the cache root."""
from __future__ import annotations

import os
import re
from pathlib import Path

from .errors import CacheNameError

# fullmatch, not match with "$": "$" also matches before a trailing newline ("default\n")
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
_ENTRY_FILE = re.compile(r"[0-9a-f]{32}\.safetensors")


def validate_cache_name(name: str) -> str:
    """Return `name` if it is a safe single folder name, else raise CacheNameError."""
    if not isinstance(name, str) or not _NAME.fullmatch(name) or ".." in name:
        raise CacheNameError(
            f"invalid cache name {name!r}: use 1-64 letters, digits, '.', '_' or '-', "
            "starting with a letter or digit (no slashes, no '..')"
        )
    return name


def cache_dir(root: str | os.PathLike[str], name: str) -> Path:
    """Folder of cache `name` under `root`, guaranteed to stay inside `root`."""
    root_path = Path(root).expanduser().resolve()
    path = (root_path / validate_cache_name(name)).resolve()
    if path.parent != root_path:
        raise CacheNameError(f"cache name {name!r} resolves outside the cache root {root_path}")
    return path


def is_entry_file_name(name: str) -> bool:
    """True for the only file names the store ever writes for latents."""
    return isinstance(name, str) and bool(_ENTRY_FILE.fullmatch(name))


def encodable_text(text: str) -> str:
    """`text` unchanged if it encodes as UTF-8 and holds no NUL, else with each lone surrogate and each NUL
    replaced by U+FFFD (PostgreSQL refuses NUL in text: every backend stores the same replacement)."""
    try:
        text.encode("utf-8")
        if "\0" not in text:
            return text
    except UnicodeEncodeError:
        pass
    return "".join("\ufffd" if ch == "\0" or 0xD800 <= ord(ch) <= 0xDFFF else ch for ch in text)
