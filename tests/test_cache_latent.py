"""LatentCache end to end: thresholds, repair, corruption, timeouts, eviction, concurrency, config."""

from __future__ import annotations

import math
import threading

import numpy as np
import pytest

from argusdiff.errors import ConfigError
from cache.api import CacheHit, CacheUnavailable, LatentCacheProtocol, LatentMeta
from cache.index import HnswIndex
from cache.latent_cache import LatentCache
from cache.policy import CachePolicy, RetentionPolicy
from cache.store import LocalDirStore, blob_key, encode_latent

DIM = 8
SHAPE = (4, 8, 8)
META = LatentMeta("tiny-sd", "EulerDiscreteScheduler", 50, 0, SHAPE)


def _unit(rng, dim=DIM):
    v = rng.normal(size=dim)
    return (v / np.linalg.norm(v)).astype(np.float32)


def _at_similarity(base, sim, rng):
    r = rng.normal(size=base.shape)
    r -= r.dot(base) * base
    r /= np.linalg.norm(r)
    return (sim * base + math.sqrt(1 - sim**2) * r).astype(np.float32)


def _latents(ks, seed=0):
    rng = np.random.default_rng(seed)
    return {k: rng.normal(size=SHAPE).astype(np.float32) for k in ks}


@pytest.fixture(params=["hnsw", "qdrant"])
def cache(request, make_latent_cache):
    return make_latent_cache(index=request.param)


def test_implements_the_protocol(cache):
    assert isinstance(cache, LatentCacheProtocol)


def test_store_then_lookup_returns_the_latent(cache):
    rng = np.random.default_rng(0)
    emb = _unit(rng)
    lat = _latents([10, 25])
    pid = cache.store(emb, lat, META)
    hit = cache.lookup(emb, 25, model="tiny-sd")
    assert isinstance(hit, CacheHit)
    assert hit.prompt_id == pid and hit.k == 25 and hit.similarity == pytest.approx(1.0, abs=1e-5)
    np.testing.assert_array_equal(hit.latent, lat[25].astype(np.float16))
    assert hit.meta.k == 25 and hit.meta.steps == 50 and hit.meta.shape == SHAPE and hit.meta.model == "tiny-sd"
    assert hit.lookup_s >= 0 and hit.fetch_s >= 0
    assert cache.index.get(pid).latents[25].hits == 1
    snap = cache.stats.snapshot()
    assert snap["lookups"] == 1 and snap["hits"] == 1 and snap["hits_by_k"] == {25: 1}
    assert snap["lookup_s"]["n"] == 1 and snap["fetch_s"]["n"] == 1


@pytest.mark.parametrize(
    ("sim", "k", "hit"),
    [(0.96, 25, True), (0.93, 25, False), (0.93, 20, True), (0.8, 15, False), (0.8, 10, True), (0.6, 5, False)],
)
def test_lookup_applies_the_threshold_for_k(cache, sim, k, hit):
    rng = np.random.default_rng(1)
    base = _unit(rng)
    cache.store(base, _latents([5, 10, 15, 20, 25]), META)
    got = cache.lookup(_at_similarity(base, sim, rng), k, model="tiny-sd")
    assert (got is not None) == hit
    if hit:
        assert got.similarity == pytest.approx(sim, abs=1e-4)


def test_lookup_needs_the_same_model_and_the_k(cache):
    rng = np.random.default_rng(2)
    emb = _unit(rng)
    cache.store(emb, _latents([10]), META)
    assert cache.lookup(emb, 10, model="other-model") is None
    assert cache.lookup(emb, 5, model="tiny-sd") is None  # only K=10 stored
    assert cache.lookup(emb, 0, model="tiny-sd") is None
    assert cache.lookup(emb, 40, model="tiny-sd") is None  # above the table: never servable
    assert cache.stats.snapshot()["misses"] == 2


def test_lookup_prefers_the_nearest_qualified_prompt(cache):
    rng = np.random.default_rng(3)
    base = _unit(rng)
    far = cache.store(_at_similarity(base, 0.96, rng), _latents([25]), META)
    near = cache.store(_at_similarity(base, 0.99, rng), _latents([25]), META)
    cache.store(_at_similarity(base, 0.999, rng), _latents([10]), META)  # nearest, but no K=25
    assert cache.lookup(base, 25, model="tiny-sd").prompt_id == near
    cache.remove(near)
    assert cache.lookup(base, 25, model="tiny-sd").prompt_id == far


def test_missing_blob_is_one_miss_then_the_entry_is_repaired(cache):
    rng = np.random.default_rng(4)
    emb = _unit(rng)
    pid = cache.store(emb, _latents([10, 20]), META)
    cache.blobs.delete(blob_key(pid, 20))
    assert cache.lookup(emb, 20, model="tiny-sd") is None
    assert cache.index.get(pid).ks == (10,)  # repaired: K=20 is gone from the index
    assert cache.stats.snapshot()["repairs"] == 1
    assert cache.lookup(emb, 20, model="tiny-sd") is None
    assert cache.stats.snapshot()["repairs"] == 1  # the second lookup never reached the store
    assert cache.lookup(emb, 10, model="tiny-sd") is not None


def test_corrupted_blob_is_a_miss_and_is_removed(cache, tmp_path):
    rng = np.random.default_rng(5)
    emb = _unit(rng)
    pid = cache.store(emb, _latents([10]), META)
    path = cache.blobs.root / blob_key(pid, 10)
    data = bytearray(path.read_bytes())
    data[-3] ^= 0x55
    path.write_bytes(bytes(data))
    assert cache.lookup(emb, 10, model="tiny-sd") is None
    assert cache.index.get(pid) is None
    assert list(cache.blobs.keys()) == []
    assert cache.stats.snapshot()["errors"] == 0  # damage is a miss, not an outage


class _SlowStore(LocalDirStore):
    def __init__(self, root):
        super().__init__(root)
        self.release = threading.Event()
        self.slow = False

    def get(self, key):
        if self.slow:
            self.release.wait(10)
        return super().get(key)


def test_store_timeout_raises_cache_unavailable(tmp_path):
    store = _SlowStore(tmp_path / "b")
    cache = LatentCache(HnswIndex(None, DIM), store, timeout_s=0.05)
    try:
        emb = _unit(np.random.default_rng(6))
        cache.store(emb, _latents([10]), META)
        store.slow = True
        with pytest.raises(CacheUnavailable, match="timed out"):
            cache.lookup(emb, 10, model="tiny-sd")
        store.release.set()
        store.slow = False
        assert cache.lookup(emb, 10, model="tiny-sd") is not None  # recovers once the store does
        assert cache.stats.snapshot()["errors"] == 1
    finally:
        store.release.set()
        cache.close()


class _BrokenIndex(HnswIndex):
    broken = False

    def nearest(self, *a, **kw):
        if self.broken:
            raise OSError("disk I/O error")
        return super().nearest(*a, **kw)


def test_index_failure_raises_cache_unavailable(tmp_path):
    index = _BrokenIndex(tmp_path / "i", DIM)
    cache = LatentCache(index, LocalDirStore(tmp_path / "b"), timeout_s=None)
    emb = _unit(np.random.default_rng(7))
    cache.store(emb, _latents([10]), META)
    index.broken = True
    with pytest.raises(CacheUnavailable, match="disk I/O error"):
        cache.lookup(emb, 10, model="tiny-sd")
    cache.close()
    with pytest.raises(CacheUnavailable):
        cache.lookup(emb, 10, model="tiny-sd")  # closed cache: unavailable, not a crash


class _FailingPutStore(LocalDirStore):
    fail_after = 1

    def put(self, key, data):
        if self.fail_after <= 0:
            raise CacheUnavailable("store full")
        self.fail_after -= 1
        super().put(key, data)


def test_failed_store_leaves_no_blobs_and_no_entry(tmp_path):
    store = _FailingPutStore(tmp_path / "b")
    cache = LatentCache(HnswIndex(None, DIM), store)
    with pytest.raises(CacheUnavailable, match="store full"):
        cache.store(_unit(np.random.default_rng(8)), _latents([10, 20]), META)
    assert list(store.keys()) == [] and len(cache.index) == 0
    assert cache.stats.snapshot()["store_errors"] == 1
    cache.close()


def test_store_validates_input(cache):
    emb = _unit(np.random.default_rng(9))
    with pytest.raises(ValueError, match="at least one latent"):
        cache.store(emb, {}, META)
    with pytest.raises(ValueError, match=r"outside 1\.\.49"):
        cache.store(emb, _latents([50]), META)
    with pytest.raises(ValueError, match="dimensions"):
        cache.store(np.ones(DIM + 2), _latents([10]), META)
    assert len(cache.index) == 0


def test_lcbfu_eviction_under_byte_budget(make_latent_cache):
    rng = np.random.default_rng(10)
    probe = make_latent_cache()
    one = len(encode_latent(_latents([10])[10], META))
    probe.close()
    cache = make_latent_cache(policy=CachePolicy(retention=RetentionPolicy(byte_budget=3 * one)))
    embs = [_unit(rng) for _ in range(4)]
    ids = [cache.store(embs[i], _latents([10], seed=i), META) for i in range(3)]
    for _ in range(2):
        assert cache.lookup(embs[0], 10, model="tiny-sd").prompt_id == ids[0]
    assert cache.lookup(embs[2], 10, model="tiny-sd").prompt_id == ids[2]
    new = cache.store(embs[3], _latents([10], seed=3), META)  # over budget: evict the least valuable
    live = {e.prompt_id for e in cache.entries()}
    assert live == {ids[0], ids[2], new}  # ids[1] had no hits
    assert len(list(cache.blobs.keys())) == 3
    assert cache.usage()["bytes"] <= 3 * one
    assert cache.stats.snapshot()["evictions"] == 1


def test_eviction_keeps_high_k_hits_over_low_k_hits(make_latent_cache):
    rng = np.random.default_rng(11)
    cache = make_latent_cache(policy=CachePolicy(retention=RetentionPolicy(max_latents=2)))
    e = [_unit(rng) for _ in range(3)]
    low = cache.store(e[0], _latents([5]), META)
    high = cache.store(e[1], _latents([25]), META)
    for _ in range(3):
        cache.lookup(e[0], 5, model="tiny-sd")  # 3 hits x 5 steps = 15
    cache.lookup(e[1], 25, model="tiny-sd")  # 1 hit x 25 steps = 25
    cache.store(e[2], _latents([10]), META)
    assert cache.index.get(high) is not None and cache.index.get(low) is None


def test_one_prompt_larger_than_the_budget_is_a_config_error(make_latent_cache):
    cache = make_latent_cache(policy=CachePolicy(retention=RetentionPolicy(byte_budget=100)))
    with pytest.raises(ConfigError, match="byte_budget_mb"):
        cache.store(_unit(np.random.default_rng(12)), _latents([10]), META)


def test_verify_finds_and_repairs_dangling_orphan_and_corrupt(cache):
    rng = np.random.default_rng(13)
    a = cache.store(_unit(rng), _latents([10, 20]), META)
    b = cache.store(_unit(rng), _latents([10]), META)
    c = cache.store(_unit(rng), _latents([5]), META)
    cache.blobs.delete(blob_key(a, 20))  # dangling index latent
    cache.blobs.put(blob_key("0" * 32, 5), b"orphan")  # blob nobody indexes
    (cache.blobs.root / blob_key(b, 10)).write_bytes(b"garbage")  # corrupt
    report = cache.verify(repair=False, deep=True)
    assert (report["dangling"], report["orphans"], report["corrupt"]) == (1, 1, 1)
    cache.verify(repair=True, deep=True)
    assert cache.verify(deep=True) == {
        "latents": 2,
        "blobs": 2,
        "dangling": 0,
        "orphans": 0,
        "corrupt": 0,
        "repaired": True,
    }
    assert cache.index.get(a).ks == (10,) and cache.index.get(b) is None and cache.index.get(c).ks == (5,)


def test_clear_removes_everything(cache):
    rng = np.random.default_rng(14)
    for i in range(5):
        cache.store(_unit(rng), _latents([5, 10], seed=i), META)
    assert cache.usage()["latents"] == 10
    assert cache.clear() == 10
    assert len(cache.index) == 0 and list(cache.blobs.keys()) == []


def test_two_threads_storing_and_looking_up(cache):
    errors: list[BaseException] = []
    stored: dict[int, list[tuple[str, np.ndarray]]] = {0: [], 1: []}

    def work(t: int) -> None:
        rng = np.random.default_rng(100 + t)
        try:
            for i in range(40):
                emb = _unit(rng)
                pid = cache.store(emb, _latents([10, 20], seed=1000 * t + i), META)
                stored[t].append((pid, emb))
                hit = cache.lookup(emb, 20, model="tiny-sd")
                assert hit is not None and hit.prompt_id == pid
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(t,)) for t in (0, 1)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(60)
    assert not errors, errors
    assert len(cache.index) == 80
    assert len(list(cache.blobs.keys())) == 160
    snap = cache.stats.snapshot()
    assert snap["stores"] == 80 and snap["hits"] == 80 and snap["errors"] == 0
    for pid, emb in stored[0] + stored[1]:
        assert cache.lookup(emb, 10, model="tiny-sd").prompt_id == pid


def test_from_config_local_hnsw_and_qdrant(tmp_path):
    from argusdiff.config import CacheConfig

    rng = np.random.default_rng(15)
    emb = _unit(rng, 384)
    for index in ("hnsw", "qdrant"):
        cfg = CacheConfig(path=str(tmp_path / index), index=index, byte_budget_mb=1, thresholds=((0.9, 10),))
        with LatentCache.from_config(cfg) as cache:
            assert cache.policy.thresholds == ((0.9, 10),)
            assert cache.policy.retention.byte_budget == 1024 * 1024
            pid = cache.store(emb, _latents([10]), META)
        with LatentCache.from_config(cfg) as cache:  # reopened from disk
            assert cache.lookup(emb, 10, model="tiny-sd").prompt_id == pid
        assert (tmp_path / index / "blobs").is_dir()


@pytest.mark.integration
def test_latent_cache_on_the_s3_server(make_latent_cache):
    cache = make_latent_cache(store="s3")
    rng = np.random.default_rng(16)
    emb = _unit(rng)
    pid = cache.store(emb, _latents([10, 25]), META)
    assert sorted(cache.blobs.keys()) == [blob_key(pid, 10), blob_key(pid, 25)]
    hit = cache.lookup(_at_similarity(emb, 0.97, rng), 25, model="tiny-sd")
    assert hit.prompt_id == pid and hit.fetch_s > 0
    cache.blobs.delete(blob_key(pid, 25))
    assert cache.lookup(emb, 25, model="tiny-sd") is None
    assert cache.index.get(pid).ks == (10,)


@pytest.mark.integration
def test_from_config_s3(tmp_path, s3_env):
    import uuid

    from argusdiff.config import load_settings

    prefix = f"cfg-{uuid.uuid4().hex[:8]}/"
    settings = load_settings(
        environ={
            "ARGUSDIFF_CACHE__PATH": str(tmp_path),
            "ARGUSDIFF_CACHE__STORE": "s3",
            "ARGUSDIFF_CACHE__S3_BUCKET": "argusdiff-test",
            "ARGUSDIFF_CACHE__S3_PREFIX": prefix,
            "ARGUSDIFF_CACHE__S3_ENDPOINT_URL": s3_env["S3_ENDPOINT_URL"],
        }
    )
    with LatentCache.from_config(settings.cache) as cache:
        assert cache.blobs.prefix == prefix
        emb = _unit(np.random.default_rng(17), 384)
        pid = cache.store(emb, _latents([10]), META)
        assert cache.lookup(emb, 10, model="tiny-sd").prompt_id == pid
        assert cache.clear() == 1


def test_lookup_scales_k_to_the_level_schedule(cache):
    rng = np.random.default_rng(18)
    base = _unit(rng)
    cache.store(base, _latents([2, 4]), LatentMeta("tiny-sd", "EulerDiscreteScheduler", 8, 0, SHAPE))
    probe = _at_similarity(base, 0.9, rng)
    assert cache.lookup(probe, 4, model="tiny-sd") is not None  # K=4 read as 4 of 50: sim > 0.65 suffices
    assert cache.lookup(probe, 4, model="tiny-sd", steps=8) is None  # 4 of 8 is half the run: needs > 0.95
    assert cache.lookup(probe, 2, model="tiny-sd", steps=8) is not None  # 2 of 8 ~ 13 of 50: needs > 0.85


def test_probe_checks_index_and_store_without_touching_stats(tmp_path):
    store = _SlowStore(tmp_path / "b")
    cache = LatentCache(HnswIndex(None, DIM), store, timeout_s=0.05)
    try:
        assert cache.probe() >= 0
        store.slow = True
        with pytest.raises(CacheUnavailable, match="store probe timed out"):
            cache.probe()
        assert cache.stats.snapshot()["lookups"] == 0 and cache.stats.snapshot()["errors"] == 0
    finally:
        store.release.set()
        cache.close()


def test_checkpoint_lets_a_crashed_cache_reopen_from_the_snapshot(tmp_path):
    from argusdiff.config import CacheConfig

    rng = np.random.default_rng(19)
    cfg = CacheConfig(path=str(tmp_path / "c"), embedding_dim=DIM)
    cache = LatentCache.from_config(cfg)
    first = cache.store(_unit(rng), _latents([10]), META)
    assert cache.checkpoint() is True
    emb = _unit(rng)
    second = cache.store(emb, _latents([10]), META)
    cache.index._db.close()  # crash after the checkpoint
    cache.index._release_lock()
    with LatentCache.from_config(cfg) as again:
        assert again.index.opened_from == "snapshot+delta"
        assert again.lookup(emb, 10, model="tiny-sd").prompt_id == second
        assert again.index.get(first) is not None
