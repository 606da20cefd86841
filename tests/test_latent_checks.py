"""The checks on every lookup's path stay exact when made cheaper: finite latents and the index's top-k."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from comfyui_chai.cache_store.errors import InvalidEntryError
from comfyui_chai.cache_store.index.backends import _top_k
from comfyui_chai.cache_store.validate import check_latents


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
@pytest.mark.parametrize("layout", ["contiguous", "transposed", "needs grad"])
def test_a_latent_with_a_non_finite_value_is_refused_whatever_its_dtype_and_layout(dtype, bad, layout):
    x = torch.zeros(1, 4, 3, 5, dtype=dtype)
    x[0, 2, 1, 3] = bad
    x = {"contiguous": x, "transposed": x.transpose(2, 3), "needs grad": x.clone().requires_grad_(True)}[layout]
    with pytest.raises(InvalidEntryError, match="NaN or infinity"):
        check_latents({"a": torch.ones_like(x), "b": x})
    fine = torch.full_like(x, 65504.0 if dtype == torch.float16 else 1e30)  # the largest values are finite
    assert check_latents({"a": fine, "b": fine.detach()}) == (tuple(x.shape), str(dtype).replace("torch.", ""))


def _top_k_reference(sims: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """The vectorised form the row-by-row path replaced for a prompt's few rows."""
    part = np.argpartition(-sims, k - 1, axis=1)[:, :k] if k < sims.shape[1] else \
        np.broadcast_to(np.arange(sims.shape[1]), sims.shape)
    vals = np.take_along_axis(sims, part, axis=1)
    order = np.argsort(-vals, axis=1, kind="stable")
    return np.take_along_axis(part, order, axis=1), np.take_along_axis(vals, order, axis=1)


@pytest.mark.parametrize("seed", range(5))
def test_top_k_row_by_row_gives_the_same_labels_and_order_as_the_vectorised_form(seed):
    rng = np.random.default_rng(seed)
    for _ in range(300):
        m, n = int(rng.integers(1, 24)), int(rng.integers(1, 400))
        k = int(rng.integers(1, n + 1))
        sims = rng.standard_normal((m, n)).astype(np.float32)
        if rng.random() < 0.5:
            sims = np.round(sims, 1)  # many ties: the order among them must not change either
        got, want = _top_k(sims, k), _top_k_reference(sims, k)
        assert np.array_equal(got[0], want[0]) and np.array_equal(got[1], want[1])
        assert (np.diff(got[1], axis=1) <= 0).all()
