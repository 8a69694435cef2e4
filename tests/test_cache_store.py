"""Latent blob encoding and the local / S3 blob stores (cache/store.py)."""

from __future__ import annotations

import socket
import uuid

import numpy as np
import pytest

from argusdiff.errors import ConfigError
from cache.api import CacheUnavailable, LatentMeta
from cache.store import (
    BlobCorrupt,
    BlobMissing,
    LocalDirStore,
    S3Store,
    blob_key,
    decode_latent,
    encode_latent,
    parse_blob_key,
)

META = LatentMeta("tiny-sdxl", "EulerDiscreteScheduler", 50, 10, (4, 16, 16), extra={"seed": "7"})


def _latent(seed=0, shape=(4, 16, 16)):
    return np.random.default_rng(seed).normal(size=shape).astype(np.float32)


def test_encode_decode_round_trip_fp16_with_metadata():
    lat = _latent()
    arr, meta = decode_latent(encode_latent(lat, META))
    assert arr.dtype == np.float16 and arr.shape == (4, 16, 16)
    np.testing.assert_array_equal(arr, lat.astype(np.float16))
    assert meta == META


def test_blob_is_a_standard_safetensors_file():
    from safetensors.numpy import load

    tensors = load(encode_latent(_latent(), META))
    assert list(tensors) == ["latent"] and tensors["latent"].dtype == np.float16


@pytest.mark.parametrize(
    "damage",
    [
        lambda b: b[: len(b) // 2],  # truncated
        lambda b: b[:-1] + bytes([b[-1] ^ 0xFF]),  # a flipped tensor byte: checksum catches it
        lambda b: b"",
        lambda b: b"not a safetensors blob at all",
        lambda b: (10**9).to_bytes(8, "little") + b[8:],  # absurd header length
    ],
)
def test_damaged_blob_raises_blob_corrupt(damage):
    with pytest.raises(BlobCorrupt):
        decode_latent(damage(encode_latent(_latent(), META)))


def test_encode_rejects_empty_and_non_finite():
    with pytest.raises(ValueError, match="empty"):
        encode_latent(np.zeros((0,)), META)
    with pytest.raises(ValueError, match="NaN"):
        encode_latent(np.array([1.0, np.nan]), META)
    with pytest.raises(ValueError, match="NaN"):
        encode_latent(np.array([1e6]), META)  # overflows float16


def test_keys_are_derived_and_checked():
    pid = uuid.uuid4().hex
    key = blob_key(pid, 10)
    assert key == f"{pid[:2]}/{pid}/k0010.safetensors"
    assert parse_blob_key(key) == (pid, 10)
    for bad in ("../etc/passwd", "a cat on a mat", pid.upper(), pid[:31]):
        with pytest.raises(ValueError):
            blob_key(bad, 5)
    for bad in ("../" + key, "/" + key, f"zz/{pid}/k0010.safetensors", key.replace(".safetensors", ".bin")):
        with pytest.raises(ValueError):
            parse_blob_key(bad)


def test_local_store_put_get_delete(tmp_path):
    store = LocalDirStore(tmp_path / "blobs")
    pid = uuid.uuid4().hex
    data = encode_latent(_latent(), META)
    store.put(blob_key(pid, 10), data)
    assert store.get(blob_key(pid, 10)) == data
    assert list(store.keys()) == [blob_key(pid, 10)]
    assert not list((tmp_path / "blobs").rglob("*.part"))  # no temporary files left behind
    store.delete(blob_key(pid, 10))
    store.delete(blob_key(pid, 10))  # idempotent
    assert list(store.keys()) == []
    assert list((tmp_path / "blobs").iterdir()) == []  # empty key folders are removed
    with pytest.raises(BlobMissing):
        store.get(blob_key(pid, 10))


def test_local_store_refuses_foreign_keys(tmp_path):
    store = LocalDirStore(tmp_path / "blobs")
    with pytest.raises(ValueError):
        store.put("../outside.safetensors", b"x")
    with pytest.raises(ValueError):
        store.get("../../etc/passwd")
    assert not (tmp_path / "outside.safetensors").exists()


def test_local_store_unusable_root_is_cache_unavailable(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    with pytest.raises(CacheUnavailable, match="cannot create folder"):
        LocalDirStore(blocker / "blobs")


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_s3_unreachable_is_cache_unavailable():
    url = f"http://127.0.0.1:{_closed_port()}"
    with pytest.raises(CacheUnavailable, match="S3 blob store"):
        S3Store("argusdiff-test", endpoint_url=url, connect_timeout_s=0.5, max_attempts=1)
    store = S3Store("argusdiff-test", endpoint_url=url, create_bucket=False, connect_timeout_s=0.5, max_attempts=1)
    with pytest.raises(CacheUnavailable):
        store.get(blob_key(uuid.uuid4().hex, 5))
    with pytest.raises(CacheUnavailable):
        store.put(blob_key(uuid.uuid4().hex, 5), b"x")


@pytest.mark.parametrize("prefix", ["../x", "/abs", "a b", "x/../../y"])
def test_s3_prefix_is_validated(prefix):
    with pytest.raises(ConfigError, match="s3_prefix"):
        S3Store("argusdiff-test", prefix=prefix, endpoint_url="http://127.0.0.1:9", create_bucket=False)


@pytest.mark.integration
def test_s3_store_round_trip(s3_store):
    pid = uuid.uuid4().hex
    data = encode_latent(_latent(), META)
    s3_store.put(blob_key(pid, 10), data)
    s3_store.put(blob_key(pid, 25), data)
    assert s3_store.get(blob_key(pid, 10)) == data
    assert sorted(s3_store.keys()) == [blob_key(pid, 10), blob_key(pid, 25)]
    arr, meta = decode_latent(s3_store.get(blob_key(pid, 25)))
    assert meta == META and arr.shape == META.shape
    s3_store.delete(blob_key(pid, 10))
    s3_store.delete(blob_key(pid, 10))  # deleting a missing object is not an error
    with pytest.raises(BlobMissing):
        s3_store.get(blob_key(pid, 10))
    assert list(s3_store.keys()) == [blob_key(pid, 25)]


@pytest.mark.integration
def test_s3_objects_live_under_the_prefix(s3_store):
    pid = uuid.uuid4().hex
    s3_store.put(blob_key(pid, 5), b"payload")
    listed = s3_store.client.list_objects_v2(Bucket=s3_store.bucket, Prefix=s3_store.prefix)
    assert [o["Key"] for o in listed["Contents"]] == [s3_store.prefix + blob_key(pid, 5)]


@pytest.mark.integration
def test_s3_server_rejects_a_body_that_does_not_match_content_md5(s3_store):
    """The Content-MD5 the store sends is checked by the server: a mismatched one is refused."""
    from botocore.exceptions import ClientError

    from cache.store import _b64md5

    with pytest.raises(ClientError):
        s3_store.client.put_object(
            Bucket=s3_store.bucket, Key=s3_store.prefix + "probe", Body=b"abc", ContentMD5=_b64md5(b"abd")
        )


@pytest.mark.integration
def test_s3_delete_many_in_batches(s3_store):
    keys = [blob_key(uuid.uuid4().hex, 5) for _ in range(12)]
    for k in keys:
        s3_store.put(k, b"x")
    missing = blob_key(uuid.uuid4().hex, 5)
    assert s3_store.delete_many([*keys[:10], missing]) == 11  # a missing key is not an error
    assert sorted(s3_store.keys()) == sorted(keys[10:])


def test_local_delete_many(tmp_path):
    store = LocalDirStore(tmp_path / "b")
    keys = [blob_key(uuid.uuid4().hex, 5) for _ in range(3)]
    for k in keys:
        store.put(k, b"x")
    assert store.delete_many(keys[:2]) == 2
    assert list(store.keys()) == [keys[2]]
