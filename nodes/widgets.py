"""Widget helpers shared by the CHAI nodes."""
from __future__ import annotations

from typing import Any

from comfy_api.v0_0_2 import io


class ComboOptions(list):
    """A combo's option list used as its input type: a list, and hashable.

    v0.3.64 validates a value against an input type that is a list; newer ComfyUI (read, not run; see
    docs/comfyui-compat.md) looks every V3 input type up in a dict while it gathers a node's inputs, and a plain list
    cannot be looked up.
    """

    def __hash__(self) -> int:  # type: ignore[override]
        return hash(tuple(self))


class ListedCombo(io.Combo.Input):
    """A V3 combo that ComfyUI validates against its options, as it does V1 combos.

    This ComfyUI checks a combo value against its options only when the input's type is the option list (the V1
    form); a V3 combo's type is "COMBO", so a typed or stale value (an old workflow, an API prompt, e.g. policy
    'fifo') would pass validation and fail at run time. Typing the input with its options makes ComfyUI report
    "Value not in list" on that input alone, before anything runs. The frontend reads either form as a dropdown.
    """

    def get_io_type(self) -> Any:
        return ComboOptions(self.options)


def combo(id: str, options: list, **kwargs: Any) -> ListedCombo:
    """A dropdown input whose value ComfyUI checks against `options` at validation time."""
    return ListedCombo(id, options=list(options), **kwargs)
