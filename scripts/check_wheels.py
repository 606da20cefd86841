"""Does every package in requirements.txt install from a wheel (no compiler) on the platforms ComfyUI users run?

    python scripts/check_wheels.py                       # 4 platforms x Python 3.10-3.13, a table, exit 1 on a gap
    python scripts/check_wheels.py --platform win_amd64 --python 3.13
    python scripts/check_wheels.py --require-network     # CI: an unreachable index is a failure, not a skip

For each platform and Python version pip resolves the requirements file (dependencies included) as it would for
that target, wheels only: `pip install --dry-run --only-binary=:all: --platform TAG... --python-version V --target
TMP --report FILE`, in isolated mode (no pip config, no local mirrors or constraints: what a user's pip sees on
PyPI). Nothing is installed; pip fetches only index pages and wheel metadata. A requirement with no wheel is
reported by name; when it is a line of the requirements file the check drops it and resolves again, so one run
names every top-level gap. Exit code 0 when every cell is ok, 1 when one is not, 2 on bad arguments or an old pip.
When the index cannot be reached the check prints why and exits 0 ("skipped"), or 1 with --require-network.

Limits: pip evaluates environment markers (`; sys_platform == "win32"`) for the machine it runs on, not the
target, so a dependency only another platform pulls in is not checked; and a user's pip without --only-binary
would build a *newer* sdist-only release where this check settles for an older version with wheels.
Needs pip >= 22.2 (--report).
"""
from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
INDEX_URL = "https://pypi.org/simple"
PYTHONS = ("3.10", "3.11", "3.12", "3.13")
# glibc 2.28 (RHEL 8, Debian 10, Ubuntu 20.04) and everything older, in both spellings wheels use.
_MANYLINUX = [f"manylinux_2_{minor}_x86_64" for minor in range(28, 4, -1)] + [
    "manylinux2014_x86_64", "manylinux2010_x86_64", "manylinux1_x86_64"]
# Display name -> the platform tags handed to pip. pip widens a macosx tag to every older macOS and universal2.
PLATFORMS: dict[str, list[str]] = {
    "win_amd64": ["win_amd64"],
    "macos_arm64": ["macosx_14_0_arm64"],
    "macos_x86_64": ["macosx_13_0_x86_64"],
    "manylinux_x86_64": _MANYLINUX,
}
_NO_VERSION = re.compile(r"satisfies the requirement ([^\s;]+)")
_NO_MATCH = re.compile(r"No matching distribution found for ([^\s;]+)")
_NAME = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)")


@dataclass(frozen=True)
class PipRun:
    """What one pip resolution gave: its exit code, its stderr and its --report (None when it wrote none)."""

    returncode: int
    stderr: str
    report: dict | None


@dataclass
class Cell:
    """The outcome for one platform and Python version."""

    platform: str
    python: str
    wheels: int = 0
    missing: list[str] = field(default_factory=list)  # requirement names without a usable wheel
    error: str = ""  # a failure that names no package (a conflict, a network error)

    @property
    def ok(self) -> bool:
        """Every requirement resolved to wheels."""
        return not self.missing and not self.error

    def text(self) -> str:
        """The table cell."""
        if self.ok:
            return f"ok ({self.wheels} wheels)"
        parts = [f"no wheel: {', '.join(self.missing)}"] if self.missing else []
        if self.wheels:
            parts.append(f"the other {self.wheels} wheels ok")
        return "; ".join(parts + ([self.error] if self.error else []))


def canonical(name: str) -> str:
    """PEP 503 normalised project name."""
    return re.sub(r"[-_.]+", "-", name).lower()


def requirement_lines(text: str) -> list[tuple[str, str]]:
    """(canonical name, line) for each requirement line of a requirements file; comments and options skipped."""
    out = []
    for raw in text.splitlines():
        line = raw.split(" #", 1)[0].strip()
        if not line or line.startswith(("#", "-")):
            continue
        match = _NAME.match(line)
        if match:
            out.append((canonical(match.group(1)), line))
    return out


def failed_requirement(stderr: str) -> str | None:
    """The canonical name of the requirement pip found no distribution for, or None when pip named none."""
    for pattern in (_NO_MATCH, _NO_VERSION):
        found = pattern.findall(stderr)
        if found:
            match = _NAME.match(found[-1])
            if match:
                return canonical(match.group(1))
    return None


def first_error(stderr: str) -> str:
    """pip's first ERROR line (or its last line), shortened for a table cell."""
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("ERROR:")]
    text = (errors or lines or ["pip failed without a message"])[0].removeprefix("ERROR:").strip()
    return text if len(text) <= 100 else text[:97] + "..."


def report_wheels(report: dict) -> tuple[int, list[str]]:
    """(number of distributions, names of those that are not wheels) in a pip --report."""
    items = report.get("install", [])
    not_wheels = [canonical(item["metadata"]["name"]) for item in items
                  if not item.get("download_info", {}).get("url", "").endswith(".whl")]
    return len(items), not_wheels


def pip_command(requirements: Path, tags: Sequence[str], python: str, target: Path, report: Path,
                index_url: str) -> list[str]:
    """The pip command that resolves `requirements` for one target, wheels only, installing nothing."""
    cmd = [sys.executable, "-m", "pip", "--isolated", "--disable-pip-version-check", "install", "--dry-run",
           "--quiet", "--only-binary=:all:", "--python-version", python, "--implementation", "cp",
           "--target", str(target), "--report", str(report), "--index-url", index_url]
    for tag in tags:
        cmd += ["--platform", tag]
    return cmd + ["-r", str(requirements)]


def run_pip(cmd: list[str], report: Path) -> PipRun:
    """Run one pip resolution and read its report."""
    proc = subprocess.run(cmd, capture_output=True, text=True)
    data = json.loads(report.read_text(encoding="utf-8")) if proc.returncode == 0 and report.exists() else None
    return PipRun(proc.returncode, proc.stderr, data)


Runner = Callable[[list[str], Path], PipRun]


def check_cell(platform: str, python: str, lines: list[tuple[str, str]], index_url: str = INDEX_URL,
               runner: Runner = run_pip) -> Cell:
    """Resolve the requirement lines for one target; drop each top-level line that has no wheel and resolve again."""
    cell = Cell(platform, python)
    remaining = list(lines)
    with tempfile.TemporaryDirectory(prefix="chai-wheels-") as tmp:
        work = Path(tmp)
        for attempt in range(len(lines) + 1):
            if not remaining:
                return cell
            req = work / f"requirements-{attempt}.txt"
            req.write_text("\n".join(line for _, line in remaining) + "\n", encoding="utf-8")
            report = work / f"report-{attempt}.json"
            run = runner(pip_command(req, PLATFORMS[platform], python, work / "target", report, index_url), report)
            if run.returncode == 0 and run.report is not None:
                cell.wheels, not_wheels = report_wheels(run.report)
                cell.missing += not_wheels
                return cell
            name = failed_requirement(run.stderr)
            if name is None:
                cell.error = first_error(run.stderr)
                return cell
            cell.missing.append(name)
            if name not in {n for n, _ in remaining}:
                return cell  # a dependency of a requirement: nothing to drop, the rest stays unresolved
            remaining = [(n, line) for n, line in remaining if n != name]
    return cell


def format_table(cells: Sequence[Cell], platforms: Sequence[str], pythons: Sequence[str]) -> str:
    """A markdown table: one row per platform, one column per Python version."""
    by_key = {(c.platform, c.python): c.text() for c in cells}
    rows = [["platform", *pythons], ["---"] * (len(pythons) + 1)]
    rows += [[p, *(by_key.get((p, v), "-") for v in pythons)] for p in platforms]
    return "\n".join("| " + " | ".join(row) + " |" for row in rows)


def index_reachable(index_url: str, timeout: float = 15.0) -> str | None:
    """None when the index answers, else why not."""
    try:
        with urllib.request.urlopen(f"{index_url.rstrip('/')}/pip/", timeout=timeout) as resp:
            return None if resp.status == 200 else f"HTTP {resp.status}"
    except (urllib.error.URLError, OSError) as exc:
        return str(getattr(exc, "reason", exc))


def pip_version_ok() -> bool:
    """Whether this interpreter's pip has --report (22.2 or newer)."""
    try:
        from pip import __version__
    except ImportError:
        return False
    major, minor = (int(part) for part in re.findall(r"\d+", __version__)[:2])
    return (major, minor) >= (22, 2)


def main(argv: list[str] | None = None, runner: Runner = run_pip) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requirements", type=Path, default=REPO / "requirements.txt")
    parser.add_argument("--platform", action="append", choices=sorted(PLATFORMS), help="default: all four")
    parser.add_argument("--python", action="append", help=f"default: {', '.join(PYTHONS)}")
    parser.add_argument("--index-url", default=INDEX_URL)
    parser.add_argument("--jobs", type=int, default=4, help="resolutions run at once (default 4)")
    parser.add_argument("--require-network", action="store_true", help="an unreachable index fails the check")
    args = parser.parse_args(argv)
    platforms, pythons = args.platform or list(PLATFORMS), args.python or list(PYTHONS)
    if args.jobs < 1 or any(not re.fullmatch(r"3\.\d+", v) for v in pythons):
        parser.error("--jobs must be >= 1 and --python like 3.12")
    if runner is run_pip and not pip_version_ok():
        print("[wheels] this pip is older than 22.2 (no --report): python -m pip install -U pip", file=sys.stderr)
        return 2
    lines = requirement_lines(args.requirements.read_text(encoding="utf-8"))
    if runner is run_pip:
        why = index_reachable(args.index_url)
        if why is not None:
            print(f"[wheels] skipped: {args.index_url} is unreachable ({why})", file=sys.stderr)
            return 1 if args.require_network else 0
    print(f"[wheels] {len(lines)} requirements of {args.requirements.name}, wheels only, from {args.index_url}")
    targets = [(p, v) for p in platforms for v in pythons]
    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        cells = list(pool.map(lambda t: check_cell(t[0], t[1], lines, args.index_url, runner), targets))
    print(format_table(cells, platforms, pythons))
    bad = [c for c in cells if not c.ok]
    if bad:
        missing = sorted({name for c in bad for name in c.missing})
        print(f"[wheels] FAILED in {len(bad)} of {len(cells)} cells"
              + (f"; without a wheel: {', '.join(missing)}" if missing else ""), file=sys.stderr)
        return 1
    print(f"[wheels] ok: all {len(cells)} cells install from wheels")
    return 0


if __name__ == "__main__":
    sys.exit(main())
