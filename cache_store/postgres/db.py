"""One connection to the cache's PostgreSQL server: transactions, errors that say what to do, reconnects.

psycopg 3 is imported only when a server is used. Every server error becomes a CacheError whose message
names the server without its password: CacheUnavailableError when the server cannot be reached (down,
restarting, refused credentials), ManifestError otherwise. A broken connection is dropped and the next call
connects again, so a server restart costs the calls made while it was down, nothing more.
"""
from __future__ import annotations

import contextlib
import threading
from typing import Any, Iterator, Sequence

from ..errors import CacheError, CacheUnavailableError, ManifestError
from .deadline import Deadline, connect_timeout, timeout_settings
from .url import ServerURL, redact

INSTALL_HINT = ("the PostgreSQL cache backend needs psycopg 3: run `python -m pip install 'psycopg[binary]>=3.1'` "
                "with ComfyUI's Python, then restart ComfyUI")


def driver() -> Any:
    """The psycopg module, or a CacheError that says how to install it."""
    try:
        import psycopg
    except ImportError as exc:
        raise CacheError(INSTALL_HINT) from exc
    return psycopg


def _advice(text: str) -> tuple[str, bool]:
    """What to do about a connection failure, and whether it may pass by itself (a server restarting)."""
    low = text.lower()
    if "ssl" in low or "certificate" in low or "encryption" in low:
        return ("check the TLS settings in the URL (sslmode, sslrootcert, sslcert, sslkey) against the server's",
                False)
    if "pg_hba" in low:
        return ("the server's pg_hba.conf does not admit this user, host and database: ask its administrator",
                False)
    if "password" in low or "authentication" in low or ("role" in low and "does not exist" in low):
        return ("check the credentials: the password comes from the URL in CHAI_CACHE_URL / CHAI_CACHE_URL_FILE, "
                "PGPASSWORD or ~/.pgpass", False)
    if "does not exist" in low and "database" in low:
        return "create the database on the server (createdb) or fix the database name in the URL", False
    if "invalid" in low:
        return "fix the connection URL's options", False
    return "lookups are misses and nothing is stored until it is reachable again", True


IDLE_IN_TRANSACTION = "60s"


class PgDb:
    """A lazily (re)connected psycopg connection whose search_path is one cache's schema."""

    PINNED_JOIN = "JOIN"  # ranking.rank: PostgreSQL plans the join order itself
    INSTR = "strpos"  # ranking.rank: the position of a substring, 0 when absent
    ID_LIST = "string_agg(({})::text, ',')"  # ranking: a group's values as one comma-joined text
    POSTINGS_SCAN = "postings p"  # ranking.rank: its planner picks the index
    LATE_IDS = True  # an entry's id is drawn before the writer lock: a lower one can commit after a higher one

    def __init__(self, server: ServerURL, schema: str, timeout_s: float | None = None) -> None:
        self.server = server
        self.schema = schema
        self.timeout_s = timeout_s  # per statement, lock wait and connection attempt (None: no limit)
        self._conn: Any = None
        self._lock = threading.RLock()
        self._deadline = Deadline()
        self.psycopg = driver()

    # ------------------------------------------------------------------ errors
    def _message(self, exc: BaseException) -> str:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        return redact(first, *self.server.secrets)

    def unavailable(self, exc: BaseException) -> CacheUnavailableError:
        """The error for a server that cannot be reached, naming it without its password."""
        text = self._message(exc)
        if self.timeout_s is not None and "timeout expired" in text.lower():  # connected, but no answer
            return self.timed_out()
        advice, transient = _advice(text)
        return CacheUnavailableError(f"the cache server {self.server.label} is unreachable ({text}); {advice}",
                                     transient)

    def timed_out(self) -> CacheUnavailableError:
        """The error for a server that did not answer within the limit (frozen, overloaded, cut off)."""
        return CacheUnavailableError(
            f"the cache server {self.server.label} did not answer within {self.timeout_s:g} s (frozen, overloaded "
            "or cut off by the network); lookups are misses and nothing is stored until it answers again "
            "(the limit is StoreConfig.server_timeout_s)", True)

    def _translate(self, exc: BaseException) -> CacheError:
        pg = self.psycopg
        if self._deadline.fired:
            self._drop()
            return self.timed_out()
        if isinstance(exc, (pg.errors.QueryCanceled, pg.errors.LockNotAvailable)) and self.timeout_s is not None:
            return self.timed_out()
        if isinstance(exc, pg.errors.DiskFull):  # SQLSTATE 53100: the server is up, its disk is not
            return ManifestError(f"the cache server {self.server.label}'s disk is full ({self._message(exc)}): "
                                 "free space on the server, or lower the budget with prune --budget-gb")
        if isinstance(exc, (pg.OperationalError, pg.InterfaceError)) and not isinstance(
                exc, pg.errors.QueryCanceled):
            self._drop()
            return self.unavailable(exc)
        if isinstance(exc, pg.errors.InsufficientPrivilege):
            return ManifestError(f"the cache server {self.server.label} refused: {self._message(exc)}; grant this "
                                 "role CREATE on the database (or have an administrator create the cache schema)")
        return ManifestError(f"the cache server {self.server.label} reported: {self._message(exc)}; "
                             "run `python -m comfyui_chai.cache_store --url ... --name <name> verify`")

    # ------------------------------------------------------------------ connection
    def _drop(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            try:
                conn.close()
            except Exception:  # closing a broken connection may raise anything; it is gone either way
                pass

    def connection(self) -> Any:
        """The open connection (connecting if needed)."""
        with self._lock:
            if self._conn is not None and not self._conn.closed and not self._conn.broken:
                return self._conn
            self._drop()
            self._deadline.fired = False
            pg = self.psycopg
            try:
                conn = pg.connect(self.server.connect_url(connect_timeout(self.timeout_s)), autocommit=True,
                                  application_name="comfyui-chai")
                conn.execute(pg.sql.SQL("SET search_path TO {}").format(pg.sql.Identifier(self.schema)))
                self._set_timeouts(conn, self.timeout_s)
                # A worker machine that vanishes inside a transaction would hold the state lock until TCP gives
                # up (hours): the server ends such a session after this long instead.
                conn.execute(f"SET idle_in_transaction_session_timeout = '{IDLE_IN_TRANSACTION}'")
                # Single statements (a hit's recency update) commit without waiting for the server's disk; every
                # write transaction turns the wait back on (write()), so what insert returns is durable.
                conn.execute("SET synchronous_commit = off")
            except pg.Error as exc:
                raise self._translate(exc) from None
            self._conn = conn
            return conn

    def _set_timeouts(self, conn: Any, timeout_s: float | None) -> None:
        for key, value in timeout_settings(timeout_s).items():
            conn.execute(f"SET {key} = {value}")

    def _timed_out(self, exc: BaseException) -> bool:
        """True when the deadline cut the call, or the server gave up on a statement or lock wait itself."""
        errors = self.psycopg.errors
        return self._deadline.fired or (self.timeout_s is not None and isinstance(
            exc, (errors.QueryCanceled, errors.LockNotAvailable)))

    @contextlib.contextmanager
    def limited(self, timeout_s: float | None) -> Iterator[None]:
        """Another time limit inside (None: none), for calls known to take long; other threads wait."""
        with self._lock:
            saved, self.timeout_s = self.timeout_s, timeout_s
            try:
                if saved != timeout_s and self._conn is not None:
                    self._set_timeouts(self.connection(), timeout_s)
                yield
            finally:
                self.timeout_s = saved
                if saved != timeout_s and self._conn is not None:
                    try:
                        self._set_timeouts(self._conn, saved)
                    except self.psycopg.Error:
                        self._drop()

    def unbounded(self) -> contextlib.AbstractContextManager[None]:
        """No time limit inside: maintenance that reads every blob may take minutes."""
        return self.limited(None)

    def ping(self) -> None:
        """Make sure the connection works before a write (a stale one after a server restart is replaced)."""
        self.query("SELECT 1")

    @contextlib.contextmanager
    def transaction(self, readonly: bool = False, snapshot: bool = False, binary: bool = False) -> Iterator[Any]:
        """A transaction's cursor; committed on success, rolled back on error. `snapshot`: one consistent view
        (REPEATABLE READ) for reads that span several statements; `binary`: bytea arrives as raw bytes."""
        with self._lock:
            conn = self.connection()
            pg = self.psycopg
            try:
                conn.isolation_level = pg.IsolationLevel.REPEATABLE_READ if snapshot else None
                conn.read_only = True if readonly else None
                with self._deadline.around(conn, self.timeout_s), conn.transaction():
                    yield conn.cursor(binary=binary)
            except pg.Error as exc:
                raise self._translate(exc) from None

    @contextlib.contextmanager
    def write(self) -> Iterator[Any]:
        """A durable read-write transaction (after a ping, so a stale connection is replaced first): its commit
        returns once the server has it on disk."""
        self.ping()
        with self.transaction() as cur:
            cur.execute("SET LOCAL synchronous_commit = on")
            yield cur

    def read(self) -> contextlib.AbstractContextManager[Any]:
        """A read-only snapshot transaction."""
        return self.transaction(readonly=True, snapshot=True)

    def query(self, sql: str, params: Sequence[Any] = (), binary: bool = False) -> list[tuple]:
        """One statement (autocommit, not waiting for the disk: reads and recency updates only) with '?'
        placeholders, as the ranking writes them for SQLite too; retried once on a fresh connection when the old
        one broke (a server restart since the last call)."""
        text = sql.replace("%", "%%").replace("?", "%s")
        pg = self.psycopg
        with self._lock:
            for attempt in (0, 1):
                conn = self.connection()
                try:
                    with self._deadline.around(conn, self.timeout_s):
                        return conn.cursor(binary=binary).execute(text, list(params)).fetchall()
                except (pg.OperationalError, pg.InterfaceError) as exc:
                    self._drop()
                    if self._timed_out(exc):
                        raise self.timed_out() from None
                    if attempt:
                        raise self.unavailable(exc) from None
                except pg.Error as exc:
                    raise self._translate(exc) from None
        raise AssertionError("unreachable")

    def close(self) -> None:
        """Close the connection."""
        with self._lock:
            self._drop()
