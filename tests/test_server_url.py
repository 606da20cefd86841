"""Choosing a cache's backend and keeping connection passwords out of every message (no server needed)."""
from __future__ import annotations

import subprocess

import pytest

from comfyui_chai.cache_store.postgres.url import BackendURLError, ServerURL, mask_url, redact, resolve
from store_helpers import PYTHON, subprocess_env

URL = "postgresql://render:hunter2@db.farm.example:5433/chai?sslmode=verify-full&sslrootcert=%2Fetc%2Fca.pem"


def test_empty_means_the_environment_then_the_local_folder(tmp_path):
    assert resolve("", {}) is None
    assert resolve(None, {"CHAI_CACHE_URL": URL}).url == URL
    assert resolve("", {"CHAI_CACHE_URL": URL}).source == "CHAI_CACHE_URL"
    secret = tmp_path / "url"
    secret.write_text(URL + "\n")
    found = resolve("", {"CHAI_CACHE_URL_FILE": str(secret)})
    assert found.url == URL and found.source == "CHAI_CACHE_URL_FILE"
    assert resolve("local", {"CHAI_CACHE_URL": URL}) is None          # the node forces the folder
    assert resolve("", {"CHAI_CACHE_URL": "local"}) is None


def test_a_node_url_may_not_carry_a_password_because_workflows_are_shared():
    with pytest.raises(BackendURLError, match="may not contain a password") as err:
        resolve(URL, {})
    assert "hunter2" not in str(err.value)
    assert "postgresql://render@db.farm.example:5433/chai" in str(err.value)
    with pytest.raises(BackendURLError, match="may not contain a password"):
        resolve("postgresql://db/x?password=hunter2", {})
    node = resolve("postgresql://render@db.farm.example/chai?sslmode=require", {})
    assert node.source == "node" and node.password is None


@pytest.mark.parametrize("bad", ["mysql://db/x", "db.farm.example", "s3://bucket/cache", "sqlite:///cache.db"])
def test_other_schemes_are_refused_with_what_to_write(bad):
    with pytest.raises(BackendURLError, match="must start with postgresql://"):
        resolve(bad, {})


def test_an_unreadable_or_empty_url_file_says_so(tmp_path):
    with pytest.raises(BackendURLError, match="cannot read"):
        resolve("", {"CHAI_CACHE_URL_FILE": str(tmp_path / "missing")})
    (tmp_path / "empty").write_text("\n")
    with pytest.raises(BackendURLError, match="is empty"):
        resolve("", {"CHAI_CACHE_URL_FILE": str(tmp_path / "empty")})


def test_passwords_are_masked_and_tls_options_pass_through_unchanged():
    server = ServerURL(URL, "CHAI_CACHE_URL")
    assert server.password == "hunter2"
    assert server.shown == ("postgresql://render:***@db.farm.example:5433/chai?sslmode=verify-full"
                            "&sslrootcert=%2Fetc%2Fca.pem")
    assert server.label == "postgresql://render@db.farm.example:5433/chai"
    assert server.connect_url() == URL + "&connect_timeout=5"   # TLS options untouched, a timeout added
    assert ServerURL(URL + "&connect_timeout=30", "x").connect_url() == URL + "&connect_timeout=30"
    assert mask_url("postgres://h/db?user=u&password=p%40ss&sslmode=require") == \
        "postgres://h/db?user=u&password=***&sslmode=require"
    text = "connect to postgresql://render:hunter2@db/x failed (password=hunter2); hunter2"
    assert "hunter2" not in redact(text, "hunter2")


def test_importing_the_pack_loads_no_database_driver():
    code = ("import sys, comfyui_chai.cache_store.service, comfyui_chai.cache_store.cli; "
            "print('psycopg' in sys.modules)")
    done = subprocess.run([PYTHON, "-c", code], capture_output=True, text=True, env=subprocess_env(), timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "False"


def test_a_missing_driver_says_how_to_install_it(monkeypatch):
    import sys

    from comfyui_chai.cache_store.errors import CacheError
    from comfyui_chai.cache_store.postgres.db import PgDb

    monkeypatch.setitem(sys.modules, "psycopg", None)
    with pytest.raises(CacheError, match=r"pip install 'psycopg\[binary\]>=3.1'"):
        PgDb(ServerURL("postgresql://db/x", "CHAI_CACHE_URL"), "chai_default")


def test_a_bad_url_option_is_blamed_on_the_option_not_the_environment(capsys, monkeypatch):
    from comfyui_chai.cache_store.cli import main

    monkeypatch.delenv("CHAI_CACHE_URL", raising=False)
    assert main(["--url", "mysql://chai@db/chai", "--name", "default", "stats"]) == 2
    err = capsys.readouterr().err
    assert "cache server URL from --url must start with postgresql://" in err and "CHAI_CACHE_URL" not in err
