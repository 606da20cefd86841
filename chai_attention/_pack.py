"""Import a sibling package of the pack (opensora, cache_store) the way a relative import would resolve it."""
from __future__ import annotations

import importlib
from types import ModuleType

# "<pack>." when ComfyUI imported the pack as a package, "" when chai_attention is imported top-level (tests, CLI).
PACK_PREFIX = __name__[: -len("chai_attention._pack")]


def sibling(module: str) -> ModuleType:
    """The pack's module `module` (e.g. "opensora.sampler"), imported under the pack's own name."""
    return importlib.import_module(PACK_PREFIX + module)
