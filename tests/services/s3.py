"""A local S3 endpoint: moto's server on loopback, with signature checks on, and one bucket.

Started once per session, and only when a test asks for ``s3``. moto checks every request's signature against
the IAM access keys it knows (``INITIAL_NO_AUTH_ACTION_COUNT``: only the first three requests, which create the
user, its policy and its key, go unsigned), so a client that did not get the endpoint *and* the keys (a Spark
task whose FileIO was rebuilt without them, say) fails instead of passing unnoticed. The secret key is exported
in the environment under :data:`SECRET_ENV` only: a spec names it as ``${KRISHIV_TEST_S3_SECRET_ACCESS_KEY}``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from krishiv.broker import free_port
from tests.services.processes import stop

MOTO_SERVER = Path(sys.executable).with_name("moto_server")
SECRET_ENV = "KRISHIV_TEST_S3_SECRET_ACCESS_KEY"
BUCKET = "krishiv-warehouse"
REGION = "us-east-1"
START_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 10.0
#: The unsigned requests moto accepts before it checks signatures: create the user, its policy, its key.
_UNSIGNED_SETUP_REQUESTS = 3


@dataclass(frozen=True)
class S3Endpoint:
    """A running S3 endpoint with one bucket and the keys of a user allowed everything in it."""

    endpoint: str
    bucket: str
    region: str
    access_key_id: str
    secret_env: str  # the environment variable holding the secret access key
    log: Path

    def iceberg_properties(self) -> str:
        """The ``[iceberg.properties]`` of a spec whose warehouse is in the bucket: the secret by reference only."""
        return (
            "\n[iceberg.properties]\n"
            f'"s3.endpoint" = "{self.endpoint}"\n'
            f'"s3.region" = "{self.region}"\n'
            f'"s3.access-key-id" = "{self.access_key_id}"\n'
            f'"s3.secret-access-key" = "${{{self.secret_env}}}"\n'
        )

    def client(self) -> Any:
        """A boto3 S3 client signed with the user's keys."""
        import boto3

        return boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            region_name=self.region,
            aws_access_key_id=self.access_key_id,
            aws_secret_access_key=os.environ[self.secret_env],
        )

    def objects(self, prefix: str = "") -> dict[str, int]:
        """Every object of the bucket under ``prefix``, as ``s3://bucket/key`` with its size."""
        found: dict[str, int] = {}
        for page in self.client().get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=prefix):
            for item in page.get("Contents", ()):
                found[f"s3://{self.bucket}/{item['Key']}"] = item["Size"]
        return found


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return response.status == 200
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        return False


def _wait_until_up(process: subprocess.Popen, url: str, log: Path) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"moto_server exited with {process.returncode}; see {log}")
        if _answers(url):
            return
        time.sleep(0.1)
    raise TimeoutError(f"moto_server did not answer at {url} in {START_TIMEOUT_S:.0f}s; see {log}")


def _create_user(endpoint: str) -> tuple[str, str]:
    """An IAM user allowed every S3 action, and its access key (id, secret): moto's first, unsigned requests."""
    import boto3

    iam = boto3.client(
        "iam", endpoint_url=endpoint, region_name=REGION, aws_access_key_id="setup", aws_secret_access_key="setup"
    )
    iam.create_user(UserName="krishiv")
    policy = {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "s3:*", "Resource": "*"}]}
    iam.put_user_policy(UserName="krishiv", PolicyName="s3", PolicyDocument=json.dumps(policy))
    key = iam.create_access_key(UserName="krishiv")["AccessKey"]
    return key["AccessKeyId"], key["SecretAccessKey"]


@pytest.fixture(scope="session")
def s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Endpoint]:
    log = tmp_path_factory.mktemp("s3") / "moto.log"
    port = free_port()
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "KRISHIV_"))},
        "INITIAL_NO_AUTH_ACTION_COUNT": str(_UNSIGNED_SETUP_REQUESTS),
    }
    with log.open("wb") as out:
        process = subprocess.Popen(
            [str(MOTO_SERVER), "--host", "127.0.0.1", "--port", str(port)],
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
        )
    try:
        endpoint = f"http://127.0.0.1:{port}"
        _wait_until_up(process, f"{endpoint}/moto-api/", log)
        access_key_id, secret = _create_user(endpoint)
        os.environ[SECRET_ENV] = secret
        s3 = S3Endpoint(endpoint, BUCKET, REGION, access_key_id, SECRET_ENV, log)
        s3.client().create_bucket(Bucket=BUCKET)
        yield s3
    finally:
        os.environ.pop(SECRET_ENV, None)
        stop(process, STOP_TIMEOUT_S)
