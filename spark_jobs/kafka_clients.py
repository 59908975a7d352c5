"""How Krishiv builds a librdkafka client: quiet, with its failures gathered into one line naming the cause.

librdkafka logs every failed connection attempt to stderr, several a second, for as long as a client lives: with
the broker down, ``krishiv produce`` printed hundreds of lines in 15 s. Every client Krishiv builds gets
:meth:`KafkaProblems.settings`: its log goes to a logger of its own that keeps the warnings and prints nothing, and
its errors (``error_cb``) are kept too, so that a failed call says once what went wrong (:meth:`KafkaProblems.describe`:
connection refused, authentication failed, TLS handshake failed, ...). A spec that sets ``log_level`` or ``debug``
in ``[kafka.properties]`` gets librdkafka's own log on stderr back, for debugging.

Every message is scrubbed of the client's secret settings (``sasl.password``, ...), whatever librdkafka put in it.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable, Mapping
from typing import Any

from krishiv_core.client_settings import MASK, is_secret
from krishiv_core.errors import BrokerUnavailable, ConfigError

#: The name of the logger each client's librdkafka log goes to (a logger of its own, not in logging's tree, so
#: nothing reaches the root handlers): its failure lines are kept for :meth:`KafkaProblems.cause`, then dropped.
LIBRDKAFKA_LOGGER = "krishiv.librdkafka"
#: How many log lines a client keeps (librdkafka retries for as long as it lives).
_KEPT_LINES = 50

#: Settings that hand the log back to librdkafka (stderr).
_LOG_SETTINGS = ("log_level", "debug")
#: How long a refused connection is retried before it is believed (a broker restarting answers within it).
REFUSED_GRACE_S = 1.0
#: The longest single metadata wait inside :func:`list_topics`, so that a verdict comes as soon as it is known.
_STEP_S = 0.5

#: ``sasl_ssl://127.0.0.1:9093/bootstrap: `` at the start of a librdkafka message, ``(after 28ms in state X)`` at
#: its end: the address is named once by the caller, and the state is librdkafka's own detail.
_ADDRESS_PREFIX = re.compile(r"^(?:[a-z_]+://)?[^\s:]+:\d+/[\w-]+: ")
#: ``FAIL [rdkafka#producer-1] [thrd:...]: `` at the start of a librdkafka log line.
_LOG_PREFIX = re.compile(r"^\w+ \[[^\]]*\] \[[^\]]*\]: ")
_STATE_SUFFIX = re.compile(r"\s*\(after \d+ms in state \w+\)\s*$")


class KafkaProblems:
    """The errors one client reported (``error_cb``), and the one line that names the worst of them."""

    def __init__(self, config: Mapping[str, Any] | None = None) -> None:
        self.errors: list[Any] = []
        self.lines: list[str] = []
        self.first_seen = time.monotonic()
        self._secrets = [str(v) for k, v in (config or {}).items() if is_secret(k) and v and len(str(v)) >= 3]

    def record(self, error: Any) -> None:
        self.errors.append(error)

    def settings(self, config: Mapping[str, Any]) -> dict[str, Any]:
        """``config`` with this collector as ``error_cb`` and librdkafka's log dropped (unless asked for)."""
        self._secrets = sorted(
            {*self._secrets, *(str(v) for k, v in config.items() if is_secret(k) and v and len(str(v)) >= 3)},
            key=len,
            reverse=True,
        )
        quiet: dict[str, Any] = {"error_cb": self.record}
        if not any(key in config for key in _LOG_SETTINGS):
            quiet["logger"] = self._logger()
        return {**config, **quiet}

    def _logger(self) -> logging.Logger:
        """A logger outside logging's tree whose one handler keeps librdkafka's warnings and errors here."""
        problems = self

        class Keep(logging.Handler):
            def emit(self, record: logging.LogRecord) -> None:
                if record.levelno >= logging.WARNING and len(problems.lines) < _KEPT_LINES:
                    problems.lines.append(record.getMessage())

        logger = logging.Logger(LIBRDKAFKA_LOGGER)
        logger.addHandler(Keep())
        return logger

    def serve(self, client: Any) -> None:
        """Let ``client`` deliver the errors it holds (librdkafka calls ``error_cb`` from ``poll``)."""
        poll = getattr(client, "poll", None)
        if callable(poll):
            try:
                poll(0)
            except Exception:  # a closed client has nothing more to say
                return

    def _codes(self) -> set[int]:
        return {e.code() for e in self.errors if hasattr(e, "code")}

    def fatal(self) -> bool:
        """An error that waiting will not cure: authentication or TLS failed, the host does not resolve."""
        from confluent_kafka import KafkaError

        return bool(self._codes() & {KafkaError._AUTHENTICATION, KafkaError._SSL, KafkaError._RESOLVE})

    def _texts(self) -> list[str]:
        return [_text(e) for e in self.errors] + self.lines

    def refused(self) -> bool:
        """The broker's address refused or dropped the connection: nothing that waiting is likely to change."""
        return any(word in t for t in self._texts() for word in ("Connection refused", *_CLOSED))

    def cause(self) -> str | None:
        """The most telling error, in words, or None if the client reported none."""
        from confluent_kafka import KafkaError

        by_code: dict[int, str] = {}
        for e in self.errors:
            if hasattr(e, "code"):
                by_code.setdefault(e.code(), _detail(_text(e)))
        texts = self._texts()
        for code, words in ((KafkaError._AUTHENTICATION, "SASL authentication error"), (KafkaError._SSL, "SSL")):
            said = next((t for t in self.lines if words in t), None)
            if said is not None:
                by_code.setdefault(code, _detail(said))
        if KafkaError._AUTHENTICATION in by_code:
            return (
                f"authentication failed ({by_code[KafkaError._AUTHENTICATION]}); check sasl.mechanism, "
                "sasl.username and the password's environment variable in [kafka.properties]"
            )
        if KafkaError._SSL in by_code:
            return (
                f"TLS handshake failed ({by_code[KafkaError._SSL]}); check security.protocol and "
                "ssl.ca.location in [kafka.properties]"
            )
        if KafkaError._RESOLVE in by_code:
            return f"the host name does not resolve ({by_code[KafkaError._RESOLVE]})"
        if any("Connection refused" in t for t in texts):
            return "connection refused (is the broker running, and at this address?)"
        if any(word in t for t in texts for word in _CLOSED):
            return (
                "the broker closed the connection (does its listener expect SASL or TLS? "
                "set security.protocol and the sasl.* settings in [kafka.properties])"
            )
        for e in self.errors:
            if hasattr(e, "code") and e.code() != KafkaError._ALL_BROKERS_DOWN:
                return _detail(_text(e))
        return None

    def describe(self, bootstrap: str, exc: BaseException | None = None, waited_s: float | None = None) -> str:
        """One line: the address and what went wrong, scrubbed of secrets."""
        cause = self.cause()
        if cause is None and waited_s is not None:
            cause = f"no answer within {waited_s:g}s"
        if cause is None:
            cause = _detail(_text(exc)) if exc is not None else "no answer"
        return self.scrub(f"Kafka broker at {bootstrap} is unreachable: {cause}")

    def scrub(self, text: str) -> str:
        for secret in self._secrets:
            text = text.replace(secret, MASK)
        return text


#: What librdkafka says when the broker drops the connection (a SASL or TLS listener that got a plaintext hello).
_CLOSED = ("reset by peer", "closed by peer")


def _text(error: Any) -> str:
    if hasattr(error, "str") and callable(error.str):
        return str(error.str())
    if getattr(error, "args", None) and hasattr(error.args[0], "str"):
        return str(error.args[0].str())
    return str(error)


def _detail(text: str) -> str:
    text = _STATE_SUFFIX.sub("", _ADDRESS_PREFIX.sub("", _LOG_PREFIX.sub("", text.strip())))
    return text.removeprefix("SASL authentication error: ")


def build(factory: Callable[[dict[str, Any]], Any], config: dict[str, Any], problems: KafkaProblems) -> Any:
    """``factory(config)`` made quiet; a setting librdkafka refuses is one :class:`ConfigError` line."""
    from confluent_kafka import KafkaException

    try:
        return factory(problems.settings(config))
    except (KafkaException, ValueError, TypeError) as exc:
        refused = problems.scrub(f"librdkafka refused the settings: {_text(exc)}")
        raise ConfigError("kafka.properties", refused) from None


def list_topics(
    client: Any, problems: KafkaProblems, bootstrap: str, timeout_s: float, topic: str | None = None
) -> Any:
    """``client.list_topics``, given up as soon as the outcome is known: at once on an authentication or TLS
    failure, after :data:`REFUSED_GRACE_S` of refused connections, else after ``timeout_s``.

    Raises :class:`BrokerUnavailable`, :meth:`KafkaProblems.describe`'s one line.
    """
    from confluent_kafka import KafkaException

    started = time.monotonic()
    deadline = started + timeout_s
    while True:
        step = max(0.05, min(_STEP_S, deadline - time.monotonic()))
        try:
            return client.list_topics(topic, timeout=step) if topic else client.list_topics(timeout=step)
        except KafkaException as exc:
            last: BaseException = exc
        problems.serve(client)
        now = time.monotonic()
        if problems.fatal() or (problems.refused() and now - started >= REFUSED_GRACE_S) or now >= deadline:
            if problems.cause() is None and _accepts_connections(bootstrap):
                raise BrokerUnavailable(
                    problems.scrub(
                        f"Kafka broker at {bootstrap} is unreachable: the port accepts connections but no Kafka "
                        f"answer came within {timeout_s:g}s (a TLS listener says nothing to a plaintext client: "
                        "check security.protocol in [kafka.properties])"
                    )
                )
            raise BrokerUnavailable(problems.describe(bootstrap, last, timeout_s))


def _accepts_connections(bootstrap: str) -> bool:
    """Whether the first address of ``bootstrap`` takes a TCP connection (so something listens there)."""
    import socket

    first = bootstrap.split(",")[0].strip().rsplit("/", 1)[-1]
    host, _, port = first.rpartition(":")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=1.0):
            return True
    except (OSError, ValueError):
        return False
