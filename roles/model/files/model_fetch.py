#!/usr/bin/env python3
"""Fetch a model directory at a pinned revision and verify it by file list, size and sha256 (role model).

    model_fetch.py fetch SOURCE DEST         # SOURCE: /local/path | s3://bucket/prefix | hf://org/name@sha
    model_fetch.py verify DEST [--source S]  # exit 0 when DEST matches its manifest (and source S), else 1
    model_fetch.py stage SRC DEST            # copy a verified local model to DEST (e.g. /dev/shm) unless
                                             # DEST already holds it; refuses when DEST lacks the space

A fetch copies every file, then writes DEST/.model.json (source, {relative path: size} and {relative
path: sha256}) last, so an interrupted fetch never verifies. A manifest without digests (written before
they were recorded) does not verify, so the model is fetched again once. Files whose size differs from
the previous manifest are removed before the fetch, so a damaged copy is fetched again (huggingface_hub
also re-checks files it finds against the Hub's ETag). `verify` checks the manifest against the disk
(every file present with its size) and, when the model has a `model.safetensors.index.json`, that every
shard it names is there and that the shards hold at least the index's `metadata.total_size` bytes.

`stage` trusts nothing in DEST: DEST (often under the world-writable /dev/shm) must be absent or a
directory of this process's user that no one else may write, else it is refused (another local user made
it); a copy there is kept only if the sha256 of every file it holds equals the model's manifest, and a new
copy is checked the same way before it is used, so the bytes served are the bytes fetched.

Standard library only, except boto3 (S3 sources) and huggingface_hub (hf:// sources), imported when
used, and safepath.py (copied next to this file; trainer/safepath.py in the repository), which refuses
every S3 key, repository file name or source file whose path would leave DEST: an absolute part, `..`,
a symlink pointing out. Every name is checked before anything is written. S3 credentials come from the
environment (AWS_*, and S3_ENDPOINT_URL for non-AWS endpoints); the HF token from HF_TOKEN, the Hub's
address from HF_ENDPOINT. `fetch --secrets-stdin` reads the secrets instead as one JSON object on standard
input ({"HF_TOKEN": ..., "AWS_ACCESS_KEY_ID": ..., "AWS_SECRET_ACCESS_KEY": ..., "AWS_SESSION_TOKEN": ...}),
so they are on no command line and in no parent's environment (role model passes them so).
Errors name the model and the fix: a revision the repository lacks, a
repository that does not exist or refuses the token, a bucket the credentials cannot read, no space.
"""

from __future__ import annotations

import argparse
import errno
import hashlib
import json
import os
import shutil
import sys
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

try:
    from safepath import UnsafePathError, inside
except ImportError:  # run from the repository, where it lives in the trainer package
    from trainer.safepath import UnsafePathError, inside

MANIFEST = ".model.json"
INDEX = "model.safetensors.index.json"
REQUIRED = ("config.json",)


class ModelError(RuntimeError):
    """A model directory that cannot be used; the message names the file at fault."""


def scan(root: Path, links: bool = True) -> dict[str, int]:
    """{relative path: size} of every regular file under root, the manifest and partial files excluded.
    links=False leaves symlinks out: what a fetch writes is regular files only, so a link in a fetched
    model was put there by someone else and is never listed, hashed or staged."""
    out = {}
    for p in sorted(root.rglob("*")):
        rel = p.relative_to(root).as_posix()
        if not links and p.is_symlink():
            continue
        if p.is_file() and rel != MANIFEST and not rel.endswith(".part") and not rel.startswith(".cache/"):
            out[rel] = p.stat().st_size
    return out


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(1 << 22):
            h.update(chunk)
    return h.hexdigest()


def digests(root: Path, files: dict[str, int], workers: int = 8) -> dict[str, str]:
    """{relative path: sha256} of the given files under root (hashlib releases the GIL: files in parallel)."""
    names = sorted(files)
    with ThreadPoolExecutor(workers) as pool:
        return dict(zip(names, pool.map(lambda rel: sha256_of(root / rel), names), strict=True))


def check_digests(root: Path, want: dict[str, str], have: dict[str, str] | None = None) -> None:
    """Every file's sha256 under root (or `have`, hashed already) equals want's; ModelError naming the
    first that does not."""
    have = digests(root, dict.fromkeys(want, 0)) if have is None else have
    for rel in sorted(want):
        if have.get(rel) != want[rel]:
            raise ModelError(f"{root / rel}: content differs from the model's manifest "
                             f"(sha256 {have.get(rel, '?')[:12]}…, manifest says {want[rel][:12]}…)")


def check_shards(root: Path, files: dict[str, int]) -> None:
    for name in REQUIRED:
        if name not in files:
            raise ModelError(f"{root}: {name} is missing")
    if INDEX not in files:
        return
    try:
        index = json.loads((root / INDEX).read_text())
        shards = sorted(set(index["weight_map"].values()))
        total = int(index.get("metadata", {}).get("total_size", 0))
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ModelError(f"{root / INDEX}: unreadable safetensors index ({e})") from e
    missing = [s for s in shards if s not in files]
    if missing:
        raise ModelError(
            f"{root}: {len(missing)} shard(s) named in {INDEX} are missing: {', '.join(missing[:5])}"
        )
    have = sum(files[s] for s in shards)
    if have < total:
        raise ModelError(f"{root}: shards hold {have} bytes, fewer than the index's total_size {total}")


def manifest_of(root: Path) -> dict:
    """root's manifest: source, files {path: size} and sha256 {path: digest}, each checked for shape."""
    mpath = root / MANIFEST
    if not mpath.is_file():
        raise ModelError(f"{root}: no {MANIFEST} (never fetched, or the fetch did not finish)")
    try:
        manifest = json.loads(mpath.read_text())
        listed, sums = manifest["files"], manifest.get("sha256")
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ModelError(f"{mpath}: unreadable manifest ({e})") from e
    if not isinstance(sums, dict) or set(sums) != set(listed):
        raise ModelError(f"{mpath}: no sha256 for every file (written before digests were recorded): "
                         f"fetch again")
    return manifest


def verify(root: Path, source: str | None = None) -> dict[str, int]:
    """Check root against its manifest (and, given, the source it was fetched from); return its file sizes.
    Sizes only: the digests are checked where the bytes are used (stage)."""
    manifest = manifest_of(root)
    listed = manifest["files"]
    if source is not None and manifest.get("source") != source:
        raise ModelError(f"{root}: fetched from {manifest.get('source')!r}, not {source!r}")
    disk = scan(root, links=False)
    for rel, size in listed.items():
        if rel not in disk:
            raise ModelError(f"{root / rel}: listed in the manifest but missing")
        if disk[rel] != size:
            raise ModelError(f"{root / rel}: {disk[rel]} bytes on disk, manifest says {size}")
    check_shards(root, listed)
    return listed


def _copy_local(src: Path, dest: Path, ready: Callable[[], None], only: dict[str, int] | None = None) -> None:
    if not src.is_dir():
        raise ModelError(f"{src}: model source is not a directory")
    targets = {}
    for rel in scan(src) if only is None else only:
        try:
            targets[rel] = inside(dest, rel)
        except UnsafePathError as e:
            raise ModelError(f"{src / rel}: cannot be copied ({e})") from None
    ready()
    for rel, target in targets.items():
        target.parent.mkdir(parents=True, exist_ok=True)
        part = target.with_name(target.name + ".part")
        part.unlink(missing_ok=True)  # never write through a link left there
        shutil.copyfile(src / rel, part)
        os.replace(part, target)


def _copy_s3(url: str, dest: Path, ready: Callable[[], None], workers: int = 16) -> None:
    try:
        import boto3
    except ImportError as e:
        raise ModelError(f"{url}: an s3:// model source needs boto3 in the fetching Python") from e
    bucket, _, prefix = url[len("s3://") :].partition("/")
    prefix = prefix.rstrip("/") + "/" if prefix else ""
    s3 = boto3.client("s3", endpoint_url=os.environ.get("S3_ENDPOINT_URL") or None)
    from botocore.exceptions import BotoCoreError, ClientError

    try:
        keys = [
            o["Key"]
            for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
            for o in page.get("Contents", [])
            if not o["Key"].endswith("/")
        ]
    except ClientError as e:
        code = e.response.get("Error", {}).get("Code", "?")
        raise ModelError(
            f"{url}: S3 refused the listing ({code}): check the bucket name and that the keys given "
            f"(AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY) may read it"
        ) from None
    except BotoCoreError as e:
        raise ModelError(f"{url}: S3 is unreachable or the credentials are missing ({e})") from None
    if not keys:
        raise ModelError(f"{url}: no objects under this prefix")
    targets = {}
    for key in keys:  # all checked before any is fetched
        try:
            targets[key] = inside(dest, key[len(prefix) :])
        except UnsafePathError as e:
            raise ModelError(f"s3://{bucket}/{key}: unsafe object key ({e})") from None

    def one(key: str) -> None:
        target = targets[key]
        target.parent.mkdir(parents=True, exist_ok=True)
        part = target.with_name(target.name + ".part")
        s3.download_file(bucket, key, str(part))
        os.replace(part, target)

    ready()
    with ThreadPoolExecutor(workers) as pool:
        list(pool.map(one, keys))


def _copy_hf(url: str, dest: Path, ready: Callable[[], None]) -> None:
    try:
        from huggingface_hub import HfApi, snapshot_download
    except ImportError as e:
        raise ModelError(f"{url}: an hf:// model source needs huggingface_hub (in the SGLang venv)") from e
    from huggingface_hub import errors as hf_errors

    repo, _, rev = url[len("hf://") :].partition("@")
    token = os.environ.get("HF_TOKEN") or None
    hub = os.environ.get("HF_ENDPOINT") or "https://huggingface.co"
    try:
        # Only recent huggingface_hub releases check the repository's file names (older ones let `..`
        # through on Linux): checked here before anything is downloaded.
        for name in HfApi(token=token).list_repo_files(repo, revision=rev or None):
            try:
                inside(dest, name)
            except UnsafePathError as e:
                raise ModelError(f"{url}: unsafe file name in the repository ({e})") from None
        ready()
        snapshot_download(repo_id=repo, revision=rev or None, local_dir=str(dest), token=token)
    except hf_errors.RevisionNotFoundError:
        raise ModelError(
            f"{url}: {repo} on {hub} has no revision {rev!r}; set the model's revision to a commit "
            f"sha of the repository (Files and versions, History)"
        ) from None
    except hf_errors.GatedRepoError:
        raise ModelError(
            f"{url}: {repo} on {hub} is gated: accept its terms with the account whose token "
            f"is given (HF_TOKEN{'' if token else ', not set'})"
        ) from None
    except hf_errors.RepositoryNotFoundError:
        raise ModelError(
            f"{url}: {repo} does not exist on {hub}, or the token given cannot read it "
            f"(HF_TOKEN{'' if token else ' is not set'})"
        ) from None
    except hf_errors.HfHubHTTPError as e:
        raise ModelError(f"{url}: {hub} answered {e}".splitlines()[0]) from None


def _drop_damaged(dest: Path) -> list[str]:
    """Remove the files whose size differs from the previous manifest; return their names."""
    try:
        listed = json.loads((dest / MANIFEST).read_text())["files"]
    except (OSError, ValueError, KeyError, TypeError):
        return []
    dropped = []
    for rel, size in listed.items():
        try:
            path = inside(dest, rel)
        except UnsafePathError:
            continue
        if path.is_file() and path.stat().st_size != size:
            path.unlink()
            dropped.append(rel)
    return dropped


def fetch(source: str, dest: Path, only: dict[str, int] | None = None) -> dict[str, int]:
    """Fetch source into dest. The source is listed and every name checked first; only then are damaged
    files and the old manifest removed, so a source that fails there (a revision the repository lacks, a
    refused token, an unsafe name) leaves a good copy as it was, still verifying."""
    dest.mkdir(parents=True, exist_ok=True)

    def ready() -> None:
        for rel in _drop_damaged(dest):
            print(
                f"model: {dest / rel}: size differs from the last fetch, fetching it again", file=sys.stderr
            )
        (dest / MANIFEST).unlink(missing_ok=True)

    if source.startswith("s3://"):
        _copy_s3(source, dest, ready)
    elif source.startswith("hf://"):
        _copy_hf(source, dest, ready)
    elif source.startswith(("http://", "https://")):
        raise ModelError(
            f"{source}: unsupported model source (use a path, s3://bucket/prefix or hf://org/name)"
        )
    else:
        _copy_local(Path(source), dest, ready, only)
    files = scan(dest, links=False)
    check_shards(dest, files)
    tmp = dest / (MANIFEST + ".part")
    manifest = {"source": source, "files": files, "sha256": digests(dest, files)}
    tmp.write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
    os.replace(tmp, dest / MANIFEST)
    return files


def _own_dir(dest: Path) -> None:
    """Refuse a dest this process's user did not make, or that others may write (a world-writable parent
    such as /dev/shm lets any local user create it first and fill it)."""
    try:
        st = dest.lstat()
    except FileNotFoundError:
        return
    if not os.path.isdir(dest) or os.path.islink(dest):
        raise ModelError(f"{dest}: exists and is not a directory; remove it")
    if st.st_uid != os.geteuid() or st.st_mode & 0o022:
        raise ModelError(
            f"{dest}: made by uid {st.st_uid} (mode {st.st_mode & 0o777:o}), not by this service's user "
            f"(uid {os.geteuid()}) with no group or other write: refused, since another local user could "
            f"have placed what it holds; remove it"
        )


def stage(src: Path, dest: Path) -> dict[str, int]:
    """Copy the verified model at src to dest unless dest already holds the same bytes (sha256 of every
    file against src's manifest); a new copy is checked the same way before it is used."""
    files = verify(src)
    want = manifest_of(src)["sha256"]
    _own_dir(dest)
    if dest.is_dir() and scan(dest, links=False) == files:
        try:
            check_digests(dest, want)
            return files
        except ModelError as e:
            print(f"model: {e}; staging again", file=sys.stderr)
    need = sum(files.values())
    probe = dest if dest.exists() else dest.parent
    probe.mkdir(parents=True, exist_ok=True)
    have = shutil.disk_usage(probe).free + sum(scan(dest).values() if dest.is_dir() else [0])
    if have < need:
        raise ModelError(
            f"{dest}: staging {src} needs {need / 2**30:.2f} GiB, only {have / 2**30:.2f} GiB free there"
        )
    if dest.is_dir():
        shutil.rmtree(dest)
    dest.mkdir(mode=0o700, parents=True)
    staged = fetch(str(src), dest, only=files)  # the manifest's files, nothing else found there
    # The copy's digests (hashed from its bytes by fetch) against the source's manifest: a mismatch is a
    # source whose bytes changed under its manifest, or a copy gone wrong.
    check_digests(src, want, have=manifest_of(dest)["sha256"])
    return staged


SECRET_NAMES = ("HF_TOKEN", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN")


def secrets_from(text: str) -> dict[str, str]:
    """The secrets a JSON object on stdin gives (empty values dropped); ModelError naming what is wrong."""
    try:
        given = json.loads(text or "{}")
    except json.JSONDecodeError as e:
        raise ModelError(f"--secrets-stdin: standard input is not a JSON object ({e.msg})") from None
    if not isinstance(given, dict):
        raise ModelError("--secrets-stdin: standard input is not a JSON object")
    unknown = sorted(set(given) - set(SECRET_NAMES))
    if unknown:
        raise ModelError(f"--secrets-stdin: unknown name(s) {', '.join(unknown)} "
                         f"(known: {', '.join(SECRET_NAMES)})")
    bad = sorted(k for k, v in given.items() if not isinstance(v, str))
    if bad:
        raise ModelError(f"--secrets-stdin: {', '.join(bad)} must be a string")
    return {k: v for k, v in given.items() if v}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    f = sub.add_parser("fetch")
    f.add_argument("source")
    f.add_argument("dest", type=Path)
    f.add_argument("--secrets-stdin", action="store_true",
                   help="read HF_TOKEN / AWS_* as one JSON object on standard input")
    v = sub.add_parser("verify")
    v.add_argument("dest", type=Path)
    v.add_argument("--source", default=None)
    s = sub.add_parser("stage")
    s.add_argument("src", type=Path)
    s.add_argument("dest", type=Path)
    args = p.parse_args(argv)
    try:
        if args.cmd == "fetch":
            if args.secrets_stdin:
                os.environ.update(secrets_from(sys.stdin.read()))
            files = fetch(args.source, args.dest)
        elif args.cmd == "stage":
            files = stage(args.src, args.dest)
        else:
            files = verify(args.dest, args.source)
    except ModelError as e:
        print(f"model: {e}", file=sys.stderr)
        return 1
    except OSError as e:
        if e.errno != errno.ENOSPC:
            raise
        where = args.dest
        free = shutil.disk_usage(where if where.exists() else where.parent).free / 2**30
        print(
            f"model: {where}: no space left on the device ({free:.2f} GiB free); make room or point the "
            f"model's directory at a larger filesystem",
            file=sys.stderr,
        )
        return 1
    print(json.dumps({"files": len(files), "bytes": sum(files.values())}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
