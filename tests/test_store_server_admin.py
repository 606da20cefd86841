"""Operating a cache on a PostgreSQL server: credentials and TLS, verify and repair, the CLI, the node's choice of
backend. Every test runs against a real server (tests/pg_server.py)."""
from __future__ import annotations

import logging
import subprocess
import uuid

import pytest

from comfyui_chai.cache_store.cli import main
from comfyui_chai.cache_store.config import StoreConfig
from comfyui_chai.cache_store.errors import CacheUnavailableError
from comfyui_chai.cache_store.postgres.schema import schema_name
from comfyui_chai.cache_store.postgres.store import PgCacheStore
from comfyui_chai.cache_store.postgres.url import BackendURLError, ServerURL
from comfyui_chai.cache_store.service import close_all, open_cache
from comfyui_chai.cache_store.folder.store import CacheStore
from comfyui_chai.cache_store.lookup.rule import HitRule
from pg_server import CHAI_PASSWORD, PgServer, find_binaries
from store_helpers import SIGMAS, ents, latents

FP, SHAPE, THR = "model-a", (1, 4, 2, 4, 4), 0.8


def fresh() -> str:
    return "a" + uuid.uuid4().hex[:10]


def open_store(url: str, name: str, tmp_path, **kw) -> PgCacheStore:
    return PgCacheStore(ServerURL(url, "CHAI_CACHE_URL"), name, StoreConfig(10**9), index_root=tmp_path, **kw)


# ------------------------------------------------------------------------------------------ credentials, TLS
def test_credentials_come_from_the_environment_or_a_file_and_are_never_shown(pg_server, tmp_path, monkeypatch,
                                                                            caplog):
    caplog.set_level(logging.DEBUG)
    bare = pg_server.url("chai")  # no password in the URL
    with pytest.raises(CacheUnavailableError, match="check the credentials") as err:
        open_store(pg_server.url("chai", password="wrong-" + CHAI_PASSWORD), fresh(), tmp_path)
    assert not err.value.transient and CHAI_PASSWORD not in str(err.value)
    monkeypatch.setenv("PGPASSWORD", CHAI_PASSWORD)
    with open_store(bare, fresh(), tmp_path) as s:
        s.insert("a dog", ents("dog"), FP, latents(1), SIGMAS)
    monkeypatch.delenv("PGPASSWORD")
    passfile = tmp_path / "pgpass"
    passfile.write_text(f"*:*:*:chai:{CHAI_PASSWORD}\n")
    passfile.chmod(0o600)
    monkeypatch.setenv("PGPASSFILE", str(passfile))
    with open_store(bare, fresh(), tmp_path) as s:
        assert s.stats().entries == 0
    monkeypatch.delenv("PGPASSFILE")
    url_file = tmp_path / "chai-url"
    url_file.write_text(pg_server.url("chai", password=CHAI_PASSWORD))
    monkeypatch.setenv("CHAI_CACHE_URL_FILE", str(url_file))
    monkeypatch.delenv("CHAI_CACHE_URL", raising=False)
    cache = open_cache(tmp_path, "viafile", budget_bytes=10**9)
    try:
        assert cache.server is not None and cache.server.source == "CHAI_CACHE_URL_FILE"
        assert cache.write("a cat", ents("cat"), FP, latents(2), SIGMAS).stored
        assert CHAI_PASSWORD not in str(cache.root) and CHAI_PASSWORD not in cache.store.stats().report()
    finally:
        close_all()
    assert CHAI_PASSWORD not in caplog.text


def test_tls_settings_in_the_url_reach_the_server(tmp_path):
    if find_binaries() is None:
        pytest.skip("no PostgreSQL binaries (initdb, pg_ctl): install Debian's `postgresql` package")
    server = PgServer.start(tls=True)
    try:
        url = server.tcp_url(sslmode="verify-full", sslrootcert=str(server.cert))
        with PgCacheStore(ServerURL(url.replace("chai@", f"chai:{CHAI_PASSWORD}@"), "CHAI_CACHE_URL"), "tls",
                          index_root=tmp_path) as s:
            assert s.db.query("SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()") == [(True,)]
        other = tmp_path / "other.pem"  # a certificate authority that did not sign the server's certificate
        subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj",
                        "/CN=localhost", "-keyout", str(tmp_path / "other.key"), "-out", str(other)], check=True,
                       capture_output=True)
        for options, reason in (({"sslmode": "disable"}, "no encryption"), ({"sslmode": "bogus"}, "sslmode"),
                                ({"sslmode": "verify-full", "sslrootcert": str(other)}, "certificate verify failed")):
            with pytest.raises(CacheUnavailableError, match="TLS settings") as err:
                PgCacheStore(ServerURL(server.tcp_url(**options).replace("chai@", f"chai:{CHAI_PASSWORD}@"), "x"),
                             "tls", index_root=tmp_path)
            assert reason in str(err.value) and not err.value.transient and CHAI_PASSWORD not in str(err.value)
    finally:
        server.destroy()


# ------------------------------------------------------------------------------------------ verify, repair
def test_verify_finds_damage_read_only_lookups_set_it_aside_and_repair_fixes_the_rest(pg_server, tmp_path):
    name = fresh()
    schema = schema_name(name)
    url = pg_server.url("chai", password=CHAI_PASSWORD)
    with open_store(url, name, tmp_path) as s:
        ids = [s.insert(f"seed={i}", ents(f"thing{i}", "dog"), FP, latents(i), SIGMAS).entry_id for i in range(4)]
        assert s.verify().ok
        before = s.db.query("SELECT generation, total_bytes FROM state")
        pg_server.admin_sql(f'UPDATE "{schema}".blobs SET data = overlay(data placing \'\\x00\'::bytea from 200) '
                            f'WHERE entry_id IN ({ids[0]}, {ids[1]})', "chai")
        pg_server.admin_sql(f'UPDATE "{schema}".state SET total_bytes = total_bytes + 7', "chai")
        pg_server.admin_sql(f"INSERT INTO \"{schema}\".entities (text, kind, vector) VALUES ('orphan', 'object', "
                            "'\\x00'::bytea)", "chai")
        report = s.verify()
        problems = "\n".join(report.problems)
        assert f"entry {ids[0]}: its latent bytes fail their checksum" in problems
        assert f"entry {ids[1]}:" in problems and "byte counter" in problems
        assert "1 entities belong to no entry" in problems and "not finite unit vectors" in problems
        assert s.db.query("SELECT generation FROM state") == [(before[0][0],)]  # verify changed nothing
        res = s.lookup(ents("thing0"), FP, SHAPE, HitRule(THR))
        assert not res.hit and "set aside" in res.reason  # damaged bytes are never served
        assert s.db.query("SELECT entry_id, data IS NOT NULL FROM quarantine") == [(ids[0], True)]
        fixed = s.repair()
        assert any(f"dropped entry {ids[1]}" in line for line in fixed.repaired)
        assert any("recounted the bytes" in line for line in fixed.repaired)
        after = s.verify()
        assert after.ok and not after.problems, after.report()
        assert {e.id for e in s.entries()} == set(ids[2:])
        assert s.lookup(ents("thing3"), FP, SHAPE, HitRule(THR)).hit


def test_the_cli_manages_a_server_cache(pg_server, tmp_path, monkeypatch, capsys):
    name = fresh()
    monkeypatch.setenv("PGPASSWORD", CHAI_PASSWORD)
    url = pg_server.url("chai")
    args = ["--url", url, "--name", name, "--root", str(tmp_path)]
    assert main([*args, "verify"]) == 2  # a typo'd name: said so, nothing created
    assert "does not exist on postgresql://chai@" in capsys.readouterr().err
    assert main([*args, "stats"]) == 2
    err = capsys.readouterr().err
    assert "does not exist" in err and ("caches there:" in err or "no cache on this server yet" in err), err
    assert pg_server.admin_sql(f"SELECT to_regclass('\"{schema_name(name)}\".state')", "chai") == "\n"
    with open_store(pg_server.url("chai"), name, tmp_path) as s:
        size = s.insert("first", ents("dog"), FP, latents(1), SIGMAS).nbytes
        s.insert("second", ents("cat"), FP, latents(2), SIGMAS)
        s.insert("third", ents("cow"), FP, latents(3), SIGMAS)
    assert main([*args, "stats"]) == 0
    out = capsys.readouterr().out
    assert f"cache: postgresql://chai@{pg_server.socket_dir}:5432/chai/{name}" in out and "entries: 3" in out
    assert main([*args, "list"]) == 0
    assert "third" in capsys.readouterr().out
    assert main([*args, "verify"]) == 0
    assert "checked 3 entries: 0 problem(s)" in capsys.readouterr().out
    assert main([*args, "prune", "--budget-gb", str(size * 2 / 1e9)]) == 0
    assert "evicted 1 entries" in capsys.readouterr().out
    assert main([*args, "repair"]) == 0
    assert "0 problem(s)" in capsys.readouterr().out
    assert main([*args, "clear"]) == 2
    assert "--yes" in capsys.readouterr().err
    assert main([*args, "clear", "--yes"]) == 0
    assert "removed 2 entries" in capsys.readouterr().out
    monkeypatch.delenv("PGPASSWORD")
    assert main(["--url", pg_server.url("chai", password="not-it"), "--name", name, "stats"]) == 2
    err = capsys.readouterr().err
    assert "unreachable" in err and "not-it" not in err


# ------------------------------------------------------------------------------------------ choosing the backend
def test_the_node_input_and_the_environment_choose_the_backend(pg_server, tmp_path, monkeypatch):
    monkeypatch.delenv("CHAI_CACHE_URL_FILE", raising=False)
    monkeypatch.setenv("CHAI_CACHE_URL", pg_server.url("chai", password=CHAI_PASSWORD))
    monkeypatch.setenv("PGPASSWORD", CHAI_PASSWORD)  # for the node's URL, which may not carry one
    try:
        shared = open_cache(tmp_path, "studio", budget_bytes=10**9, owner="node-1")
        assert shared.server is not None and isinstance(shared.store, PgCacheStore)
        assert open_cache(tmp_path, "studio", budget_bytes=10**9, owner="node-1") is shared  # same handle
        local = open_cache(tmp_path, "studio", budget_bytes=10**9, owner="node-2", server="local")
        assert isinstance(local.store, CacheStore) and local.root == tmp_path.resolve() / "studio"
        explicit = open_cache(tmp_path, "studio", budget_bytes=10**9, server=pg_server.url("chai"))
        assert explicit.store.root == shared.store.root  # the same cache, reached through the node's URL
        with pytest.raises(BackendURLError, match="may not contain a password"):
            open_cache(tmp_path, "studio", server=pg_server.url("chai", password=CHAI_PASSWORD))
        shared.write("a dog", ents("dog"), FP, latents(1), SIGMAS)
        assert explicit.lookup(ents("dog"), FP, SHAPE, THR).hit
        assert not local.lookup(ents("dog"), FP, SHAPE, THR).hit
        # the worker's copy of the entity index lives under its local cache root
        assert (tmp_path / ".server-index").is_dir()
    finally:
        close_all()
