"""Find and load the English spaCy pipeline used for entity extraction (one load per process and name)."""
from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from spacy.language import Language

ENV_VAR = "CHAI_SPACY_MODEL"
# Tried in this order when neither an explicit name nor the environment variable chooses one: md parses
# caption-style prompts better than sm, lg is as good as md but four times the size.
STANDARD_PIPELINES: tuple[str, ...] = ("en_core_web_md", "en_core_web_lg", "en_core_web_sm")
# Named entity recognition is not used; dropping it saves load time and a third of the per-prompt cost.
# The tagger, attribute_ruler and lemmatizer stay: the rule-based lemmatizer needs their POS tags.
EXCLUDED_COMPONENTS: tuple[str, ...] = ("ner",)
INSTALL_HINT = (
    "Install an English pipeline with\n"
    "    python -m pip install https://github.com/explosion/spacy-models/releases/download/"
    "en_core_web_sm-3.8.0/en_core_web_sm-3.8.0-py3-none-any.whl\n"
    "or  python -m spacy download en_core_web_sm\n"
    f"or point the environment variable {ENV_VAR} at an installed pipeline package name or at a pipeline "
    "directory (a folder holding config.cfg and meta.json)."
)

_cache: dict[str, "Language"] = {}
_lock = threading.Lock()


class PipelineNotFoundError(RuntimeError):
    """No usable spaCy pipeline could be loaded; the message says how to install or choose one."""


def _cache_key(spec: str) -> str:
    """Paths are keyed by their absolute form so './p' and '/abs/p' share one loaded pipeline."""
    expanded = os.path.expanduser(spec)
    return str(Path(expanded).resolve()) if os.path.isdir(expanded) else spec


def _load(spec: str) -> "Language":
    """Load one pipeline by package name or directory, from the process cache when already loaded."""
    key = _cache_key(spec)
    with _lock:
        nlp = _cache.get(key)
        if nlp is None:
            import spacy

            nlp = spacy.load(key, exclude=list(EXCLUDED_COMPONENTS))
            index_as_sets(nlp)
            _check_usable(nlp, spec)
            _cache[key] = nlp
    return nlp


def index_as_sets(nlp: "Language") -> None:
    """Make the rule lemmatizer's word lists sets. On every cache miss it asks whether a candidate form is in a
    list of up to 57,000 words; a frozenset of the same words gives the same answers without the scan."""
    try:
        table = nlp.get_pipe("lemmatizer").lookups.get_table("lemma_index")  # type: ignore[attr-defined]
    except (KeyError, ValueError, AttributeError):
        return  # no rule lemmatizer or no index table: nothing to speed up
    for key in list(table.keys()):
        if isinstance(table[key], list):
            table[key] = frozenset(table[key])


def _check_usable(nlp: "Language", spec: str) -> None:
    """Entity extraction needs part-of-speech tags; a blank or NER-only pipeline cannot provide them."""
    doc = nlp("a dog runs on the beach")
    if not doc.has_annotation("POS"):
        raise PipelineNotFoundError(
            f"spaCy pipeline {spec!r} loaded but assigns no part-of-speech tags (components: "
            f"{nlp.pipe_names}); entity extraction needs a trained English pipeline with a tagger and parser.\n"
            + INSTALL_HINT
        )


def resolve_pipeline(override: str | None = None) -> tuple[str, "Language"]:
    """Return (name or path, loaded pipeline): the override, else $CHAI_SPACY_MODEL, else the standard names."""
    explicit = [(override, "the pipeline argument"), (os.environ.get(ENV_VAR), f"${ENV_VAR}")]
    for spec, origin in explicit:
        if spec is not None and spec.strip():
            # A pipeline the user chose explicitly never falls back silently to another one.
            spec = spec.strip()
            try:
                return spec, _load(spec)
            except PipelineNotFoundError:
                raise
            except (OSError, ImportError, ValueError) as exc:
                raise PipelineNotFoundError(
                    f"spaCy pipeline {spec!r} (from {origin}) could not be loaded: {exc}\n" + INSTALL_HINT
                ) from exc
    failures: list[str] = []
    for name in STANDARD_PIPELINES:
        try:
            return name, _load(name)
        except PipelineNotFoundError as exc:
            failures.append(f"{name}: {str(exc).splitlines()[0]}")
        except (OSError, ImportError, ValueError) as exc:
            failures.append(f"{name}: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}")
    raise PipelineNotFoundError(
        "No English spaCy pipeline found for CHAI entity extraction (tried "
        + ", ".join(STANDARD_PIPELINES) + f"; {ENV_VAR} is not set).\n"
        + INSTALL_HINT + "\nDetails:\n  " + "\n  ".join(failures)
    )


def load_pipeline(override: str | None = None) -> "Language":
    """Load (once per process) the spaCy pipeline chosen by `resolve_pipeline`."""
    return resolve_pipeline(override)[1]
