"""Issue 23 on a cache folder and the CLI: FIFOs and links where files belong, typos in cache names, verify's exit
status and phantom problems under concurrent writers, passwords in errors, escape sequences in listed prompts."""
from __future__ import annotations

import os
import subprocess
import textwrap

import pytest

from comfyui_chai.cache_store.errors import CacheError
from comfyui_chai.cache_store.folder.store import CacheStore
from comfyui_chai.cache_store.lookup.rule import HitRule
from comfyui_chai.cache_store.postgres.url import ServerURL
from store_faults import FP, SHAPE, THR, fill, run_cli
from store_helpers import PYTHON, SIGMAS, ents, latents, subprocess_env

HANG = 60  # seconds: a step that takes longer is hung on a FIFO (each normally takes 2-5 s)


def run_py(code: str, *args: str, timeout: float = HANG) -> subprocess.CompletedProcess:
    """Run a snippet in a child process that is killed if it hangs (a blocked open cannot be interrupted)."""
    try:
        return subprocess.run([PYTHON, "-c", textwrap.dedent(code), *args], capture_output=True, text=True,
                              env=subprocess_env(), timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"hung for {timeout} s (blocked on a FIFO?): {exc.stderr}")


OPEN_LOOKUP_VERIFY_REPAIR = """
    import sys
    from comfyui_chai.cache_store.folder.maintenance import verify_folder
    from comfyui_chai.cache_store.folder.store import CacheStore
    from comfyui_chai.cache_store.lookup.rule import HitRule
    from store_helpers import ents
    print("verify:", len(verify_folder(sys.argv[1]).problems))
    with CacheStore(sys.argv[1]) as s:
        for i in range(3):
            res = s.lookup(ents(f"thing{i}", "dog"), "model-a", (1, 4, 2, 4, 4), HitRule(0.8))
            print("lookup", i, res.entry.prompt if res.hit else "miss")
        print("problems:", len(s.verify().problems))
        s.repair()
        print("after repair:", len(s.verify().problems), s.stats().entries)
"""


@pytest.mark.parametrize("where", ["listed latent", "unlisted latent", "manifest", "index state", "index file"])
def test_a_fifo_in_place_of_a_cache_file_never_hangs_and_is_set_aside(tmp_path, where):
    root = tmp_path / "c"
    files = fill(root, 3)
    if where == "listed latent":
        victim = root / "latents" / files[1]
    elif where == "unlisted latent":
        victim = root / "latents" / f"{0xabc:032x}.safetensors"
    elif where == "manifest":
        victim = root / "manifest.sqlite"
    elif where == "index state":
        victim = root / "index" / "state.json"
    else:
        victim = next((root / "index").glob("entities-*"))
    if victim.exists():
        victim.unlink()
    os.mkfifo(victim)
    out = run_py(OPEN_LOOKUP_VERIFY_REPAIR, str(root))
    assert out.returncode == 0, out.stderr[-3000:]
    assert "after repair: 0" in out.stdout, out.stdout
    if where == "listed latent":
        assert "lookup 1 seed=1" not in out.stdout and "after repair: 0 2" in out.stdout
    else:
        assert "lookup 1 seed=1" in out.stdout and "after repair: 0 3" in out.stdout
    assert not any(p.is_fifo() for p in root.rglob("*") if "quarantine" not in p.parts)


def test_verify_lists_a_fifo_without_opening_it(tmp_path):
    root = tmp_path / "c"
    files = fill(root, 2)
    (root / "latents" / files[0]).unlink()
    os.mkfifo(root / "latents" / files[0])
    out = run_py("import sys\nfrom comfyui_chai.cache_store.cli import main\nsys.exit(main(sys.argv[1:]))",
                 "--root", str(root.parent), "--name", root.name, "verify")
    assert out.returncode == 1 and "FIFO" in out.stdout, (out.stdout, out.stderr)


def test_a_symlinked_quarantine_is_not_followed_out_of_the_cache(tmp_path):
    root, outside = tmp_path / "c", tmp_path / "outside"
    files = fill(root, 3)
    outside.mkdir()
    (root / "quarantine").symlink_to(outside, target_is_directory=True)
    (root / "latents" / files[1]).write_bytes(b"garbage")
    with CacheStore(root) as s:
        s.repair()
        assert s.stats().entries == 2
    assert not list(outside.iterdir())                      # nothing moved out of the cache
    assert (root / "quarantine").is_dir() and not (root / "quarantine").is_symlink()
    assert any(p.name.endswith(files[1]) for p in (root / "quarantine").iterdir())


def test_a_symlinked_writer_lock_gets_advice_and_repair_fixes_it(tmp_path):
    root, target = tmp_path / "c", tmp_path / "precious.txt"
    fill(root, 2)
    target.write_text("do not truncate me")
    (root / ".writer.lock").unlink()
    (root / ".writer.lock").symlink_to(target)
    with pytest.raises(CacheError, match=r"\.writer\.lock is a symbolic link.*repair"):
        CacheStore(root)
    out = run_cli(root, "repair")
    assert out.returncode == 0, out.stderr
    assert "writer.lock" in out.stdout
    assert target.read_text() == "do not truncate me" and not (root / ".writer.lock").is_symlink()
    with CacheStore(root) as s:
        assert s.stats().entries == 2


# ------------------------------------------------------------------------------------------ item 4: typos
@pytest.mark.parametrize("command", ["stats", "list", "verify"])
def test_read_only_commands_on_a_missing_cache_create_nothing(tmp_path, command):
    fill(tmp_path / "root" / "default", 1)
    fill(tmp_path / "root" / "studio", 1)
    out = run_cli(tmp_path / "root" / "defualt", command)
    assert out.returncode != 0 and "does not exist" in out.stderr, (out.stdout, out.stderr)
    assert "default" in out.stderr and "studio" in out.stderr
    assert not (tmp_path / "root" / "defualt").exists()
    out = run_cli(tmp_path / "nowhere" / "default", command)
    assert out.returncode != 0 and "does not exist" in out.stderr
    assert not (tmp_path / "nowhere").exists()


# ------------------------------------------------------------------------------------------ item 5: verify
def test_verify_exits_non_zero_when_it_lists_problems(tmp_path):
    root = tmp_path / "c"
    files = fill(root, 2)
    assert run_cli(root, "verify").returncode == 0
    (root / "latents" / files[0]).write_bytes(b"garbage")
    out = run_cli(root, "verify")
    assert out.returncode == 1 and "1 problem(s)" in out.stdout, out.stdout


def test_verify_lists_no_phantom_problems_while_others_write(tmp_path):
    root = tmp_path / "c"
    fill(root, 1)
    writer = subprocess.Popen([PYTHON, "-c", textwrap.dedent("""
        import sys
        from comfyui_chai.cache_store.folder.store import CacheStore
        from store_helpers import SIGMAS, ents, latents
        with CacheStore(sys.argv[1]) as s:
            for i in range(1, 10**6):
                s.insert(f"seed={i}", ents(f"thing{i}", "dog"), "model-a", latents(i), SIGMAS)
    """), str(root)], env=subprocess_env(), stderr=subprocess.PIPE)
    from comfyui_chai.cache_store.folder.maintenance import verify_folder

    try:
        import time

        deadline = time.monotonic() + 120
        while len(list((root / "latents").iterdir())) < 4:  # the writer is inserting
            assert writer.poll() is None and time.monotonic() < deadline, writer.stderr.read().decode()[-2000:]
            time.sleep(0.05)
        runs = []
        while len(runs) < 25 and writer.poll() is None:
            runs.append(verify_folder(root).problems)
        assert writer.poll() is None, writer.stderr.read().decode()[-2000:]
    finally:
        writer.kill()
        writer.wait()
    assert len(runs) == 25 and not [p for p in runs if p], [p for p in runs if p][:3]


# ------------------------------------------------------------------------------------------ items 7 and 8
BAD_ESCAPE = "s3cr%zzet%41x"


def test_a_password_with_an_invalid_escape_never_shows(tmp_path, monkeypatch):
    url = f"postgresql://chai:{BAD_ESCAPE}@/chai?host={tmp_path}&port=5432"
    parsed = ServerURL(url, "CHAI_CACHE_URL")
    for secret in (BAD_ESCAPE, "s3cr", "zzet"):
        assert secret not in repr(parsed) and secret not in str(parsed)
    pytest.importorskip("psycopg")
    from comfyui_chai.cache_store.service import ChaiCache

    with pytest.raises(CacheError) as raised:  # the API: libpq quotes the token it cannot decode
        ChaiCache(tmp_path, server=parsed, name="x")
    assert "s3cr" not in str(raised.value) and "zzet" not in str(raised.value), raised.value
    for command in ("stats", "verify"):
        out = subprocess.run([PYTHON, "-m", "comfyui_chai.cache_store", "--url", url, "--root", str(tmp_path),
                              "--name", "x", command], capture_output=True, text=True, env=subprocess_env(),
                             timeout=120)
        assert out.returncode != 0 and out.stderr
        assert "s3cr" not in out.stderr + out.stdout and "zzet" not in out.stderr + out.stdout, out.stderr


def test_list_escapes_control_characters_in_prompts(tmp_path):
    root = tmp_path / "c"
    with CacheStore(root) as s:
        s.insert("a dog\x1b]0;pwned\x07\x1b[2J\u202e evil", ents("dog"), FP, latents(1), SIGMAS)
    out = run_cli(root, "list")
    assert out.returncode == 0, out.stderr
    assert "\x1b" not in out.stdout and "\x07" not in out.stdout and "\u202e" not in out.stdout
    assert "a dog\\x1b]0;pwned\\x07\\x1b[2J\\u202e evil" in out.stdout


def test_lookups_still_hit_after_the_checks(tmp_path):
    """The new checks refuse only what is not a regular file: an ordinary cache serves as before."""
    root = tmp_path / "c"
    fill(root, 2)
    with CacheStore(root) as s:
        res = s.lookup(ents("thing1", "dog"), FP, SHAPE, HitRule(THR))
        assert res.hit and res.entry.prompt == "seed=1"
