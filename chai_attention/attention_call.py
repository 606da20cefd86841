"""One call of ComfyUI's attention function, bound to its parameter names, and the donor K/V a capture pass keeps.

Used by chai_attention.hooks; adapters see these types in `HookAdapter.splice_kv` and `check_donor`.
"""
from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

import torch
from torch import Tensor

AttentionFn = Callable[..., Tensor]
Override = Callable[..., Tensor]


@dataclass
class AttentionCall:
    """One call of ComfyUI's attention function: the function and its arguments bound to its parameter names.

    q, k and v are the function's first three parameters; `heads`, `mask` and `skip_reshape` keep ComfyUI's
    names. Layout: [B, L, heads * head_dim], or [B, heads, L, head_dim] with skip_reshape.
    """

    func: AttentionFn
    arguments: dict[str, Any]
    names: tuple[str, str, str]
    var_keyword: str | None = None

    @classmethod
    def bind(cls, func: AttentionFn, args: Sequence[Any], kwargs: Mapping[str, Any]) -> "AttentionCall":
        """Bind an override's (func, *args, **kwargs) to func's signature."""
        signature = inspect.signature(func)
        params = list(signature.parameters.values())
        positional = [p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        if len(positional) < 3:
            raise TypeError(f"attention function {getattr(func, '__name__', func)!r} does not take q, k, v first")
        var_kw = next((p.name for p in params if p.kind is p.VAR_KEYWORD), None)
        bound = signature.bind(*args, **kwargs)
        return cls(func, dict(bound.arguments), (positional[0], positional[1], positional[2]), var_kw)

    def _get(self, name: str, default: Any = None) -> Any:
        if name in self.arguments:
            return self.arguments[name]
        if self.var_keyword is not None:
            return self.arguments.get(self.var_keyword, {}).get(name, default)
        return default

    @property
    def q(self) -> Tensor:
        return self.arguments[self.names[0]]

    @property
    def k(self) -> Tensor:
        return self.arguments[self.names[1]]

    @property
    def v(self) -> Tensor:
        return self.arguments[self.names[2]]

    @property
    def mask(self) -> Tensor | None:
        return self._get("mask")

    @property
    def token_dim(self) -> int:
        """The token axis of q/k/v: 2 for [B, heads, L, d] (skip_reshape), else 1 for [B, L, heads * d]."""
        return 2 if self._get("skip_reshape", False) else 1

    def replace(self, **tensors: Tensor | None) -> "AttentionCall":
        """A copy with q, k, v (by those letters) or mask replaced."""
        arguments = dict(self.arguments)
        if self.var_keyword is not None and self.var_keyword in arguments:
            arguments[self.var_keyword] = dict(arguments[self.var_keyword])
        for key, value in tensors.items():
            if key in ("q", "k", "v"):
                arguments[self.names["qkv".index(key)]] = value
            elif key == "mask":
                if "mask" in arguments or self.var_keyword is None:
                    arguments["mask"] = value
                else:
                    arguments.setdefault(self.var_keyword, {})["mask"] = value
            else:
                raise KeyError(f"an attention call has no tensor {key!r} to replace")
        return AttentionCall(self.func, arguments, self.names, self.var_keyword)

    def rows(self, index: Tensor) -> "AttentionCall":
        """The call restricted to the batch rows `index` (a bool mask over dim 0); a batched mask follows."""
        batch = self.q.shape[0]
        changes: dict[str, Tensor | None] = {"q": self.q[index], "k": self.k[index], "v": self.v[index]}
        mask = self.mask
        if isinstance(mask, Tensor) and mask.dim() >= 3 and mask.shape[0] == batch and batch > 1:
            changes["mask"] = mask[index]
        return self.replace(**changes)

    def args_kwargs(self) -> tuple[list[Any], dict[str, Any]]:
        """Positional and keyword arguments that call func as bound."""
        signature = inspect.signature(self.func)
        bound = inspect.BoundArguments(signature, dict(self.arguments))
        return list(bound.args), dict(bound.kwargs)

    def run(self, through: Override | None = None) -> Tensor:
        """Attend: func(...) itself, or through an earlier override as ComfyUI would call it."""
        args, kwargs = self.args_kwargs()
        if through is not None:
            return through(self.func, *args, **kwargs)
        return self.func(*args, **kwargs)


@dataclass(frozen=True)
class DonorKV:
    """What the capture pass keeps: the donor's keys and values as the hooked call received them."""

    k: Tensor
    v: Tensor
    mask: Tensor | None
    token_dim: int
    block_args: Mapping[str, Any]  # the hooked block's arguments in the capture pass (e.g. its "pe")


def same_tensors(a: Any, b: Any) -> bool:
    """Equal tensors (or equal nesting of tuples/lists of tensors); anything else counts as equal (no evidence)."""
    if isinstance(a, Tensor) and isinstance(b, Tensor):
        return a.shape == b.shape and bool(torch.equal(a, b.to(device=a.device, dtype=a.dtype)))
    if isinstance(a, (tuple, list)) and isinstance(b, (tuple, list)):
        return len(a) == len(b) and all(same_tensors(x, y) for x, y in zip(a, b))
    return True
