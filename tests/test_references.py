"""Docs, comments and docstrings name only files that exist: a reader who follows a path finds it."""
from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TOP = ("docs", "cache_store", "chai_attention", "nodes", "opensora", "toyworld", "lab", "bench", "scripts", "tests",
       "workflows")
PATH = re.compile(r"(?<![\w./-])((?:%s)/[\w./-]*\w\.(?:py|md|jsonl?|png|toml|sh|safetensors))(?!\w|\.\w)"
                  % "|".join(TOP))
SOURCES = ("nodes", "chai_attention", "cache_store", "opensora", "toyworld", "lab", "bench", "scripts", "docs")


def _texts() -> list[Path]:
    files = [p for d in SOURCES for p in (ROOT / d).rglob("*") if p.suffix in (".py", ".md")]
    return files + [ROOT / name for name in ("README.md", "CHANGELOG.md", "__init__.py", "install.py")]


def test_every_repository_path_named_in_code_and_docs_exists():
    missing = {}
    for path in _texts():
        for match in PATH.finditer(path.read_text(encoding="utf-8", errors="replace")):
            if not (ROOT / match.group(1)).exists():
                missing.setdefault(str(path.relative_to(ROOT)), set()).add(match.group(1))
    assert not missing, f"paths that do not exist: {missing}"


def test_no_reference_to_a_design_doc_the_repository_does_not_have():
    offenders = [str(p.relative_to(ROOT)) for p in _texts() if "DESIGN.md" in p.read_text(errors="replace")]
    assert not (ROOT / "DESIGN.md").exists() and not (ROOT / "docs" / "DESIGN.md").exists()
    assert offenders == []


def test_the_pattern_finds_a_missing_path():
    assert PATH.findall("see cache_store/no_such_module.py and docs/map.md.") == ["cache_store/no_such_module.py",
                                                                                  "docs/map.md"]
