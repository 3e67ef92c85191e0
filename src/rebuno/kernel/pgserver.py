"""One PostgreSQL server and database as given by a URL: the libpq parameters a kernel
connects with, its name in messages (host, port and database, never the password), and driver
messages with the password masked. Shared by the store and the stream bus, which must not
import each other.
Must import only psycopg and the domain.
"""

from __future__ import annotations

from typing import Any

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from rebuno.kernel.domain.errors import Unavailable

_CONNECT_TIMEOUT_SECONDS = 5


class Server:
    """One PostgreSQL server and database, as given by a `postgres://` or `postgresql://` URL."""

    __slots__ = ("_conninfo", "_password", "name")

    def __init__(self, url: str, application_name: str = "rebuno") -> None:
        try:
            params = conninfo_to_dict(url)
        except psycopg.ProgrammingError as exc:
            # libpq quotes the whole URL in its message, password included.
            reason = first_line(exc).replace(url, "<url>")
            raise Unavailable(f"invalid PostgreSQL URL: {reason}") from None
        self._password = str(params.get("password") or "")
        self.name = _describe(params)
        self._conninfo = make_conninfo(url, **_session_defaults(params, application_name))

    @property
    def conninfo(self) -> str:
        """libpq parameters, password included: never log this."""
        return self._conninfo

    def reason(self, exc: BaseException) -> str:
        """The driver's message for `exc`, first line only, with the password masked."""
        text = first_line(exc)
        return text.replace(self._password, "***") if self._password else text

    def unavailable(self, exc: BaseException) -> Unavailable:
        """An `Unavailable` naming this server (host, port, database) and the reason."""
        return Unavailable(f"PostgreSQL {self.name} is unavailable: {self.reason(exc)}")


def _session_defaults(params: dict[str, Any], application_name: str) -> dict[str, Any]:
    # Timestamps come back in UTC whatever the server's or role's default time zone is.
    options = f"{params.get('options') or ''} -c TimeZone=UTC".strip()
    defaults: dict[str, Any] = {"options": options}
    if not params.get("connect_timeout"):
        defaults["connect_timeout"] = _CONNECT_TIMEOUT_SECONDS
    if not params.get("application_name"):
        defaults["application_name"] = application_name
    return defaults


def _describe(params: dict[str, Any]) -> str:
    host = str(params.get("host") or params.get("hostaddr") or "localhost")
    port = str(params.get("port") or "5432")
    database = str(params.get("dbname") or params.get("user") or "postgres")
    return f"{host}:{port}/{database}"


def first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
