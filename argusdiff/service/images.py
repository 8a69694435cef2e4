"""Where finished images go: the output format a client asked for, and the image store.

* :func:`encode` turns a worker's PNG into the requested ``output_format`` (PNG as is; JPEG or
  WebP at ``output_compression``, the encoder's quality 0–100, default 100).
* The image store holds the images the router must keep beyond its memory: those of ``url``
  responses and those nobody was waiting for when they finished (``wait: false``, a timed-out
  wait), until ``result_ttl_s``. A local folder (:class:`LocalImageStore`, served at
  ``GET /v1/images/{id}``) or the S3 bucket of the latent cache (:class:`S3ImageStore`; ``url``
  responses are presigned GET URLs that expire with the result, or the router's route when the
  store has no address clients can reach). Both reuse the latent cache's
  blob stores (atomic writes, Content-MD5, the same S3 client settings) with their own key rule.

Image ids are ``<request id>.<format>``: 96 random bits per generation, so an id is as hard to
guess as a signed URL.

**Claim check (distributed mode).** Redis carries no image bytes: a worker writes each image into
the image store (:func:`image_id`, in the format the request asked for) and its result in Redis
names it (``image_ref``); a streamed partial image goes there too (:func:`partial_id`, PNG) and
its step event carries the key; an edit's input image and mask are written there by the router
(:func:`input_id`) and the work item names them. The router reads the image from the store when it
answers. The router announces its image store with the deployment (:func:`store_spec`), and a worker
whose ``[service] image_store`` is ``auto`` writes to that one (:func:`store_from_spec`).
"""

from __future__ import annotations

import io
import logging
import re
import time
from pathlib import Path
from typing import Any, Protocol

from argusdiff.errors import ArgusdiffError
from cache.api import CacheUnavailable
from cache.store import BlobMissing, LocalDirStore, S3Store

__all__ = [
    "CONTENT_TYPES",
    "ImageStore",
    "ImageStoreUnavailable",
    "LocalImageStore",
    "S3ImageStore",
    "build_image_store",
    "check_key",
    "encode",
    "image_id",
    "input_id",
    "partial_id",
    "store_from_spec",
    "store_spec",
    "worker_image_store",
]

log = logging.getLogger("argusdiff.service")

CONTENT_TYPES = {"png": "image/png", "jpeg": "image/jpeg", "webp": "image/webp"}
_ID_RE = re.compile(r"^gen-[0-9a-f]{24}-\d{1,3}\.(png|jpeg|webp)$")
#: every key of the store: a final image, a partial image (``.p<step>``), an edit's input (``.in``, ``.mask``)
_KEY_RE = re.compile(r"^gen-[0-9a-f]{24}-\d{1,3}(\.p\d{1,5}|\.in|\.mask)?\.(png|jpeg|webp)$")
_PIL_FORMATS = {"jpeg": "JPEG", "webp": "WEBP"}


class ImageStoreUnavailable(ArgusdiffError):
    """The image store (folder or S3) failed."""


def image_id(request_id: str, output_format: str) -> str:
    return f"{request_id}.{output_format}"


def partial_id(request_id: str, step: int) -> str:
    """The key of a streamed partial image (PNG) decoded after ``step``."""
    return f"{request_id}.p{int(step)}.png"


def input_id(request_id: str, part: str) -> str:
    """The key of an edit's input image (``part`` = ``in``) or mask (``mask``), PNG."""
    if part not in ("in", "mask"):
        raise ValueError(f"not an input part: {part!r}")
    return f"{request_id}.{part}.png"


def check_image_id(key: str) -> str:
    """A final image's id (what ``GET /v1/images/{id}`` serves)."""
    if not isinstance(key, str) or not _ID_RE.match(key):
        raise ValueError(f"not an image id: {key!r}")
    return key


def check_key(key: str) -> str:
    """Any key of the image store: a final image, a partial image or an edit's input."""
    if not isinstance(key, str) or not _KEY_RE.match(key):
        raise ValueError(f"not an image store key: {key!r}")
    return key


def content_type(key: str) -> str:
    return CONTENT_TYPES[key.rsplit(".", 1)[-1]]


def encode(png: bytes, output_format: str = "png", compression: int | None = None) -> bytes:
    """``png`` in ``output_format``; JPEG and WebP at quality ``compression`` (default 100).
    Images are opaque: an alpha channel is flattened onto white for JPEG."""
    if output_format == "png":
        return png
    from PIL import Image

    with Image.open(io.BytesIO(png)) as img:
        rgb = img.convert("RGB")
    out = io.BytesIO()
    rgb.save(out, format=_PIL_FORMATS[output_format], quality=100 if compression is None else int(compression))
    return out.getvalue()


class ImageStore(Protocol):
    description: str
    presigned: bool  # url() points at the store itself (else at GET /v1/images/{id} on the router)

    def put(self, key: str, data: bytes) -> None: ...

    def get(self, key: str) -> bytes:
        """Raises :class:`~cache.store.BlobMissing` when there is no such image."""
        ...

    def delete(self, key: str) -> None: ...

    def url(self, key: str, base_url: str, ttl_s: float) -> str: ...

    def sweep(self, max_age_s: float) -> int:
        """Delete images older than ``max_age_s``; returns how many."""
        ...

    def close(self) -> None: ...


class LocalImageStore(LocalDirStore):
    """Images as files in one folder, served by the router at ``GET /v1/images/{id}``."""

    presigned = False

    def __init__(self, root: str | Path) -> None:
        super().__init__(root)
        self.description = f"local:{self.root}"

    def _path(self, key: str) -> Path:
        return self.root / check_key(key)

    def delete(self, key: str) -> None:
        try:
            self._path(key).unlink(missing_ok=True)
        except OSError as exc:
            raise CacheUnavailable(f"image store {self.root}: cannot delete {key}: {exc}") from None

    def url(self, key: str, base_url: str, ttl_s: float) -> str:
        return f"{base_url}/v1/images/{check_image_id(key)}"

    def sweep(self, max_age_s: float) -> int:
        cutoff = time.time() - max_age_s
        n = 0
        for path in self.root.glob("gen-*"):
            try:
                if _KEY_RE.match(path.name) and path.stat().st_mtime < cutoff:
                    path.unlink(missing_ok=True)
                    n += 1
            except OSError:
                continue
        return n


class S3ImageStore(S3Store):
    """Images as objects ``<prefix><id>`` in the latent cache's bucket. ``url`` responses are
    presigned GET URLs (SigV4) valid as long as the result is, signed for the address clients
    reach the store at: ``public_url`` (e.g. a MinIO behind its own public name), or AWS itself
    when no endpoint is set. A store on a private endpoint with no public address is served by
    the router instead (``url`` → ``GET /v1/images/{id}``, which reads the object)."""

    def __init__(self, bucket: str, *, public_url: str | None = None, **kwargs: Any) -> None:
        super().__init__(bucket, **kwargs)
        self.public_url = public_url
        self.presigned = public_url is not None or self.endpoint_url is None
        self._signer = None

    def _signing_client(self) -> Any:
        if self.public_url is None or self.public_url == self.endpoint_url:
            return self.client
        if self._signer is None:  # signing needs no network: only the host clients will use
            import boto3

            self._signer = boto3.session.Session().client(
                "s3", endpoint_url=self.public_url, region_name=self.client.meta.region_name,
                config=self.client.meta.config,
            )  # fmt: skip
        return self._signer

    def _object(self, key: str) -> str:
        return self.prefix + check_key(key)

    def put(self, key: str, data: bytes) -> None:
        from botocore.exceptions import BotoCoreError, ClientError

        from cache.store import _b64md5

        obj = self._object(key)
        try:
            self.client.put_object(
                Bucket=self.bucket, Key=obj, Body=data, ContentMD5=_b64md5(data), ContentType=content_type(key)
            )
        except (BotoCoreError, ClientError) as exc:
            raise self._err(f"put {obj}", exc) from None

    def url(self, key: str, base_url: str, ttl_s: float) -> str:
        if not self.presigned:
            return f"{base_url}/v1/images/{check_image_id(key)}"
        expires = max(1, min(int(ttl_s), 7 * 24 * 3600))  # SigV4 presigned URLs live at most 7 days
        return self._signing_client().generate_presigned_url(
            "get_object", Params={"Bucket": self.bucket, "Key": self._object(key)}, ExpiresIn=expires
        )

    def sweep(self, max_age_s: float) -> int:
        from botocore.exceptions import BotoCoreError, ClientError

        cutoff = time.time() - max_age_s
        old = []
        try:
            pages = self.client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=self.prefix)
            for page in pages:
                for item in page.get("Contents", []):
                    name = item["Key"][len(self.prefix) :]
                    if _KEY_RE.match(name) and item["LastModified"].timestamp() < cutoff:
                        old.append(name)
        except (BotoCoreError, ClientError) as exc:
            raise self._err("list", exc) from None
        return self.delete_many(old) if old else 0


def build_image_store(settings: Any) -> ImageStore:
    """The image store of ``[service] image_store`` (auto: S3 when ``[cache] store = "s3"``)."""
    svc, c = settings.service, settings.cache
    kind = svc.image_store
    if kind == "auto":
        kind = "s3" if c.store == "s3" else "local"
    if kind == "s3":
        if not c.s3_bucket:
            from argusdiff.errors import ConfigError

            raise ConfigError("[service] image_store = 's3' needs [cache] s3_bucket (and s3_endpoint_url off AWS)")
        store = S3ImageStore(
            c.s3_bucket, prefix=svc.image_s3_prefix, endpoint_url=c.s3_endpoint_url, region=c.s3_region,
            create_bucket=False, public_url=svc.image_s3_public_url,
        )  # fmt: skip
        try:
            store._ensure_bucket()
        except CacheUnavailable as exc:  # S3 down at start: images stay in router memory until it answers
            log.warning("image store %s is unavailable at start: %s", store.description, exc)
        return store
    return LocalImageStore(Path(svc.image_path).expanduser())


def store_spec(store: Any) -> dict[str, Any] | None:
    """Where ``store`` is, as the router announces it to the workers (no credentials: a worker
    reaches S3 with its own); None for a store of another kind."""
    if isinstance(store, S3ImageStore):
        return {"kind": "s3", "bucket": store.bucket, "prefix": store.prefix, "endpoint_url": store.endpoint_url,
                "region": store.client.meta.region_name}  # fmt: skip
    if isinstance(store, LocalImageStore):
        return {"kind": "local", "path": str(store.root.resolve())}
    return None


def store_from_spec(spec: dict[str, Any]) -> ImageStore:
    """The image store a router announced (:func:`store_spec`); ValueError for a spec it cannot use."""
    kind = spec.get("kind")
    if kind == "s3":
        return S3ImageStore(
            str(spec["bucket"]), prefix=str(spec.get("prefix") or ""), endpoint_url=spec.get("endpoint_url"),
            region=spec.get("region"), create_bucket=False,
        )  # fmt: skip
    if kind == "local":
        return LocalImageStore(Path(str(spec["path"])))
    raise ValueError(f"unknown image store kind {kind!r}")


def worker_image_store(settings: Any, deployment: dict[str, Any] | None) -> ImageStore:
    """A worker's image store: the one its router announced (``deployment["images"]``) when the
    worker's ``[service] image_store`` is ``auto``, else its own setting (:func:`build_image_store`)."""
    spec = (deployment or {}).get("images")
    if settings.service.image_store == "auto" and spec:
        return store_from_spec(spec)
    return build_image_store(settings)


def read_image(store: ImageStore, key: str) -> bytes | None:
    """The image's bytes, None when it is missing (expired or never stored)."""
    try:
        return store.get(key)
    except BlobMissing:
        return None
    except CacheUnavailable as exc:
        raise ImageStoreUnavailable(str(exc)) from None
