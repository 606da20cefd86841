"""A throwaway PostgreSQL server for tests and benches: initdb + pg_ctl in a temporary folder, unix socket only.

PostgreSQL refuses to run as root, so when this process is root the server runs as the `postgres` user (the
Debian package creates it) through runuser, in a folder that user owns. Nothing listens on TCP unless `tls=True`:
then the server also listens on 127.0.0.1 (a free port) with a fresh self-signed certificate for "localhost", and
accepts only TLS connections there (the CA to trust is `server.cert`). Two roles: the
superuser `postgres` (trusted on the socket: the tests' admin connection) and `chai`, which must give a
password (scram-sha-256), so credential handling is tested against real authentication.

    server = PgServer.start()          # or PgServer.find_binaries() is None -> no PostgreSQL here
    server.url("chai")                 # postgresql://chai@/chai?host=<its socket folder>&port=5432 (no password)
    server.restart(); server.stop()
"""
from __future__ import annotations

import glob
import os
import shutil
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

CHAI_ROLE = "chai"
CHAI_PASSWORD = "s3cret-Pa55word"  # only ever valid on this throwaway server
DATABASE = "chai"
PORT = 5432  # the socket file's name only; nothing listens on TCP (listen_addresses='')


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def find_binaries() -> Path | None:
    """The folder holding initdb and pg_ctl: $CHAI_PG_BIN, Debian's /usr/lib/postgresql/<newest>/bin, or PATH."""
    env = os.environ.get("CHAI_PG_BIN")
    candidates = [Path(env)] if env else []
    candidates += sorted((Path(p) for p in glob.glob("/usr/lib/postgresql/*/bin")),
                         key=lambda p: int(p.parent.name) if p.parent.name.isdigit() else 0, reverse=True)
    initdb = shutil.which("initdb")
    if initdb:
        candidates.append(Path(initdb).resolve().parent)
    for folder in candidates:
        if (folder / "initdb").is_file() and (folder / "pg_ctl").is_file():
            return folder
    return None


@dataclass
class PgServer:
    """A running throwaway server (see module docstring)."""

    bin_dir: Path
    base: Path      # temporary folder: data/ and the socket
    run_as: str | None
    port: int = PORT
    tls: bool = False

    @property
    def cert(self) -> Path:
        """The server's self-signed certificate (tls=True): the root a client verifies against."""
        return self.base / "server.crt"

    @property
    def data(self) -> Path:
        return self.base / "data"

    @property
    def socket_dir(self) -> Path:
        return self.base

    @classmethod
    def start(cls, bin_dir: Path | None = None, tls: bool = False) -> "PgServer":
        """initdb a fresh cluster in a new temporary folder and start it; RuntimeError with the log if it fails."""
        bin_dir = bin_dir or find_binaries()
        if bin_dir is None:
            raise RuntimeError("no PostgreSQL binaries (initdb, pg_ctl) found: apt-get install postgresql")
        run_as = "postgres" if os.geteuid() == 0 else None
        base = Path(tempfile.mkdtemp(prefix="chai-pg-"))
        if run_as:
            shutil.chown(base, run_as, run_as)
        server = cls(bin_dir, base, run_as, _free_port() if tls else PORT, tls)
        pwfile = base / "pw"
        pwfile.write_text("postgres-unused\n")
        if run_as:
            shutil.chown(pwfile, run_as, run_as)
        server._run("initdb", "-D", str(server.data), "-U", "postgres", "--auth-local=trust",
                    "--auth-host=reject", "-E", "UTF8", "--locale=C", "--pwfile", str(pwfile))
        pwfile.unlink()
        listen = "127.0.0.1" if tls else ""
        with open(server.data / "postgresql.conf", "a") as conf:
            conf.write(f"\nlisten_addresses = '{listen}'\nunix_socket_directories = '{base}'\n"
                       f"port = {server.port}\nfsync = on\nmax_connections = 100\nshared_buffers = 64MB\n"
                       "password_encryption = 'scram-sha-256'\n")
            if tls:
                server._make_certificate()
                conf.write(f"ssl = on\nssl_cert_file = '{server.cert}'\nssl_key_file = '{base / 'server.key'}'\n")
        # the chai role authenticates with a password; the superuser is trusted on the socket; TCP needs TLS
        (server.data / "pg_hba.conf").write_text(
            f"local all {CHAI_ROLE} scram-sha-256\nlocal all all trust\n"
            f"hostssl all {CHAI_ROLE} 127.0.0.1/32 scram-sha-256\nhostnossl all all 127.0.0.1/32 reject\n")
        server._pg_ctl_start()
        server.admin_sql(f"CREATE ROLE {CHAI_ROLE} LOGIN PASSWORD '{CHAI_PASSWORD}'")
        server.admin_sql(f"CREATE DATABASE {DATABASE} OWNER {CHAI_ROLE}")
        return server

    def _make_certificate(self) -> None:
        key = self.base / "server.key"
        done = subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
                               "-subj", "/CN=localhost", "-addext", "subjectAltName=DNS:localhost",
                               "-keyout", str(key), "-out", str(self.cert)], capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"openssl could not make a certificate: {done.stderr[-1000:]}")
        key.chmod(0o600)
        if self.run_as:
            shutil.chown(key, self.run_as, self.run_as)
            shutil.chown(self.cert, self.run_as, self.run_as)

    def _cmd(self, tool: str, *args: str) -> list[str]:
        cmd = [str(self.bin_dir / tool), *args]
        return ["runuser", "-u", self.run_as, "--", *cmd] if self.run_as else cmd

    def _run(self, tool: str, *args: str, timeout: float = 120) -> str:
        done = subprocess.run(self._cmd(tool, *args), capture_output=True, text=True, timeout=timeout,
                              cwd=self.base)
        if done.returncode != 0:
            raise RuntimeError(f"{tool} failed ({done.returncode}): {done.stdout[-2000:]}{done.stderr[-2000:]}")
        return done.stdout

    def _pg_ctl_start(self) -> None:
        self._run("pg_ctl", "-D", str(self.data), "-l", str(self.base / "server.log"), "-w", "-t", "60",
                  "start")

    def url(self, user: str = CHAI_ROLE, password: str | None = None, database: str = DATABASE,
            **params: str) -> str:
        """A libpq URL over the socket; a password only when given (tests pass it through the environment)."""
        auth = quote(user) + (f":{quote(password, safe='')}" if password else "")
        query = "&".join([f"host={quote(str(self.socket_dir), safe='')}", f"port={self.port}",
                          *(f"{k}={quote(v, safe='')}" for k, v in params.items())])
        return f"postgresql://{auth}@/{database}?{query}"

    def tcp_url(self, user: str = CHAI_ROLE, database: str = DATABASE, **params: str) -> str:
        """A libpq URL to localhost over TCP (tls=True servers only), without a password."""
        query = "&".join(f"{k}={quote(v, safe='')}" for k, v in params.items())
        return f"postgresql://{quote(user)}@localhost:{self.port}/{database}" + (f"?{query}" if query else "")

    def admin_sql(self, sql: str, database: str = "postgres") -> str:
        """Run SQL as the superuser through psql (no Python driver needed); its output."""
        return self._run("psql", "-h", str(self.socket_dir), "-p", str(self.port), "-U", "postgres", "-d", database,
                         "-v", "ON_ERROR_STOP=1", "-qAt", "-c", sql)

    def stop(self, mode: str = "fast") -> None:
        """Stop the server (it keeps its data folder)."""
        self._run("pg_ctl", "-D", str(self.data), "-m", mode, "-w", "-t", "60", "stop")

    def resume(self) -> None:
        """Start a stopped server again (same data)."""
        self._pg_ctl_start()

    def restart(self) -> None:
        """Stop (fast: open connections are cut) and start again."""
        self.stop()
        self._pg_ctl_start()

    def running(self) -> bool:
        done = subprocess.run(self._cmd("pg_ctl", "-D", str(self.data), "status"), capture_output=True,
                              cwd=self.base)
        return done.returncode == 0

    def destroy(self) -> None:
        """Stop if running and delete the folder."""
        try:
            if self.running():
                self.stop("immediate")
        finally:
            for _ in range(3):
                shutil.rmtree(self.base, ignore_errors=True)
                if not self.base.exists():
                    break
                time.sleep(0.2)
