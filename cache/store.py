"""Latent blob stores: a local directory (default) or S3 (boto3), holding fp16 safetensors blobs.

A blob is one latent of one prompt at one K, encoded as safetensors with the latent's shape, dtype,
model, scheduler, N, K and a SHA-256 of the tensor bytes in the header metadata, so a truncated
or corrupted blob is detected on read (:class:`BlobCorrupt`) instead of feeding noise to a worker.

Keys are made by the cache from its own prompt ids (``blob_key``), never from user text, and every
store method re-checks them against one pattern: no path traversal, no odd S3 keys.

Errors: a missing blob raises :class:`BlobMissing`, a damaged one :class:`BlobCorrupt` (both are a
miss for the cache, which then repairs its index); anything else that goes wrong talking to the
store raises :class:`~cache.api.CacheUnavailable`.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import struct
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Protocol, runtime_checkable

import numpy as np

from argusdiff.errors import ArgusdiffError, ConfigError
from cache.api import CacheUnavailable, LatentMeta

__all__ = [
    "BlobCorrupt",
    "BlobMissing",
    "BlobStore",
    "LocalDirStore",
    "S3Store",
    "blob_key",
    "decode_latent",
    "encode_latent",
    "parse_blob_key",
]

_KEY_RE = re.compile(r"^([0-9a-f]{2})/([0-9a-f]{32})/k(\d{1,4})\.safetensors$")
_PROMPT_ID_RE = re.compile(r"^[0-9a-f]{32}$")
_TENSOR = "latent"
FORMAT = "argusdiff-latent/1"


class BlobMissing(ArgusdiffError):
    """The blob a key names does not exist (a miss; the cache repairs its index entry)."""


class BlobCorrupt(ArgusdiffError):
    """The blob exists but cannot be decoded or fails its checksum (a miss; the cache deletes it)."""


def blob_key(prompt_id: str, k: int) -> str:
    """The store key of ``prompt_id``'s latent after ``k`` steps: ``ab/<32 hex>/k0010.safetensors``."""
    if not isinstance(prompt_id, str) or not _PROMPT_ID_RE.match(prompt_id):
        raise ValueError(f"prompt id must be 32 lowercase hex digits (got {prompt_id!r})")
    if not 0 <= int(k) <= 9999:
        raise ValueError(f"K must be in 0..9999 (got {k!r})")
    return f"{prompt_id[:2]}/{prompt_id}/k{int(k):04d}.safetensors"


def parse_blob_key(key: str) -> tuple[str, int]:
    """``(prompt_id, k)`` of a key made by :func:`blob_key`; ValueError for anything else."""
    m = _KEY_RE.match(key)
    if not m or m.group(1) != m.group(2)[:2]:
        raise ValueError(f"not a latent cache key: {key!r}")
    return m.group(2), int(m.group(3))


def _check_key(key: str) -> str:
    parse_blob_key(key)
    return key


# --- Encoding ----------------------------------------------------------------------------------


def encode_latent(latent: np.ndarray, meta: LatentMeta) -> bytes:
    """fp16 safetensors bytes of ``latent`` with ``meta`` (shape taken from the array)."""
    with np.errstate(over="ignore", invalid="ignore"):  # overflow is reported below as non-finite
        arr = np.ascontiguousarray(np.asarray(latent), dtype=np.float16)
    if arr.size == 0:
        raise ValueError("latent is empty")
    if not np.isfinite(arr).all():
        raise ValueError("latent has NaN or infinite values (after conversion to float16)")
    from safetensors.numpy import save

    metadata = {
        "format": FORMAT,
        "model": str(meta.model),
        "scheduler": str(meta.scheduler),
        "steps": str(int(meta.steps)),
        "k": str(int(meta.k)),
        "shape": json.dumps(list(arr.shape)),
        "dtype": "float16",
        "sha256": hashlib.sha256(arr.tobytes()).hexdigest(),
        "extra": json.dumps(dict(meta.extra), sort_keys=True),
    }
    return save({_TENSOR: arr}, metadata=metadata)


def _header(data: bytes) -> dict:
    if len(data) < 8:
        raise BlobCorrupt(f"blob too short ({len(data)} bytes)")
    (n,) = struct.unpack("<Q", data[:8])
    if n > len(data) - 8 or n > 1 << 20:
        raise BlobCorrupt(f"blob header length {n} exceeds the blob ({len(data)} bytes)")
    try:
        return json.loads(data[8 : 8 + n])
    except ValueError as exc:
        raise BlobCorrupt(f"blob header is not JSON: {exc}") from None


def decode_latent(data: bytes) -> tuple[np.ndarray, LatentMeta]:
    """Inverse of :func:`encode_latent`; raises :class:`BlobCorrupt` on any damage."""
    md = _header(data).get("__metadata__") or {}
    if md.get("format") != FORMAT:
        raise BlobCorrupt(f"blob format is {md.get('format')!r}, expected {FORMAT!r}")
    from safetensors.numpy import load

    try:
        arr = load(bytes(data))[_TENSOR]
        meta = LatentMeta(
            model=md["model"],
            scheduler=md["scheduler"],
            steps=int(md["steps"]),
            k=int(md["k"]),
            shape=tuple(int(x) for x in json.loads(md["shape"])),
            dtype=md["dtype"],
            extra=json.loads(md.get("extra") or "{}"),
        )
    except Exception as exc:  # safetensors raises its own error type on truncated data
        raise BlobCorrupt(f"blob does not decode: {type(exc).__name__}: {exc}") from None
    if arr.dtype != np.float16 or tuple(arr.shape) != meta.shape:
        raise BlobCorrupt(f"blob tensor is {arr.dtype}{tuple(arr.shape)}, header says float16{meta.shape}")
    if hashlib.sha256(np.ascontiguousarray(arr).tobytes()).hexdigest() != md.get("sha256"):
        raise BlobCorrupt("blob checksum mismatch")
    return arr, meta


# --- Stores ------------------------------------------------------------------------------------


@runtime_checkable
class BlobStore(Protocol):
    """Bytes by key. Keys come from :func:`blob_key`."""

    description: str

    def put(self, key: str, data: bytes) -> None: ...

    def get(self, key: str) -> bytes: ...

    def delete(self, key: str) -> None: ...

    def delete_many(self, keys: Iterable[str]) -> int:
        """Delete many blobs (missing ones are no error); returns how many keys were given."""
        ...

    def keys(self) -> Iterator[str]: ...

    def close(self) -> None: ...


class LocalDirStore:
    """Blobs as files under ``root`` (written to a temporary name, then renamed: never half a blob)."""

    def __init__(self, root: str | os.PathLike[str], *, fsync: bool = False) -> None:
        self.root = Path(root).expanduser()
        self.fsync = fsync
        try:
            self.root.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise CacheUnavailable(f"local blob store {self.root}: cannot create folder: {exc}") from None
        self.description = f"local:{self.root}"

    def _path(self, key: str) -> Path:
        return self.root / _check_key(key)

    def put(self, key: str, data: bytes) -> None:
        path = self._path(key)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=".part")
            try:
                with os.fdopen(fd, "wb") as fh:
                    fh.write(data)
                    if self.fsync:
                        fh.flush()
                        os.fsync(fh.fileno())
                os.replace(tmp, path)
            except BaseException:
                Path(tmp).unlink(missing_ok=True)
                raise
        except OSError as exc:
            raise CacheUnavailable(f"local blob store {self.root}: cannot write {key}: {exc}") from None

    def get(self, key: str) -> bytes:
        path = self._path(key)
        try:
            return path.read_bytes()
        except FileNotFoundError:
            raise BlobMissing(f"local blob store {self.root}: no blob {key}") from None
        except OSError as exc:
            raise CacheUnavailable(f"local blob store {self.root}: cannot read {key}: {exc}") from None

    def delete(self, key: str) -> None:
        path = self._path(key)
        try:
            path.unlink(missing_ok=True)
            for parent in (path.parent, path.parent.parent):
                try:
                    parent.rmdir()  # only when empty
                except OSError:
                    break
        except OSError as exc:
            raise CacheUnavailable(f"local blob store {self.root}: cannot delete {key}: {exc}") from None

    def delete_many(self, keys: Iterable[str]) -> int:
        n = 0
        for key in keys:
            self.delete(key)
            n += 1
        return n

    def keys(self) -> Iterator[str]:
        for path in self.root.glob("??/*/k*.safetensors"):
            key = path.relative_to(self.root).as_posix()
            try:
                yield _check_key(key)
            except ValueError:
                continue

    def close(self) -> None:
        pass


def _delete_objects_md5(params, **_kwargs) -> None:
    body = params.get("body")
    if isinstance(body, bytes | bytearray) and "Content-MD5" not in params.get("headers", {}):
        params["headers"]["Content-MD5"] = _b64md5(bytes(body))


def _b64md5(data: bytes) -> str:
    return base64.b64encode(hashlib.md5(data).digest()).decode("ascii")  # S3 integrity header, not security


class S3Store:
    """Blobs as objects ``<prefix><key>`` in an S3 bucket (AWS or any S3 server, path-style).

    Every put carries a Content-MD5 header (the server rejects a body damaged in transit). The
    client uses SigV4, path-style addressing, short timeouts and few retries: a slow store must
    surface as :class:`CacheUnavailable` quickly so the router can switch AC to SM.
    """

    def __init__(
        self,
        bucket: str,
        *,
        prefix: str = "",
        endpoint_url: str | None = None,
        region: str | None = None,
        create_bucket: bool = True,
        connect_timeout_s: float = 2.0,
        read_timeout_s: float = 5.0,
        max_attempts: int = 2,
        client=None,
    ) -> None:
        if not bucket:
            raise ConfigError("s3_bucket: a bucket name is required for the S3 blob store")
        if ".." in prefix or prefix.startswith("/") or not re.fullmatch(r"[A-Za-z0-9._/-]*", prefix):
            raise ConfigError(f"s3_prefix: letters, digits, '._/-' only, no '..' or leading '/' (got {prefix!r})")
        if prefix and not prefix.endswith("/"):
            prefix += "/"
        self.bucket = bucket
        self.prefix = prefix
        self.endpoint_url = endpoint_url
        self.description = f"s3://{bucket}/{prefix}" + (f" at {endpoint_url}" if endpoint_url else "")
        import boto3
        from botocore.config import Config

        if client is None:
            cfg = Config(
                s3={"addressing_style": "path"},
                signature_version="s3v4",
                connect_timeout=connect_timeout_s,
                read_timeout=read_timeout_s,
                retries={"max_attempts": max_attempts, "mode": "standard"},
                # Flexible checksums would switch uploads to aws-chunked encoding, which S3
                # servers other than AWS (e.g. Swift s3api) refuse; Content-MD5 covers integrity.
                request_checksum_calculation="when_required",
                response_checksum_validation="when_required",
            )
            client = boto3.session.Session().client(
                "s3", endpoint_url=endpoint_url, region_name=region or os.environ.get("AWS_DEFAULT_REGION"), config=cfg
            )
        # DeleteObjects must carry Content-MD5 on S3 servers such as Swift s3api; boto3 >= 1.36
        # no longer sends it by itself.
        client.meta.events.register("before-call.s3.DeleteObjects", _delete_objects_md5)
        self.client = client
        if create_bucket:
            self._ensure_bucket()

    def _err(self, action: str, exc: Exception) -> CacheUnavailable:
        return CacheUnavailable(f"S3 blob store {self.description}: {action} failed: {type(exc).__name__}: {exc}")

    def _ensure_bucket(self) -> None:
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            self.client.head_bucket(Bucket=self.bucket)
            return
        except ClientError as exc:
            code = str(exc.response.get("Error", {}).get("Code", ""))
            if code not in ("404", "NoSuchBucket", "NotFound"):
                raise self._err("head_bucket", exc) from None
        except BotoCoreError as exc:
            raise self._err("head_bucket", exc) from None
        try:
            self.client.create_bucket(Bucket=self.bucket)
        except ClientError as exc:
            code = str(exc.response.get("Error", {}).get("Code", ""))
            if code not in ("BucketAlreadyOwnedByYou", "BucketAlreadyExists"):
                raise self._err("create_bucket", exc) from None
        except BotoCoreError as exc:
            raise self._err("create_bucket", exc) from None

    def _object(self, key: str) -> str:
        return self.prefix + _check_key(key)

    def put(self, key: str, data: bytes) -> None:
        from botocore.exceptions import BotoCoreError, ClientError

        obj = self._object(key)
        try:
            self.client.put_object(
                Bucket=self.bucket,
                Key=obj,
                Body=data,
                ContentMD5=_b64md5(data),
                ContentType="application/octet-stream",
            )
        except (BotoCoreError, ClientError) as exc:
            raise self._err(f"put {obj}", exc) from None

    def get(self, key: str) -> bytes:
        from botocore.exceptions import BotoCoreError, ClientError

        obj = self._object(key)
        try:
            resp = self.client.get_object(Bucket=self.bucket, Key=obj)
            return resp["Body"].read()
        except ClientError as exc:
            code = str(exc.response.get("Error", {}).get("Code", ""))
            if code in ("NoSuchKey", "404", "NotFound"):
                raise BlobMissing(f"S3 blob store {self.description}: no blob {key}") from None
            raise self._err(f"get {obj}", exc) from None
        except BotoCoreError as exc:
            raise self._err(f"get {obj}", exc) from None

    def delete(self, key: str) -> None:
        from botocore.exceptions import BotoCoreError, ClientError

        obj = self._object(key)
        try:
            self.client.delete_object(Bucket=self.bucket, Key=obj)
        except ClientError as exc:
            code = str(exc.response.get("Error", {}).get("Code", ""))
            if code not in ("NoSuchKey", "404", "NotFound"):
                raise self._err(f"delete {obj}", exc) from None
        except BotoCoreError as exc:
            raise self._err(f"delete {obj}", exc) from None

    def delete_many(self, keys: Iterable[str]) -> int:
        """Batched DeleteObjects (1,000 keys per request)."""
        from botocore.exceptions import BotoCoreError, ClientError

        objs = [self._object(k) for k in keys]
        for i in range(0, len(objs), 1000):
            batch = objs[i : i + 1000]
            try:
                resp = self.client.delete_objects(
                    Bucket=self.bucket, Delete={"Objects": [{"Key": o} for o in batch], "Quiet": True}
                )
            except (BotoCoreError, ClientError) as exc:
                raise self._err(f"delete {len(batch)} objects", exc) from None
            errors = [e for e in resp.get("Errors", []) if e.get("Code") not in ("NoSuchKey", "404")]
            if errors:
                first = errors[0]
                raise CacheUnavailable(
                    f"S3 blob store {self.description}: {len(errors)} deletes failed, e.g. "
                    f"{first.get('Key')}: {first.get('Code')} {first.get('Message')}"
                )
        return len(objs)

    def keys(self) -> Iterator[str]:
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            pages = self.client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=self.prefix)
            for page in pages:
                for item in page.get("Contents", []):
                    key = item["Key"][len(self.prefix) :]
                    try:
                        yield _check_key(key)
                    except ValueError:
                        continue
        except (BotoCoreError, ClientError) as exc:
            raise self._err("list", exc) from None

    def close(self) -> None:
        close = getattr(self.client, "close", None)
        if close is not None:
            close()
