#!/usr/bin/env python3
"""S3 sync throughput on loopback: concurrency 20 vs a single stream, download and upload.

    python bench/s3_sync.py [--files 200] [--size-kb 512] [--big-mb 64] [--endpoint-url URL]

Starts moto's S3 server on 127.0.0.1 unless --endpoint-url is given (point it at MinIO or a real
bucket to measure those). moto is a pure-Python server: on loopback it, not the network, sets the
ceiling, so the ratio between concurrency settings is the figure to read, not the MB/s.
"""
from __future__ import annotations

import argparse
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def start_moto() -> tuple[subprocess.Popen[bytes], str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    exe = shutil.which("moto_server") or str(Path(sys.executable).with_name("moto_server"))
    proc = subprocess.Popen([exe, "-H", "127.0.0.1", "-p", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    for _ in range(300):
        try:
            urllib.request.urlopen(url + "/moto-api/", timeout=1).close()
            return proc, url
        except OSError:
            time.sleep(0.1)
    proc.kill()
    raise SystemExit("moto_server did not start")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--files", type=int, default=200)
    ap.add_argument("--size-kb", type=int, default=512)
    ap.add_argument("--big-mb", type=int, default=64, help="one large object (multipart); 0 = none")
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 20])
    ap.add_argument("--endpoint-url", default="")
    args = ap.parse_args()
    os.environ.setdefault("AWS_ACCESS_KEY_ID", "testing")
    os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "testing")

    from trainer.config import S3Config
    from trainer.data.sync import S3Sync
    from trainer.s3 import make_client

    proc, url = (None, args.endpoint_url) if args.endpoint_url else start_moto()
    try:
        client = make_client(S3Config(endpoint_url=url), max_pool_connections=200)
        bucket = f"bench-{uuid.uuid4().hex[:8]}"
        client.create_bucket(Bucket=bucket)
        with tempfile.TemporaryDirectory(prefix="bench-s3-") as tmp:
            src = Path(tmp) / "src"
            src.mkdir()
            for i in range(args.files):
                (src / f"shard-{i:05d}.arrow").write_bytes(os.urandom(args.size_kb * 1024))
            if args.big_mb:
                (src / "big.bin").write_bytes(os.urandom(args.big_mb * 1024 * 1024))
            total = sum(p.stat().st_size for p in src.iterdir())
            print(f"endpoint {url}: {args.files} x {args.size_kb} KiB + {args.big_mb} MiB "
                  f"= {total / 2**20:.0f} MiB, cpu_count {os.cpu_count()}, load {os.getloadavg()[0]:.1f}")
            results = {}
            for c in args.concurrency:
                prefix = f"c{c}"
                up = S3Sync(client, bucket, prefix, concurrency=c, show_progress=False).upload(src)
                down = S3Sync(client, bucket, prefix, concurrency=c, show_progress=False).download(
                    Path(tmp) / f"dst-{c}")
                results[c] = (up.mb_per_s, down.mb_per_s)
                print(f"concurrency {c:3d}: upload {up.mb_per_s:7.1f} MiB/s ({up.seconds:.1f}s), "
                      f"download {down.mb_per_s:7.1f} MiB/s ({down.seconds:.1f}s), "
                      f"{down.files / down.seconds:.0f} files/s")
                shutil.rmtree(Path(tmp) / f"dst-{c}")
            lo, hi = min(results), max(results)
            if lo != hi:
                print(f"speed-up {hi} vs {lo}: upload x{results[hi][0] / results[lo][0]:.1f}, "
                      f"download x{results[hi][1] / results[lo][1]:.1f}")
    finally:
        if proc:
            proc.terminate()
            proc.wait(timeout=10)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
