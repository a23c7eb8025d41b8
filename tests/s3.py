"""An S3-compatible server for tests: moto's server on 127.0.0.1 (a free port), one bucket, the standard AWS
environment variables pointing at it.

    from tests.s3 import s3_server  # noqa: F401  (makes the fixture visible to the test module)

    def test_something(s3_server):
        fs = fsspec.filesystem("s3")                      # finds the server through AWS_ENDPOINT_URL
        fs.pipe(f"{s3_server.bucket}/x", b"...")
        # Beam: FileSystems / the job with --s3_endpoint_url=s3_server.endpoint (see tests/formats/test_s3_server.py)

Loopback only, so it runs inside the tests' network namespace. Each test gets a fresh server (moto keeps its
state in the process: a shared server would leak objects between tests).
"""

from __future__ import annotations

import socket
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

REGION = "us-east-1"


@dataclass(frozen=True)
class S3Server:
    endpoint: str
    """http://127.0.0.1:PORT"""
    bucket: str
    """A bucket created empty for the test."""

    def url(self, key: str = "") -> str:
        return f"s3://{self.bucket}/{key}"

    def beam_args(self) -> list[str]:
        """Beam's own flags for this server (Beam 2.77 also finds it through AWS_ENDPOINT_URL: boto3 reads it)."""
        return [f"--s3_endpoint_url={self.endpoint}", f"--s3_region_name={REGION}"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def s3_server(monkeypatch: pytest.MonkeyPatch) -> Iterator[S3Server]:
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=_free_port(), verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    for key, value in {
        "AWS_ENDPOINT_URL": endpoint,
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": REGION,
    }.items():
        monkeypatch.setenv(key, value)
    for key in ("AWS_SESSION_TOKEN", "AWS_PROFILE", "AWS_ENDPOINT_URL_S3"):
        monkeypatch.delenv(key, raising=False)
    # no ~/.aws files: the test sees only the variables above
    monkeypatch.setenv("AWS_CONFIG_FILE", "/nonexistent/aws-config")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent/aws-credentials")
    import boto3

    bucket = "scifolio-test"
    boto3.client("s3", endpoint_url=endpoint, region_name=REGION).create_bucket(Bucket=bucket)
    try:
        yield S3Server(endpoint, bucket)
    finally:
        server.stop()
