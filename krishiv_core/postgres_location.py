"""A PostgreSQL location (the ledger's, the catalog's) checked as libpq will read it, before anything connects.

libpq parses a URI and knows its parameters when a connection is made, and checks a port or a timeout only when
it connects; a location that cannot be right (it does not parse, a parameter libpq does not know, a port that is
not a number) would otherwise surface as a driver's traceback, or be retried as a server that does not answer.
Here libpq's own parser and its list of parameters judge (through psycopg's ``conninfo_to_dict`` and
``Conninfo.get_defaults``); only which parameters take a whole number is written down, since libpq does not say.
Each check returns the problem in words (secrets masked), or None: the caller names the setting and the way out.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Collection, Mapping
from functools import lru_cache
from typing import Any

from krishiv_core.runbook import runbook

#: libpq's parameters that take a whole number (``port`` apart: one per host). libpq reads them when it connects.
INTEGER_PARAMETERS = (
    "connect_timeout",
    "keepalives",
    "keepalives_idle",
    "keepalives_interval",
    "keepalives_count",
    "tcp_user_timeout",
)
#: How each PostgreSQL location is written, said when one cannot be right.
LEDGER_FORM = "postgresql://user:password@host:5432/database?schema=krishiv"
CATALOG_FORM = "postgresql+psycopg://user:password@host:5432/database"
PARAMETERS_PAGE = "https://www.postgresql.org/docs/current/libpq-connect.html#LIBPQ-PARAMKEYWORDS"
#: psycopg's words for a parameter libpq does not know: in a URI's query, and as a keyword argument.
_UNKNOWN = re.compile(r'(?:invalid URI query parameter: |invalid connection option )"(?P<name>[^"]*)"')
#: The URI libpq repeats at the end of some of its messages (masked anyway; said once, by the caller).
_ECHO = re.compile(r'(?: in URI)?: "[a-z+]+://.*"$', re.DOTALL)
_WHOLE_NUMBER = re.compile(r"\s*-?\d+\s*")


@lru_cache(maxsize=1)
def libpq_parameters() -> frozenset[str]:
    """The parameter names this libpq knows."""
    from psycopg import pq

    return frozenset(option.keyword.decode() for option in pq.Conninfo.get_defaults())


def location_refused(problem: str, setting: str, form: str) -> str:
    """The line for a location that cannot be right: the part that is wrong, then the way out."""
    return f"{problem}; correct {setting}: {form}, with libpq's parameters " + runbook(
        "A location that cannot be right"
    )


def libpq_uri_problem(uri: str, own: Collection[str] = ()) -> str | None:
    """What is wrong with ``uri`` as libpq reads it (``postgresql://``; ``postgres://`` and ``postgresql+psycopg://``
    are read as the same), or None. ``own`` names query parameters the caller reads itself and leaves out (the
    ledger's ``schema``)."""
    from psycopg import ProgrammingError
    from psycopg.conninfo import conninfo_to_dict

    rest = uri.split("://", 1)[1] if "://" in uri else uri
    base, mark, query = rest.partition("?")
    kept = [item for item in query.split("&") if item.split("=", 1)[0] not in own] if mark else []
    conninfo = "postgresql://" + base + ("?" + "&".join(kept) if kept else "")
    try:
        settings = conninfo_to_dict(conninfo)
    except ProgrammingError as exc:
        return _said(_parse_problem(str(exc), own), uri)
    return _said(_values_problem(settings), uri)


def sqlalchemy_uri_problem(uri: str) -> str | None:
    """What is wrong with a SQLAlchemy ``postgresql+psycopg://`` URI (pyiceberg's SQL catalog), or None: SQLAlchemy
    parses it, then hands host, port and the query's parameters to libpq, as its psycopg dialect does."""
    from psycopg import ProgrammingError
    from psycopg.conninfo import conninfo_to_dict, make_conninfo
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    try:
        url = make_url(uri)
    except ArgumentError:
        return "it does not parse as dialect+driver://user:password@host:port/database"
    except ValueError as exc:  # SQLAlchemy reads the port with int()
        found = re.search(r"'(?P<port>.*)'", str(exc))
        port = found.group("port") if found else ""
        several = " (several hosts go in the query: ?host=h1:5432&host=h2:5432)" if "," in port else ""
        return _said(f"port {port!r} is not a number{several}", uri)
    bad_host = next((h for h in (url.host or "").split(",") if "[" in h or "]" in h), None)
    if bad_host is not None:
        return _said(f"host {bad_host!r} is not a host name (an IPv6 address is written in brackets: [::1])", uri)
    try:
        _, connect_args = url.get_dialect()().create_connect_args(url)
        settings = conninfo_to_dict(make_conninfo("", **connect_args))
    except ProgrammingError as exc:
        return _said(_parse_problem(str(exc), ()), uri)
    except (ArgumentError, ValueError) as exc:  # the query's hosts and ports, which SQLAlchemy splits itself
        return _said(f"it does not parse: {exc}", uri)
    return _said(_values_problem(settings), uri)


def _parse_problem(message: str, own: Collection[str]) -> str:
    reason = message.strip().splitlines()[0] if message.strip() else "no reason given"
    if unknown := _UNKNOWN.search(reason):
        name = unknown.group("name")
        close = difflib.get_close_matches(name, [*libpq_parameters(), *own], n=1)
        hint = f"did you mean {close[0]}?" if close else f"libpq's parameters: {PARAMETERS_PAGE}"
        return f"unknown parameter {name!r} ({hint})"
    return f"it does not parse: {_ECHO.sub('', reason)}"


def _values_problem(settings: Mapping[str, Any]) -> str | None:
    ports = str(settings.get("port") or "")
    for port in ports.split(",") if ports else ():
        if not port:
            continue  # that host's default port
        if not _WHOLE_NUMBER.fullmatch(port):
            return f"port {port!r} is not a number"
        if not 0 < int(port) < 65536:
            return f"port {int(port)} is not between 1 and 65535"
    for name in INTEGER_PARAMETERS:
        value = settings.get(name)
        if value is not None and not _WHOLE_NUMBER.fullmatch(str(value)):
            return f"{name}={value!r} is not a whole number"
    return None


def _said(problem: str | None, uri: str) -> str | None:
    """``problem`` with ``uri``'s secrets masked (a password libpq's message repeats)."""
    from krishiv_core.catalog import redact_text  # not at the top: the catalog's module reads the spec, which uses this

    return None if problem is None else redact_text(problem, uri)
