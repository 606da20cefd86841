"""Has `[project] version` in pyproject.toml changed since a base commit? Used by the Registry publish workflow.

    python3 scripts/version_changed.py --base <commit>

Prints `version=`, `previous=` and `changed=true|false` (also appended to $GITHUB_OUTPUT when that is set) and a
one-line reason on stderr. `changed` is true when the version differs from the base commit's, and also when
there is no usable base (no --base, the all-zero commit of a new branch, a commit this clone lacks, or a base
without a version): publishing then is safe, because the Registry refuses a version it already has.
Needs Python 3.11+ (tomllib) and git; it only reads the repository.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tomllib
from pathlib import Path

PYPROJECT = "pyproject.toml"


def project_version(text: str) -> str | None:
    """The `[project] version` of a pyproject.toml's text, or None when there is none (or the TOML is broken)."""
    try:
        version = tomllib.loads(text).get("project", {}).get("version")
    except tomllib.TOMLDecodeError:
        return None
    return version if isinstance(version, str) and version else None


def base_text(base: str, repo: Path) -> str | None:
    """pyproject.toml as it was at `base`, or None when there is no such commit or file."""
    if not base or set(base) == {"0"}:
        return None
    out = subprocess.run(["git", "show", f"{base}:{PYPROJECT}"], cwd=repo, capture_output=True, text=True)
    return out.stdout if out.returncode == 0 else None


def decide(current: str | None, previous_text: str | None) -> tuple[bool, str | None, str]:
    """(changed, previous version, reason)."""
    if current is None:
        raise SystemExit(f"{PYPROJECT} has no [project] version")
    if previous_text is None:
        return True, None, "no base commit to compare with"
    previous = project_version(previous_text)
    if previous is None:
        return True, None, "the base commit's pyproject.toml has no version"
    if previous == current:
        return False, previous, f"version {current} unchanged"
    return True, previous, f"version {previous} -> {current}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", default="", help="commit to compare with (e.g. the push's `before`)")
    parser.add_argument("--repo", default=".", help="repository root (default: current folder)")
    args = parser.parse_args(argv)
    repo = Path(args.repo)
    current = project_version((repo / PYPROJECT).read_text(encoding="utf-8"))
    changed, previous, reason = decide(current, base_text(args.base, repo))
    lines = [f"version={current}", f"previous={previous or ''}", f"changed={'true' if changed else 'false'}"]
    print("\n".join(lines))
    print(reason, file=sys.stderr)
    if os.environ.get("GITHUB_OUTPUT"):
        with open(os.environ["GITHUB_OUTPUT"], "a", encoding="utf-8") as out:
            out.write("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
