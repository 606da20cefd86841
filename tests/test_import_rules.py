"""Import rules every tool can check: relative imports inside the pack, no run-time imports of our own modules,
one name for the pack in tests, benches, scripts and the lab, the pack never reaching the dev folders (lab/,
bench/, ...), and files of a readable size. The package-level arrows (nothing imports nodes, cache_store imports
no model code, ComfyUI only in glue modules, nothing imports the lab) are import-linter contracts in
pyproject.toml, run by .ci/run."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("cache_store", "chai_attention", "nodes", "opensora", "toyworld")
# Dev folders beside the pack: imported by their own top-level names, never by the pack.
DEV_DIRS = ("lab", "bench", "scripts", "tests")
MAX_LINES = 500
# Run-time imports by name that are not the pack's own modules, and why.
DYNAMIC_ALLOWED = {
    "cache_store/entities/embedders/minilm.py": "locates an installed weights package by its distribution name",
}


def pack_files() -> list[Path]:
    """Every Python file of the pack ComfyUI imports (install.py is a script Manager runs from the pack folder)."""
    return sorted([REPO / "__init__.py"] + [p for pkg in PACKAGES for p in (REPO / pkg).rglob("*.py")])


def dev_files() -> list[Path]:
    """Tests, benchmarks, scripts and the lab: they import the pack as `comfyui_chai`."""
    return sorted(p for d in DEV_DIRS for p in (REPO / d).rglob("*.py"))


def lab_files() -> list[Path]:
    """The toy world's research code (lab/): a dev package beside bench/."""
    return sorted((REPO / "lab").rglob("*.py"))


def rel(path: Path) -> str:
    return path.relative_to(REPO).as_posix()


def imported_modules(tree: ast.AST) -> list[tuple[int, str, int]]:
    """(line, module, level) of every import statement, at any depth (lazy imports included)."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name, 0) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            found.append((node.lineno, node.module or "", node.level))
    return found


def resolved_imports(path: Path, tree: ast.AST) -> list[tuple[int, str]]:
    """(line, dotted name from the repository root) of every import, relative ones resolved against `path`."""
    package = path.relative_to(REPO).parent.parts
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = list(package[:len(package) - node.level + 1]) if node.level else []
            stem = ".".join(base + ([node.module] if node.module else []))
            found += [(node.lineno, f"{stem}.{alias.name}" if stem else alias.name) for alias in node.names]
    return found


def reaches_dev_folder(name: str) -> bool:
    """True for an import of a dev folder: `lab`, `lab.x`, `comfyui_chai.lab.x`, `bench.x`, ..."""
    parts = name.split(".")
    parts = parts[1:] if parts[0] == "comfyui_chai" else parts
    return bool(parts) and parts[0] in DEV_DIRS


def dynamic_imports(tree: ast.AST) -> list[int]:
    """Lines that call importlib.import_module, __import__ or importlib.util.spec_from_file_location."""
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            f = node.func
            name = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""
            if name in ("import_module", "__import__", "spec_from_file_location"):
                lines.append(node.lineno)
    return lines


@pytest.mark.parametrize("path", pack_files(), ids=rel)
def test_pack_code_imports_its_own_modules_relatively_and_statically(path):
    tree = ast.parse(path.read_text(encoding="utf-8"))
    absolute = [(line, mod) for line, mod, level in imported_modules(tree)
                if level == 0 and mod.split(".")[0] in PACKAGES + ("comfyui_chai",)]
    # A bare `nodes` is ComfyUI's own module; the pack's `nodes` package is always reached relatively.
    absolute = [(line, mod) for line, mod in absolute if mod.split(".")[0] != "nodes" or "." in mod]
    assert not absolute, f"{rel(path)}: absolute imports of the pack's own modules {absolute}; use relative imports"
    if rel(path) not in DYNAMIC_ALLOWED:
        assert not dynamic_imports(tree), f"{rel(path)}: run-time imports at lines {dynamic_imports(tree)}"


@pytest.mark.parametrize("path", dev_files(), ids=rel)
def test_tests_benches_and_scripts_import_the_pack_as_comfyui_chai(path):
    tree = ast.parse(path.read_text(encoding="utf-8"))
    top_level = [(line, mod) for line, mod, level in imported_modules(tree)
                 if level == 0 and mod.split(".")[0] in ("cache_store", "chai_attention", "opensora", "toyworld")]
    assert not top_level, (f"{rel(path)}: imports {top_level} as top-level packages; import them as "
                           "comfyui_chai.<package> so that each module exists once")


@pytest.mark.parametrize("path", pack_files(), ids=rel)
def test_the_pack_never_imports_the_lab_or_other_dev_folders(path):
    tree = ast.parse(path.read_text(encoding="utf-8"))
    dev = [(line, name) for line, name in resolved_imports(path, tree) if reaches_dev_folder(name)]
    assert not dev, f"{rel(path)}: the pack imports dev code {dev}; the runtime must not need lab/ or bench/"


@pytest.mark.parametrize("path", lab_files(), ids=rel)
def test_lab_imports_the_pack_as_comfyui_chai_and_itself_as_lab(path):
    tree = ast.parse(path.read_text(encoding="utf-8"))
    relative = [(line, "." * level + mod) for line, mod, level in imported_modules(tree) if level]
    assert not relative, f"{rel(path)}: relative imports {relative}; import the lab as `lab.<module>`"
    other = [(line, mod) for line, mod, _ in imported_modules(tree)
             if mod.split(".")[0] in ("bench", "nodes") or mod.startswith("comfyui_chai.nodes")]
    assert not other, f"{rel(path)}: the lab imports {other}; it builds on the core packages only"


@pytest.mark.parametrize("path", dev_files(), ids=rel)
def test_dev_code_imports_the_lab_by_one_name(path):
    tree = ast.parse(path.read_text(encoding="utf-8"))
    aliased = [(line, mod) for line, mod, level in imported_modules(tree)
               if level == 0 and mod.startswith("comfyui_chai.") and reaches_dev_folder(mod)]
    assert not aliased, f"{rel(path)}: imports {aliased}; import dev folders by their own names (`lab.<module>`)"


def test_no_pack_or_lab_file_is_over_the_size_limit():
    files = pack_files() + lab_files()
    long = {rel(p): n for p in files if (n := len(p.read_text(encoding="utf-8").splitlines())) > MAX_LINES}
    assert not long, f"files over {MAX_LINES} lines (split them by responsibility): {long}"


def test_the_checker_sees_relative_lazy_and_dynamic_imports():
    tree = ast.parse("def f():\n    from ..opensora import stdit3\n    import importlib\n"
                     "    importlib.import_module('x')\n")
    assert (2, "opensora", 2) in imported_modules(tree)
    assert dynamic_imports(tree) == [4]


def test_the_checker_resolves_relative_imports_that_reach_the_lab():
    tree = ast.parse("from ..lab import lab\nfrom .. import bench\nfrom .model import x\nimport lab.train\n")
    names = resolved_imports(REPO / "toyworld" / "world.py", tree)
    assert names == [(1, "lab.lab"), (2, "bench"), (3, "toyworld.model.x"), (4, "lab.train")]
    assert [reaches_dev_folder(n) for _, n in names] == [True, True, False, True]
    assert reaches_dev_folder("comfyui_chai.lab.quality") and not reaches_dev_folder("comfyui_chai.toyworld.model")
