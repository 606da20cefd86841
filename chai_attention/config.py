"""CHAI sampling options: full/fast step counts, cache steps, K/V mode, CFG half and donor mapping."""
from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any, Mapping, Sequence

from .constants import (APPLY_TO, CACHE_ATTENTION, DEFAULT_CACHE_STEPS, DEFAULT_RESTART_SIGMA, DONOR_MAPPINGS,
                        KV_MODES, REUSE_MODES)


def parse_cache_steps(value: str | int | Sequence[int] | None) -> tuple[int, ...]:
    """1-based step numbers from "2,3,4", "2 3 4", an int or a sequence; sorted, duplicates dropped."""
    if value is None:
        return ()
    if isinstance(value, bool):
        raise ValueError(f"cache steps must be step numbers, got {value!r}")
    if isinstance(value, int):
        items: list[Any] = [value]
    elif isinstance(value, str):
        text = value.strip()
        if text.lower() in ("", "none", "off"):
            return ()
        items = [part for part in text.replace(",", " ").replace(";", " ").split() if part]
    else:
        items = list(value)
    steps = []
    for item in items:
        try:
            if isinstance(item, bool) or (isinstance(item, float) and not item.is_integer()):
                raise ValueError
            step = int(item)
        except (TypeError, ValueError):
            raise ValueError(f"cache steps must be whole step numbers counted from 1 (like '2,3,4'); "
                             f"got {item!r} in {value!r}") from None
        if step < 1:
            raise ValueError(f"cache steps are counted from 1; got {step} in {value!r}")
        steps.append(step)
    return tuple(sorted(set(steps)))


def check_cache_steps(value: str | int | Sequence[int] | None, fast_steps: int) -> tuple[int, ...]:
    """Parsed cache steps that all lie within the fast schedule; ValueError otherwise."""
    steps = parse_cache_steps(value)
    late = [s for s in steps if s > fast_steps]
    if late:
        raise ValueError(f"cache steps {late} lie beyond the {fast_steps} fast steps; choose steps in "
                         f"1..{fast_steps} (the default 5,6 is for 8 fast steps; the paper uses 2,3,4 of 8)")
    return steps


def _positive_int(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"ChaiConfig.{name} must be a positive whole number, got {value!r}")
    return value


def _choice(name: str, value: Any, choices: tuple[str, ...]) -> str:
    if value not in choices:
        raise ValueError(f"ChaiConfig.{name} must be one of {', '.join(choices)}; got {value!r}")
    return value


@dataclass(frozen=True)
class ChaiConfig:
    """How a CHAI run samples: full_steps on a miss; on a hit fast_steps, reusing the donor per `reuse`: a restart
    from its latent at restart_sigma, Cache Attention at cache_steps, or both (the dataclass keeps the paper's
    Cache Attention as its default; the nodes default to a restart)."""

    full_steps: int = 30
    fast_steps: int = 8
    cache_steps: tuple[int, ...] = DEFAULT_CACHE_STEPS  # 1-based steps of the fast schedule; "5,6" is parsed
    kv_mode: str = "replace"  # "replace": donor K/V only (the paper); "concat": own tokens plus donor tokens
    apply_to: str = "cond"  # "cond": only the conditional CFG half attends to the donor; "both": both halves
    donor_mapping: str = "matched_sigma"  # which donor latent serves a cache step (see steps.py)
    reuse: str = CACHE_ATTENTION  # "restart", "cache_attention" or "both" (restart.py)
    restart_sigma: float = DEFAULT_RESTART_SIGMA  # the noise level a restart starts at (a miss stores its latent there)

    def __post_init__(self) -> None:
        _positive_int("full_steps", self.full_steps)
        _positive_int("fast_steps", self.fast_steps)
        object.__setattr__(self, "cache_steps", check_cache_steps(self.cache_steps, self.fast_steps))
        _choice("kv_mode", self.kv_mode, KV_MODES)
        _choice("apply_to", self.apply_to, APPLY_TO)
        _choice("donor_mapping", self.donor_mapping, DONOR_MAPPINGS)
        _choice("reuse", self.reuse, REUSE_MODES)
        sigma = self.restart_sigma
        if isinstance(sigma, bool) or not isinstance(sigma, (int, float)) or not 0.0 < float(sigma) < 1.0:
            raise ValueError(f"ChaiConfig.restart_sigma must be a noise level between 0 and 1 (0.8 is the lab's "
                             f"default), got {sigma!r}")
        object.__setattr__(self, "restart_sigma", float(sigma))

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict of the fields."""
        out = asdict(self)
        out["cache_steps"] = list(self.cache_steps)
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "ChaiConfig":
        """Build from a dict such as `to_dict()` wrote; unknown fields are an error."""
        unknown = sorted(set(data) - {f.name for f in fields(cls)})
        if unknown:
            raise ValueError(f"unknown ChaiConfig fields: {unknown}")
        return cls(**dict(data))
