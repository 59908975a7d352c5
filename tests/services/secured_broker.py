"""Secured Kafka listeners for the tests, each started once per session and only when a test asks for it.

``sasl_tansu``: Tansu with ``--authentication``, its own SASL check. It refuses a plaintext client (it closes the
connection) and a wrong password, which is all it can do: the Tansu build on this machine stores no SCRAM
credential, so it lets nobody in (see :mod:`tests.services.scram_front`).

``secured_broker``: a SASL_SSL listener (TLS with a certificate made here, then SCRAM-SHA-512 for one user) in front
of a plaintext Tansu that advertises it, so every client, the Spark source's included, goes through TLS and SASL.
The password is exported under :data:`PASSWORD_ENV` only: a spec names it as ``${KRISHIV_TEST_KAFKA_PASSWORD}``.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
import secrets
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from krishiv.broker import broker_command, free_port
from tests.services.processes import stop

ROOT = Path(__file__).resolve().parents[2]
PASSWORD_ENV = "KRISHIV_TEST_KAFKA_PASSWORD"
USER = "krishiv-test"
START_TIMEOUT_S = 20.0
STOP_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class SecuredBroker:
    """A SASL_SSL listener: its address, the user, the variable holding the password, the CA to trust."""

    bootstrap: str
    user: str
    password_env: str
    ca_location: Path

    def properties(self, password: str | None = None) -> dict[str, str]:
        """``[kafka.properties]`` of a client of this listener; the password by reference unless one is given."""
        return {
            "security.protocol": "SASL_SSL",
            "sasl.mechanism": "SCRAM-SHA-512",
            "sasl.username": self.user,
            "sasl.password": password if password is not None else f"${{{self.password_env}}}",
            "ssl.ca.location": str(self.ca_location),
        }

    def toml(self) -> str:
        """The ``[kafka.properties]`` table of a spec file, the password as ``${VARIABLE}``."""
        rows = "".join(f'"{k}" = "{v}"\n' for k, v in self.properties().items())
        return f"\n[kafka.properties]\n{rows}"


@dataclass(frozen=True)
class SaslTansu:
    """Tansu with ``--authentication``: SASL required on a plaintext connection."""

    bootstrap: str


def wait_for_port(host: str, port: int, process: subprocess.Popen, what: str, log: Path) -> None:
    """Until ``host:port`` accepts a TCP connection; raises if ``process`` exits or :data:`START_TIMEOUT_S` passes."""
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{what} exited with code {process.returncode} while starting; see {log}")
        try:
            with socket.create_connection((host, port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.05)
    raise TimeoutError(f"{what} did not listen on {host}:{port} within {START_TIMEOUT_S:.0f}s; see {log}")


def _tansu(port: int, advertised_port: int, log: Path, *extra: str) -> subprocess.Popen:
    command = broker_command("127.0.0.1", port)
    advertised = command.index("--advertised-listener-url") + 1
    command[advertised] = f"tcp://127.0.0.1:{advertised_port}"
    with open(log, "ab") as out:
        process = subprocess.Popen(
            [*command, "--silent", *extra], stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
        )
    wait_for_port("127.0.0.1", port, process, "Tansu", log)
    return process


def self_signed_certificate(folder: Path) -> tuple[Path, Path]:
    """A certificate for 127.0.0.1 and localhost, valid for a day, and its key (PEM files in ``folder``)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    now = datetime.datetime.now(datetime.UTC)
    certificate = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = folder / "broker.crt", folder / "broker.key"
    cert_path.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    key_path.chmod(0o600)
    return cert_path, key_path


@pytest.fixture(scope="session")
def sasl_tansu(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SaslTansu]:
    folder = tmp_path_factory.mktemp("sasl-tansu")
    port = free_port()
    process = _tansu(port, port, folder / "tansu.log", "--authentication")
    try:
        yield SaslTansu(f"127.0.0.1:{port}")
    finally:
        stop(process, STOP_TIMEOUT_S)


@pytest.fixture(scope="session")
def secured_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecuredBroker]:
    folder = tmp_path_factory.mktemp("secured-broker")
    cert, key = self_signed_certificate(folder)
    password = secrets.token_urlsafe(12)
    front_port, tansu_port = free_port(), free_port()
    tansu = _tansu(tansu_port, front_port, folder / "tansu.log")
    log = folder / "front.log"
    front = None
    previous = os.environ.get(PASSWORD_ENV)
    os.environ[PASSWORD_ENV] = password
    try:
        with open(log, "ab") as out:
            front = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "tests.services.scram_front",
                    "--listen",
                    f"127.0.0.1:{front_port}",
                    "--upstream",
                    f"127.0.0.1:{tansu_port}",
                    "--cert",
                    str(cert),
                    "--key",
                    str(key),
                    "--user",
                    USER,
                    "--password-env",
                    PASSWORD_ENV,
                ],
                cwd=ROOT,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )
        wait_for_port("127.0.0.1", front_port, front, "the SASL_SSL listener", log)
        yield SecuredBroker(f"127.0.0.1:{front_port}", USER, PASSWORD_ENV, cert)
    finally:
        if front is not None:
            stop(front, STOP_TIMEOUT_S)
        stop(tansu, STOP_TIMEOUT_S)
        if previous is None:
            os.environ.pop(PASSWORD_ENV, None)
        else:
            os.environ[PASSWORD_ENV] = previous
