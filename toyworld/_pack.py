"""Import a sibling package of the pack (opensora) the way a relative import would resolve it."""
from __future__ import annotations

import importlib
from types import ModuleType

# "<pack>." when ComfyUI imported the pack as a package, "" when toyworld is imported top-level (tests, scripts).
PACK_PREFIX = __name__[: -len("toyworld._pack")]


def sibling(module: str) -> ModuleType:
    """The pack's module `module` (e.g. "opensora.stdit3"), imported under the pack's own name."""
    return importlib.import_module(PACK_PREFIX + module)
