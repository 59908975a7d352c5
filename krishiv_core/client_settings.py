"""Settings handed straight to a client library (pyiceberg, librdkafka, Spark), with secrets kept out of the spec.

A spec may pass any property to the catalog (``[iceberg.properties]``), to every Kafka client
(``[kafka.properties]``) and to Spark (``[spark.conf]``). A value may name environment variables as
``${NAME}`` (``$${`` is a literal ``${``); a property that holds a secret (a token, an OAuth2 credential, a
password, an S3 secret key, a SASL password) *must* come from one, so that a spec file can be committed, shown
in the Dagster UI and printed in a message without leaking it. The spec keeps the unresolved text; the
values are resolved only when a client is built (:func:`resolve`), and shown only through :func:`shown`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from krishiv_core.errors import ConfigError

#: ``${NAME}``, or ``$${`` for a literal ``${``.
_REFERENCE = re.compile(r"\$\$\{|\$\{([A-Za-z_][A-Za-z0-9_]*)\}")
_UNCLOSED = re.compile(r"(?<!\$)\$\{(?![A-Za-z_][A-Za-z0-9_]*\})")

#: A property whose name matches holds a secret: pyiceberg's ``token``, ``credential``, ``s3.secret-access-key``,
#: ``s3.session-token``, ``adls.account-key``, ``gcs.oauth2.token``; librdkafka's ``sasl.password``,
#: ``ssl.key.password``, ``ssl.keystore.password``, ``sasl.oauthbearer.client.secret``; a ``header.Authorization``.
_SECRET_NAME = re.compile(
    r"token|credential|password|secret|account-key|sas-token|header\.authorization|ssl\.key\.pem|private|user\.info",
    re.IGNORECASE,
)

#: What a secret is shown as.
MASK = "***"


def is_secret(name: str) -> bool:
    """Whether a property of this name holds a secret."""
    return bool(_SECRET_NAME.search(name))


def references(value: str) -> list[str]:
    """The environment variables ``value`` names, in order."""
    return [m.group(1) for m in _REFERENCE.finditer(value) if m.group(1)]


def _flatten(table: Mapping[str, Any], where: str, prefix: str = "") -> dict[str, str]:
    """TOML reads an unquoted ``sasl.mechanism = "PLAIN"`` as a nested table: join nested keys back with dots."""
    flat: dict[str, str] = {}
    for key, value in table.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            flat.update(_flatten(value, where, f"{name}."))
        elif isinstance(value, bool):
            flat[name] = str(value).lower()
        elif isinstance(value, (str, int, float)):
            flat[name] = str(value)
        else:
            raise ConfigError(f"{where}.{name}", f"expected a string, number or boolean, got {type(value).__name__}")
    return flat


def parse_properties(raw: Any, where: str, env: Mapping[str, str]) -> dict[str, str]:
    """Validate a property table of the spec; the values stay unresolved.

    Refused, with the property named: a secret written as a literal, a malformed ``${`` and a reference to a
    variable ``env`` does not set (found now rather than when a client is built mid-run).
    """
    if not isinstance(raw, dict):
        raise ConfigError(where, f"expected a table of properties, got {type(raw).__name__}")
    properties = _flatten(raw, where)
    for name, value in properties.items():
        if _UNCLOSED.search(value):
            raise ConfigError(f"{where}.{name}", "expected ${NAME} to name an environment variable (use $${ for ${)")
        names = references(value)
        if is_secret(name) and value and not names:
            raise ConfigError(
                f"{where}.{name}",
                "holds a secret: write it as ${SOME_VARIABLE} and set that variable, never in the spec file",
            )
        missing = [n for n in names if n not in env]
        if missing:
            raise ConfigError(f"{where}.{name}", f"environment variable {missing[0]} is not set")
    return properties


def resolve(properties: Mapping[str, str], env: Mapping[str, str], where: str) -> dict[str, str]:
    """The properties with every ``${NAME}`` replaced by the variable's value from ``env``."""

    def value_of(name: str, raw: str) -> str:
        def substitute(m: re.Match[str]) -> str:
            if m.group(1) is None:
                return "${"
            if m.group(1) not in env:
                raise ConfigError(f"{where}.{name}", f"environment variable {m.group(1)} is not set")
            return env[m.group(1)]

        return _REFERENCE.sub(substitute, raw)

    return {name: value_of(name, raw) for name, raw in properties.items()}


def shown(properties: Mapping[str, str]) -> dict[str, str]:
    """The properties as they may be printed: unresolved, with any secret masked all the same."""
    return {name: (MASK if is_secret(name) and value else value) for name, value in properties.items()}
