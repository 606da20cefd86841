"""The store's wings: no import circle inside cache_store, and the shared parts name no backend."""
from __future__ import annotations

import pytest

grimp = pytest.importorskip("grimp")  # installed with import-linter

PKG = "comfyui_chai.cache_store"
BACKENDS = (f"{PKG}.folder", f"{PKG}.postgres")
SHARED = (f"{PKG}.entities", f"{PKG}.index", f"{PKG}.lookup", f"{PKG}.backend", f"{PKG}.types",
          f"{PKG}.validate", f"{PKG}.prepare", f"{PKG}.latents", f"{PKG}.naming", f"{PKG}.errors", f"{PKG}.config",
          f"{PKG}.regular_files", f"{PKG}.cli_checks")


@pytest.fixture(scope="module")
def graph():
    return grimp.build_graph("comfyui_chai")


def circles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The import circles (strongly connected groups of two or more modules) of a module graph."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = stack[stack.index(v):]
            del stack[stack.index(v):]
            if len(group) > 1:
                found.append(sorted(group))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def test_the_circle_finder_finds_a_circle():
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert circles({"a": {"b"}, "b": set()}) == []


def test_no_module_of_cache_store_imports_one_that_imports_it_back(graph):
    mods = {m for m in graph.modules if m.startswith(PKG)}
    edges = {m: {i for i in graph.find_modules_directly_imported_by(m) if i in mods} for m in mods}
    assert circles(edges) == []


@pytest.mark.parametrize("shared", SHARED)
def test_the_shared_parts_import_no_backend(graph, shared):
    for backend in BACKENDS:
        assert not graph.chain_exists(shared, backend, as_packages=True), f"{shared} reaches {backend}"
