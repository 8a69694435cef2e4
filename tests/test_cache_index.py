"""Prompt-embedding indexes: HNSW over SQLite and Qdrant, one interface (cache/index.py)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from argusdiff.errors import ConfigError
from cache.index import HnswIndex, QdrantIndex, VectorIndex, new_prompt_id, normalise

DIM = 16


def _unit(rng, n=1, dim=DIM):
    v = rng.normal(size=(n, dim)).astype(np.float32)
    return v / np.linalg.norm(v, axis=1, keepdims=True)


def _at_similarity(base, sim, rng):
    """A unit vector whose cosine similarity to unit ``base`` is exactly ``sim``."""
    r = rng.normal(size=base.shape)
    r -= r.dot(base) * base
    r /= np.linalg.norm(r)
    return (sim * base + math.sqrt(1 - sim**2) * r).astype(np.float32)


@pytest.fixture(params=["hnsw", "qdrant"])
def index(request, tmp_path):
    idx = HnswIndex(tmp_path / "i", DIM) if request.param == "hnsw" else QdrantIndex(tmp_path / "q", DIM)
    yield idx
    idx.close()


def test_both_engines_implement_the_interface(index):
    assert isinstance(index, VectorIndex)
    assert len(index) == 0
    assert index.nearest(np.ones(DIM)) == []


def test_nearest_filters_by_model_and_k(index):
    rng = np.random.default_rng(1)
    base = _unit(rng)[0]
    near, mid = new_prompt_id(), new_prompt_id()
    other_model = new_prompt_id()
    index.add(near, _at_similarity(base, 0.97, rng), model="m", sizes={5: 10}, now_s=1)
    index.add(mid, _at_similarity(base, 0.88, rng), model="m", sizes={5: 10, 15: 20}, now_s=2)
    index.add(other_model, _at_similarity(base, 0.99, rng), model="x", sizes={5: 10, 15: 20}, now_s=3)
    for v in _unit(rng, 20):
        index.add(new_prompt_id(), v * 0.0 + _at_similarity(base, 0.1, rng), model="m", sizes={5: 1}, now_s=4)

    top = index.nearest(base, model="m", limit=2)
    assert [n.prompt_id for n in top] == [near, mid]
    assert top[0].similarity == pytest.approx(0.97, abs=1e-4)
    assert top[0].entry.model == "m" and top[0].entry.ks == (5,)

    with_k = index.nearest(base, model="m", k=15)
    assert [n.prompt_id for n in with_k] == [mid]
    assert with_k[0].entry.ks == (5, 15) and with_k[0].entry.size_bytes == 30

    assert index.nearest(base, k=15)[0].prompt_id == other_model  # any model
    assert index.nearest(base, model="m", k=25) == []


def test_min_similarity_is_strict(index):
    rng = np.random.default_rng(2)
    base = _unit(rng)[0]
    pid = new_prompt_id()
    index.add(pid, base, model="m", sizes={5: 1}, now_s=0)
    probe = _at_similarity(base, 0.9, rng)
    sim = index.nearest(probe)[0].similarity
    assert index.nearest(probe, min_similarity=sim - 1e-4)[0].prompt_id == pid
    assert index.nearest(probe, min_similarity=sim) == []


def test_hits_and_latent_removal(index):
    rng = np.random.default_rng(3)
    pid = new_prompt_id()
    index.add(pid, _unit(rng)[0], model="m", sizes={5: 10, 10: 20}, now_s=1.0)
    index.record_hit(pid, 10, 7.0)
    index.record_hit(pid, 10, 8.0)
    index.record_hit(pid, 25, 9.0)  # no such latent: ignored
    entry = index.get(pid)
    assert entry.latents[10].hits == 2 and entry.latents[10].last_use_s == 8.0
    assert entry.latents[5].hits == 0 and entry.hits == 2
    assert sorted((s.k, s.hits) for s in index.latent_stats()) == [(5, 0), (10, 2)]
    index.remove_latents(pid, [10])
    assert index.get(pid).ks == (5,)
    index.remove_latents(pid, [5])  # last latent gone: the prompt goes too
    assert index.get(pid) is None and len(index) == 0
    assert index.nearest(_unit(rng)[0]) == []


def test_entries_and_clear(index):
    rng = np.random.default_rng(4)
    ids = {new_prompt_id() for _ in range(300)}
    for pid in ids:
        index.add(pid, _unit(rng)[0], model="m", sizes={5: 1}, now_s=0)
    assert len(index) == 300
    assert {e.prompt_id for e in index.entries()} == ids
    index.clear()
    assert len(index) == 0 and list(index.entries()) == []
    pid = new_prompt_id()
    index.add(pid, _unit(rng)[0], model="m", sizes={5: 1}, now_s=0)
    assert [e.prompt_id for e in index.entries()] == [pid]


def test_rejects_bad_embeddings(index):
    with pytest.raises(ValueError, match="dimensions"):
        index.add(new_prompt_id(), np.ones(DIM + 1), model="m", sizes={5: 1}, now_s=0)
    with pytest.raises(ValueError, match="zero vector"):
        index.nearest(np.zeros(DIM))
    with pytest.raises(ValueError, match="NaN"):
        normalise([1.0, float("nan")])
    with pytest.raises(ValueError, match="at least one latent"):
        index.add(new_prompt_id(), np.ones(DIM), model="m", sizes={}, now_s=0)


@pytest.mark.parametrize("engine", ["hnsw", "qdrant"])
def test_index_survives_reopen(tmp_path, engine):
    rng = np.random.default_rng(5)
    vecs = _unit(rng, 50)

    def open_():
        return HnswIndex(tmp_path / "i", DIM) if engine == "hnsw" else QdrantIndex(tmp_path / "q", DIM)

    idx = open_()
    ids = [new_prompt_id() for _ in range(50)]
    for pid, v in zip(ids, vecs, strict=True):
        idx.add(pid, v, model="m", sizes={5: 3, 10: 4}, now_s=1)
    idx.record_hit(ids[7], 10, 5.0)
    idx.remove(ids[0])
    idx.close()

    idx = open_()  # HNSW: graph rebuilt from SQLite
    try:
        assert len(idx) == 49
        assert idx.nearest(vecs[7])[0].prompt_id == ids[7]
        assert idx.get(ids[7]).latents[10].hits == 1
        assert idx.get(ids[0]) is None
        assert idx.nearest(vecs[0])[0].prompt_id != ids[0]
    finally:
        idx.close()


@pytest.mark.parametrize("engine", ["hnsw", "qdrant"])
def test_dimension_mismatch_on_reopen_is_a_config_error(tmp_path, engine):
    cls, sub = (HnswIndex, "i") if engine == "hnsw" else (QdrantIndex, "q")
    cls(tmp_path / sub, DIM).close()
    with pytest.raises(ConfigError, match="embedding_dim"):
        cls(tmp_path / sub, DIM * 2)


def test_hnsw_recall_against_brute_force(tmp_path):
    rng = np.random.default_rng(6)
    n = 3000
    vecs = _unit(rng, n, 64)
    idx = HnswIndex(None, 64)
    ids = [new_prompt_id() for _ in range(n)]
    for pid, v in zip(ids, vecs, strict=True):
        idx.add(pid, v, model="m", sizes={5: 1}, now_s=0)
    queries = vecs[rng.choice(n, 200, replace=False)] + 0.3 * _unit(rng, 200, 64)
    truth = np.argmax(queries @ vecs.T, axis=1)
    got = [idx.nearest(q)[0].prompt_id for q in queries]
    recall = np.mean([g == ids[t] for g, t in zip(got, truth, strict=True)])
    assert recall >= 0.97


def test_hnsw_filtered_search_looks_past_unqualified_neighbours():
    """Hundreds of nearer prompts of another model must not hide the qualified one."""
    rng = np.random.default_rng(7)
    base = _unit(rng)[0]
    idx = HnswIndex(None, DIM)
    for _ in range(400):
        idx.add(new_prompt_id(), _at_similarity(base, 0.99, rng), model="other", sizes={5: 1}, now_s=0)
    target = new_prompt_id()
    idx.add(target, _at_similarity(base, 0.9, rng), model="m", sizes={5: 1}, now_s=0)
    found = idx.nearest(base, model="m", min_similarity=0.85)
    assert [n.prompt_id for n in found] == [target]


def test_hnsw_deleted_slots_are_reused_and_search_stays_correct():
    rng = np.random.default_rng(8)
    idx = HnswIndex(None, DIM)
    ids = [new_prompt_id() for _ in range(2000)]
    vecs = _unit(rng, 2000)
    for pid, v in zip(ids, vecs, strict=True):
        idx.add(pid, v, model="m", sizes={5: 1}, now_s=0)
    for pid in ids[:1990]:
        idx.remove(pid)
    assert len(idx) == 10
    found = idx.nearest(vecs[1995], limit=10)
    assert {n.prompt_id for n in found} == set(ids[1990:])
    assert found[0].prompt_id == ids[1995]
    more = [new_prompt_id() for _ in range(1500)]
    for pid, v in zip(more, _unit(rng, 1500), strict=True):
        idx.add(pid, v, model="m", sizes={5: 1}, now_s=0)
    assert len(idx) == 1510
    assert idx._graph.get_max_elements() <= 4096  # deleted slots were reused, not grown past


def test_add_many(index):
    rng = np.random.default_rng(9)
    vecs = _unit(rng, 3)
    ids = [new_prompt_id() for _ in range(3)]
    index.add_many([(pid, v, "m", {5: 2}, 1.0) for pid, v in zip(ids, vecs, strict=True)])
    assert len(index) == 3 and index.nearest(vecs[2])[0].prompt_id == ids[2]
    if isinstance(index, HnswIndex):  # HNSW checks ids: a batch with a known id adds nothing
        with pytest.raises(ValueError, match="already indexed"):
            index.add_many([(new_prompt_id(), vecs[0], "m", {5: 1}, 2.0), (ids[0], vecs[0], "m", {5: 1}, 2.0)])
        assert len(index) == 3


def test_hnsw_reopen_uses_the_snapshot_only_when_sqlite_matches(tmp_path):
    rng = np.random.default_rng(10)
    vecs = _unit(rng, 40)
    ids = [new_prompt_id() for _ in range(40)]
    idx = HnswIndex(tmp_path / "i", DIM)
    idx.add_many([(pid, v, "m", {5: 1}, 0.0) for pid, v in zip(ids[:30], vecs[:30], strict=True)])
    idx.remove(ids[3])
    idx.close()  # clean close: graph snapshot saved

    idx = HnswIndex(tmp_path / "i", DIM)
    assert idx.opened_from == "snapshot"
    assert len(idx) == 29 and idx.nearest(vecs[3])[0].prompt_id != ids[3]
    assert idx.nearest(vecs[7])[0].prompt_id == ids[7]
    idx.add_many([(pid, v, "m", {5: 1}, 0.0) for pid, v in zip(ids[30:], vecs[30:], strict=True)])
    idx.remove(ids[7])
    idx._db.close()  # a crash: no snapshot of the changes (the OS drops the lock)
    idx._release_lock()

    idx = HnswIndex(tmp_path / "i", DIM)
    assert idx.opened_from == "snapshot+delta"  # SQLite moved on: the snapshot is brought up to date
    assert len(idx) == 38 and idx.nearest(vecs[35])[0].prompt_id == ids[35]
    assert idx.nearest(vecs[7])[0].prompt_id != ids[7]
    assert {n.prompt_id for n in idx.nearest(vecs[0], limit=38)} == set(ids) - {ids[3], ids[7]}
    idx.close()
    (tmp_path / "i" / "graph.hnsw").write_bytes(b"garbage")  # a damaged snapshot is not fatal
    idx = HnswIndex(tmp_path / "i", DIM)
    assert idx.opened_from == "rebuild" and idx.nearest(vecs[35])[0].prompt_id == ids[35]
    assert len(idx) == 38
    idx.close()


def test_hnsw_folder_has_one_writer_and_read_only_readers(tmp_path):
    rng = np.random.default_rng(11)
    writer = HnswIndex(tmp_path / "i", DIM)
    pid = new_prompt_id()
    writer.add(pid, _unit(rng)[0], model="m", sizes={5: 1}, now_s=0)
    with pytest.raises(ConfigError, match="in use by another process"):
        HnswIndex(tmp_path / "i", DIM)
    reader = HnswIndex(tmp_path / "i", DIM, read_only=True)
    assert reader.get(pid) is not None and len(reader) == 1
    with pytest.raises(ConfigError, match="read-only"):
        reader.add(new_prompt_id(), _unit(rng)[0], model="m", sizes={5: 1}, now_s=0)
    with pytest.raises(ConfigError, match="read-only"):
        reader.remove(pid)
    reader.close()
    writer.close()
    HnswIndex(tmp_path / "i", DIM).close()  # the lock went with close()
