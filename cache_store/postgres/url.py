"""Which backend a cache uses, from a node input or the environment; connection URLs never shown with a password.

"" (the node's default) -> $CHAI_CACHE_URL, else the contents of the file $CHAI_CACHE_URL_FILE, else the local
cache folder. "local" -> the local folder even when the variables are set. "postgresql://..." -> that server.
A URL typed on a node is saved in the workflow (and in every image's or video's metadata), so it may not carry
a password: the password comes from the environment (the URL in CHAI_CACHE_URL, PGPASSWORD), a file
(CHAI_CACHE_URL_FILE, PGPASSFILE / ~/.pgpass) or a client certificate. TLS settings travel in the URL's query
(sslmode, sslrootcert, sslcert, sslkey) and go to libpq unchanged.
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import parse_qsl, quote, unquote, urlsplit

from ..errors import CacheError

URL_ENV = "CHAI_CACHE_URL"
URL_FILE_ENV = "CHAI_CACHE_URL_FILE"
LOCAL = "local"
SCHEMES = ("postgresql", "postgres")
DEFAULT_CONNECT_TIMEOUT = "5"  # seconds; a server that is down turns into a miss quickly, not a hung workflow
MASK = "***"


class BackendURLError(CacheError, ValueError):
    """A connection URL that cannot be used (unknown scheme, a password typed on a node, unreadable file)."""


@dataclass(frozen=True)
class ServerURL:
    """A PostgreSQL connection URL and where it came from; `shown` is safe to print."""

    url: str
    source: str  # "node", "CHAI_CACHE_URL" or "CHAI_CACHE_URL_FILE"

    def __repr__(self) -> str:
        return f"ServerURL({self.shown!r}, source={self.source!r})"  # never the password (logs, tracebacks)

    __str__ = __repr__

    @property
    def shown(self) -> str:
        """The URL with any password masked (what reports and logs print)."""
        return mask_url(self.url)

    @property
    def password(self) -> str | None:
        """The password inside the URL, if any (to redact from server messages)."""
        return _password(self.url)

    @property
    def secrets(self) -> tuple[str, ...]:
        """Every form the password may take in a message: decoded, as written in the URL, re-encoded."""
        decoded = self.password
        if not decoded:
            return ()
        netloc = urlsplit(self.url).netloc
        userinfo = netloc.rpartition("@")[0]
        raw = userinfo.split(":", 1)[1] if ":" in userinfo else decoded
        return tuple(dict.fromkeys(s for s in (decoded, raw, quote(decoded, safe="")) if s))

    @property
    def label(self) -> str:
        """postgresql://user@host:port/database, without password or options: how reports name the server."""
        parts = urlsplit(self.url)
        params = dict(parse_qsl(parts.query))
        user = unquote(parts.username or "") or params.get("user", "")
        host = unquote(parts.hostname or "") or params.get("host", "")
        port = parts.port if parts.port else params.get("port", "")
        database = unquote(parts.path.lstrip("/")) or params.get("dbname", "")
        return f"postgresql://{user + '@' if user else ''}{host}{':' + str(port) if port else ''}/{database}"

    def connect_url(self, timeout: str | None = None) -> str:
        """The URL handed to libpq: a connect timeout (`timeout` seconds, else 5) is added unless the URL sets
        one."""
        params = dict(parse_qsl(urlsplit(self.url).query))
        if "connect_timeout" in params:
            return self.url
        return self.url + ("&" if "?" in self.url else "?") + f"connect_timeout={timeout or DEFAULT_CONNECT_TIMEOUT}"


def _password(url: str) -> str | None:
    netloc = urlsplit(url).netloc
    userinfo = netloc.rpartition("@")[0] if "@" in netloc else ""
    if ":" not in userinfo:
        params = dict(parse_qsl(urlsplit(url).query))
        return params.get("password")
    return unquote(userinfo.split(":", 1)[1])


def mask_url(url: str) -> str:
    """`url` with the password of its user part and any password=... parameter replaced by ***."""
    url = re.sub(r"(?i)(password=)[^&\s]*", rf"\g<1>{MASK}", url)
    return re.sub(r"^([a-z][a-z0-9+.-]*://[^:/@?#]*):[^@/?#]*@", rf"\g<1>:{MASK}@", url, flags=re.I)


def redact(text: str, *secrets: str | None) -> str:
    """`text` with every given secret (and every URL password in it) replaced by ***; libpq quotes the whole
    token of a URL it cannot decode, which may be or hold the password."""
    for secret in sorted((s for s in secrets if s), key=len, reverse=True):
        text = text.replace(secret, MASK)
    text = re.sub(r'(invalid percent-encoded token: )"[^"]*"', rf'\g<1>"{MASK}"', text)
    return re.sub(r"([a-z][a-z0-9+.-]*://[^:/@?#\s]*):[^@/?#\s]*@", rf"\g<1>:{MASK}@",
                  re.sub(r"(?i)(password=)[^&\s]*", rf"\g<1>{MASK}", text), flags=re.I)


def _check(url: str, source: str) -> ServerURL:
    scheme = urlsplit(url).scheme.lower() if "://" in url else ""
    if scheme not in SCHEMES:
        shown = mask_url(url) if "://" in url else "(not a URL)"
        raise BackendURLError(
            f"cache server URL from {source} must start with postgresql:// (got {shown}); leave it empty for the "
            f"local cache folder, or '{LOCAL}' to force it")
    return ServerURL(url, source)


def from_option(value: str, option: str) -> ServerURL | None:
    """A URL given on a command line (errors name `option`, e.g. --url), or None for 'local'."""
    value = value.strip()
    return None if value.lower() in ("", LOCAL) else _check(value, option)


def resolve(node_value: str | None = None, environ: dict[str, str] | None = None) -> ServerURL | None:
    """The server a cache uses, or None for the local folder (see the module docstring for the order)."""
    env = os.environ if environ is None else environ
    value = (node_value or "").strip()
    if value.lower() == LOCAL:
        return None
    if value:
        checked = _check(value, "the node")
        if checked.password:
            raise BackendURLError(
                "a cache server URL on a node may not contain a password: the workflow (and every output's "
                f"metadata) would carry it. Put the password in {URL_ENV} or {URL_FILE_ENV} on the worker, or in "
                "PGPASSWORD or a ~/.pgpass file; the node then needs only " + checked.shown.replace(f":{MASK}", ""))
        return ServerURL(value, "node")
    if env.get(URL_ENV, "").strip():
        raw = env[URL_ENV].strip()
        return None if raw.lower() == LOCAL else _check(raw, URL_ENV)
    path = env.get(URL_FILE_ENV, "").strip()
    if path:
        try:
            raw = Path(path).expanduser().read_text(encoding="utf-8").strip()
        except (OSError, UnicodeDecodeError) as exc:
            raise BackendURLError(f"{URL_FILE_ENV}={path}: cannot read the URL file ({exc})") from exc
        if not raw:
            raise BackendURLError(f"{URL_FILE_ENV}={path}: the file is empty; write the postgresql:// URL in it")
        return _check(raw, URL_FILE_ENV)
    return None
