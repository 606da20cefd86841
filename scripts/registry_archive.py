"""What the Comfy Registry archive of this pack holds: the file list `comfy node pack` / `comfy node publish` zip.

comfy-cli archives the git-tracked files, leaves out those a `.comfyignore` pattern matches (gitignore syntax,
blank and `#` lines skipped) and force-includes every `[tool.comfy] includes` path. This reproduces that list
without comfy-cli, and measures it with and without `.comfyignore`:

    python scripts/registry_archive.py            # counts and sizes, before and after .comfyignore
    python scripts/registry_archive.py --list     # the archive's files, one a line

The patterns are matched by `pathspec` (comfy-cli's matcher) when it is installed, else by `simple_match`, which
handles the subset `.comfyignore` keeps to (anchored paths, `*` / `?` inside a segment, `!` to re-include).
"""
from __future__ import annotations

import argparse
import fnmatch
import io
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
IGNORE_FILE = ".comfyignore"


def read_patterns(repo: Path = REPO) -> list[str]:
    """The .comfyignore patterns as comfy-cli reads them: stripped lines, blanks and comments skipped."""
    path = repo / IGNORE_FILE
    if not path.exists():
        return []
    lines = (line.strip() for line in path.read_text(encoding="utf-8").splitlines())
    return [line for line in lines if line and not line.startswith("#")]


def is_simple(pattern: str) -> bool:
    """Whether a pattern is in the subset `simple_match` handles exactly: '/a/b/' or '/a/*.x', maybe '!'-led."""
    body = pattern[1:] if pattern.startswith("!") else pattern
    return body.startswith("/") and len(body) > 1 and not any(c in body for c in "[]\\") and "**" not in body


def simple_match(patterns: list[str], path: str) -> bool:
    """Whether the last pattern matching `path` (a repo-relative file path) excludes it (gitignore order)."""
    parts = path.split("/")
    ignored = False
    for pattern in patterns:
        negate = pattern.startswith("!")
        body = pattern[1:] if negate else pattern
        directory = body.endswith("/")
        segments = body.strip("/").split("/")
        # A pattern names a file or a directory above it; a directory pattern ('/a/') only a directory.
        depth_ok = len(parts) > len(segments) if directory else len(parts) >= len(segments)
        if depth_ok and all(fnmatch.fnmatchcase(p, s) for p, s in zip(parts, segments)):
            ignored = not negate
    return ignored


def matcher(patterns: list[str], use_pathspec: bool = True):
    """path -> excluded?, by pathspec's gitwildmatch when installed (and asked for), else `simple_match`."""
    if use_pathspec:
        try:
            from pathspec import PathSpec
        except ImportError:
            pass
        else:
            spec = PathSpec.from_lines("gitwildmatch", patterns)
            return spec.match_file
    bad = [p for p in patterns if not is_simple(p)]
    if bad:
        raise ValueError(f"install pathspec to match these {IGNORE_FILE} patterns: {bad}")
    return lambda path: simple_match(patterns, path)


def tracked_files(repo: Path = REPO) -> list[str]:
    """`git ls-files` of the checkout (what comfy-cli starts from)."""
    out = subprocess.run(["git", "-C", str(repo), "ls-files"], capture_output=True, text=True, check=True).stdout
    return [line for line in out.splitlines() if line.strip()]


def includes(repo: Path = REPO) -> list[str]:
    """[tool.comfy] includes of pyproject.toml: paths archived whatever .comfyignore says."""
    data = tomllib.loads((repo / "pyproject.toml").read_text(encoding="utf-8"))
    return [p.strip("/") for p in data.get("tool", {}).get("comfy", {}).get("includes", []) if p.strip("/")]


def archive_files(repo: Path = REPO, patterns: list[str] | None = None, use_pathspec: bool = True) -> list[str]:
    """The files the Registry archive holds: tracked, not ignored (unless force-included), present on disk."""
    patterns = read_patterns(repo) if patterns is None else patterns
    excluded = matcher(patterns, use_pathspec) if patterns else (lambda path: False)
    forced = includes(repo)
    keep = []
    for path in tracked_files(repo):
        force = any(path == p or path.startswith(p + "/") for p in forced)
        if (force or not excluded(path)) and (repo / path).is_file():
            keep.append(path)
    return keep


def measure(repo: Path, files: list[str]) -> tuple[int, int, int]:
    """(files, bytes on disk, bytes of the deflated zip comfy-cli would write)."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        for path in files:
            archive.write(repo / path, path)
    return len(files), sum((repo / p).stat().st_size for p in files), buffer.getbuffer().nbytes


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--list", action="store_true", help="print the archive's files, one a line")
    parser.add_argument("--no-pathspec", action="store_true", help="match with simple_match even if pathspec is here")
    args = parser.parse_args(argv)
    files = archive_files(REPO, use_pathspec=not args.no_pathspec)
    if args.list:
        print("\n".join(files))
        return 0
    for label, chosen in (("without .comfyignore", archive_files(REPO, patterns=[])), ("with .comfyignore", files)):
        count, size, zipped = measure(REPO, chosen)
        print(f"{label}: {count} files, {size} bytes ({zipped} bytes zipped)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
