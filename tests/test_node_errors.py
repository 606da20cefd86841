"""Node error messages: expected failures become one clear ChaiNodeError, anything else passes through.

The pack is imported the way ComfyUI imports it (a package named after its folder), so the check that an
exception comes from the pack's own modules is exercised with the module names ComfyUI produces.
"""
from __future__ import annotations

import importlib
import importlib.util
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACK = "chai_pack_under_test"


@pytest.fixture(scope="module")
def pack():
    """The repo imported as package PACK (no ComfyUI needed: nodes.errors and cache_store are comfy-free)."""
    if PACK not in sys.modules:
        spec = importlib.util.spec_from_file_location(PACK, REPO / "__init__.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[PACK] = module
        spec.loader.exec_module(module)
    return importlib.import_module(f"{PACK}.nodes.errors")


def test_missing_known_package_names_the_pip_command(pack):
    err = pack.missing_dependency(ImportError("No module named 'hnswlib'", name="hnswlib"), "CHAI Cache")
    assert isinstance(err, pack.ChaiNodeError)
    assert str(err).startswith("CHAI Cache: the Python package 'hnswlib' is not installed")
    assert "python -m pip install hnswlib" in str(err)


def test_missing_unknown_package_points_at_the_requirements_file(pack):
    err = pack.missing_dependency(ImportError("No module named 'weird.sub'", name="weird.sub"), "CHAI Cache")
    assert "'weird'" in str(err) and "requirements.txt" in str(err)


def test_import_error_inside_a_node_becomes_an_install_hint(pack):
    with pytest.raises(pack.ChaiNodeError, match=r"pip install 'spacy>=3.8,<3.9'") as info:
        with pack.user_errors("CHAI Entity Extract"):
            raise ModuleNotFoundError("No module named 'spacy'", name="spacy")
    assert isinstance(info.value.__cause__, ModuleNotFoundError)


def test_pack_cache_errors_are_wrapped_with_the_node_name(pack):
    errors = importlib.import_module(f"{PACK}.cache_store.errors")
    with pytest.raises(pack.ChaiNodeError, match=r"^CHAI Cache: budget too small$"):
        with pack.user_errors("CHAI Cache"):
            raise errors.EntryTooLargeError("budget too small")  # a RuntimeError subclass of the pack


def test_invalid_name_from_the_store_reads_clearly(pack):
    naming = importlib.import_module(f"{PACK}.cache_store.naming")
    with pytest.raises(pack.ChaiNodeError, match=r"^CHAI Cache: invalid cache name '\.\./evil'"):
        with pack.user_errors("CHAI Cache"):
            naming.cache_dir("/nonexistent-root", "../evil")


def test_foreign_runtime_errors_pass_through_untouched(pack):
    class Interrupted(Exception):
        pass

    with pytest.raises(Interrupted):
        with pack.user_errors("CHAI Cache"):
            raise Interrupted()
    with pytest.raises(RuntimeError, match="CUDA out of memory") as info:
        with pack.user_errors("CHAI Sampler"):
            raise RuntimeError("CUDA out of memory")
    assert not isinstance(info.value, pack.ChaiNodeError)
