"""The user's inputs a command reads before it does anything: the spec file, the ledger, the tables.

Each check turns what would be a library's traceback (a folder where the spec file should be, a ledger path with
a typo, a table nothing has committed yet) into one :class:`KrishivError` line naming the input, where it came
from and what was expected. A ledger path whose folder does not exist must not read as an empty pipeline
(``0 pending, 0 committed``): the commands that only read the ledger refuse it.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import TYPE_CHECKING

from krishiv_core.errors import ConfigError, KrishivError
from krishiv_core.spec import DEFAULT_SPEC_FILE, ENV_OVERRIDES, SPEC_FILE_ENV, KrishivSpec, load_spec

if TYPE_CHECKING:
    from pyiceberg.catalog import Catalog
    from pyiceberg.table import Table

LEDGER_PATH_ENV = next(var for var, field in ENV_OVERRIDES.items() if field == "storage.ledger_path")


class LedgerMissing(KrishivError):
    """No ledger file where the spec says it is: nothing was staged there, or the path is wrong."""


class LedgerPathUnusable(KrishivError):
    """The ledger's path cannot hold a ledger (a file where its folder should be, a folder nobody may write)."""


class TableMissing(KrishivError):
    """A table of the spec is not in the catalog yet: no run has created it."""


def read_spec(path: str | None) -> KrishivSpec:
    """:func:`load_spec`, with a folder or an unreadable file named in one line instead of Python's ``OSError``."""
    given = path or os.environ.get(SPEC_FILE_ENV)
    label = "--spec" if path else f"${SPEC_FILE_ENV}" if given else "the default spec"
    where = Path(given or DEFAULT_SPEC_FILE).expanduser().resolve()
    try:
        return load_spec(path)
    except IsADirectoryError:
        raise ConfigError(
            "spec", f"{label} {where} is a folder; expected a TOML spec file such as {where / DEFAULT_SPEC_FILE}"
        ) from None
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        raise ConfigError("spec", f"cannot read {label} {where} ({reason}); expected a readable TOML file") from None


def _ledger_label() -> str:
    return f"${LEDGER_PATH_ENV}" if os.environ.get(LEDGER_PATH_ENV) else "storage.ledger_path"


def require_ledger(spec: KrishivSpec, lock_timeout_s: float) -> str:
    """The ledger's location; :class:`LedgerMissing` if there is none (a typo, or nothing staged yet)."""
    label = _ledger_label()
    if spec.ledger_on_server:
        from outbox.ledger import Ledger

        location = spec.ledger_location()
        ledger = Ledger(location, lock_timeout_s)
        if not ledger.exists():
            raise LedgerMissing(
                f"no ledger in {ledger.path}: nothing has been staged there yet; expected the ledger `krishiv run` "
                f"writes (run it first, or check {label} and its schema=)"
            )
        return location
    path = Path(spec.ledger_location())
    if path.is_file():
        return str(path)
    if path.is_dir():
        raise LedgerPathUnusable(f"{label} {path} is a folder; expected the ledger file `krishiv run` writes")
    expected = f"expected the ledger `krishiv run` writes (run it first, or check {label})"
    if not path.parent.is_dir():
        raise LedgerMissing(f"no ledger at {path}: its folder {path.parent} does not exist; {expected}")
    raise LedgerMissing(f"no ledger at {path}: nothing has been staged there yet; {expected}")


def require_writable_ledger(spec: KrishivSpec) -> str:
    """The ledger's location, a file's folder made; :class:`LedgerPathUnusable` naming the path if it cannot hold
    one. A PostgreSQL ledger is the server's to refuse (its first write makes the schema)."""
    if spec.ledger_on_server:
        return spec.ledger_location()
    path = Path(spec.ledger_location())
    label = _ledger_label()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        above = next((p for p in path.parents if p.exists()), None)
        if above is not None and not above.is_dir():
            raise LedgerPathUnusable(
                f"{label} {path}: {above} is a file, not a folder; expected a folder the ledger can be written in"
            ) from None
        raise LedgerPathUnusable(
            f"{label} {path}: cannot make its folder {path.parent} ({exc.strerror}); "
            "expected a folder this user can write"
        ) from None
    if path.is_dir():
        raise LedgerPathUnusable(f"{label} {path} is a folder; expected the path of the ledger file")
    if not os.access(path.parent, os.W_OK | os.X_OK) or (path.exists() and not os.access(path, os.R_OK | os.W_OK)):
        raise LedgerPathUnusable(
            f"{label} {path}: this user may not write there (permission denied); expected a writable folder"
        )
    return path


def load_table(catalog: Catalog, name: str, address: str) -> Table:
    """The table ``name``; :class:`TableMissing` naming it and the catalog (``address``, redacted) if absent."""
    from pyiceberg.exceptions import NoSuchNamespaceError, NoSuchTableError

    try:
        return catalog.load_table(name)
    except (NoSuchTableError, NoSuchNamespaceError):
        raise TableMissing(
            f"table {name} is not in the catalog {address} yet; `krishiv run` creates it and `krishiv commit` fills it"
        ) from None


def command_spec(args: argparse.Namespace) -> KrishivSpec:
    """The spec a command works with: the file named (``--spec``, ``$KRISHIV_SPEC``) or ``./krishiv.toml``. Where
    none is named or found, ``krishiv topic`` works with the broker alone (``--bootstrap``,
    ``$KRISHIV_KAFKA_BOOTSTRAP`` or the local default: ``krishiv init --topic`` needs the topic first) and ``krishiv
    demo`` with its classic pipeline (:func:`krishiv.demo.classic_spec`); ``krishiv topic --bootstrap`` always does."""
    found = bool(args.spec or os.environ.get(SPEC_FILE_ENV)) or Path(DEFAULT_SPEC_FILE).exists()
    if args.command == "topic" and (args.bootstrap is not None or not found):
        return broker_spec(args.bootstrap)
    if args.command == "demo" and not found:
        from krishiv.demo import classic_spec

        return classic_spec()
    return read_spec(args.spec)


def broker_spec(bootstrap: str | None) -> KrishivSpec:
    """A spec of no pipeline whose broker is ``bootstrap``, ``$KRISHIV_KAFKA_BOOTSTRAP``, or the local default."""
    from krishiv_core.spec_sections import IcebergSettings, KafkaSettings, SparkSettings, StorageSettings

    address = bootstrap or os.environ.get("KRISHIV_KAFKA_BOOTSTRAP") or KafkaSettings.bootstrap_servers
    kafka = KafkaSettings(bootstrap_servers=address)
    return KrishivSpec(kafka, IcebergSettings(), StorageSettings(), SparkSettings(), ())
