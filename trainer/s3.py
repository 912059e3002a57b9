"""The one place that makes boto3 S3 clients from the run config's `s3:` section.

Credentials are never in the run config: boto3 reads them from the environment (AWS_ACCESS_KEY_ID,
AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN) or the instance profile, as usual. TLS is verified unless
AWS_CA_BUNDLE points elsewhere.
"""
from __future__ import annotations

from typing import Any

from trainer.config import S3Config


def make_client(cfg: S3Config, max_pool_connections: int | None = None) -> Any:
    """A boto3 S3 client for `cfg`, with a connection pool large enough for `cfg.concurrency`."""
    import boto3
    from botocore.config import Config

    pool = max_pool_connections or max(10, cfg.concurrency + 4)
    return boto3.client(
        "s3",
        endpoint_url=cfg.endpoint_url or None,
        region_name=cfg.region,
        config=Config(
            max_pool_connections=pool,
            retries={"max_attempts": 5, "mode": "adaptive"},
            connect_timeout=10,
            read_timeout=60,
        ),
    )


def join_key(prefix: str, *parts: str) -> str:
    """Join S3 key parts with single slashes (`prefix` may be empty or end in '/')."""
    items = [p.strip("/") for p in (prefix, *parts) if p and p.strip("/")]
    return "/".join(items)


def parse_s3_url(url: str) -> tuple[str, str]:
    """'s3://bucket/key/prefix' -> ('bucket', 'key/prefix')."""
    if not url.startswith("s3://"):
        raise ValueError(f"not an s3:// URL: {url!r}")
    bucket, _, key = url[5:].partition("/")
    if not bucket:
        raise ValueError(f"no bucket in {url!r}")
    return bucket, key
