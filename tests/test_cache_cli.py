"""``argusdiff cache stats|ls|verify|clear|warm`` (argusdiff/commands/cache.py)."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from argusdiff.cli import main
from argusdiff.config import CacheConfig
from cache.api import LatentMeta
from cache.latent_cache import LatentCache
from cache.store import blob_key

META = LatentMeta("tiny-sd", "EulerDiscreteScheduler", 50, 0, (4, 8, 8))


@pytest.fixture
def filled(tmp_path, monkeypatch):
    """A cache folder with 3 prompts (2 latents each), one with 2 hits."""
    monkeypatch.setenv("ARGUSDIFF_CACHE__PATH", str(tmp_path / "cache"))
    rng = np.random.default_rng(0)
    ids = []
    with LatentCache.from_config(CacheConfig(path=str(tmp_path / "cache"))) as cache:
        embs = rng.normal(size=(3, 384)).astype(np.float32)
        for e in embs:
            ids.append(cache.store(e, {10: rng.normal(size=(4, 8, 8)), 20: rng.normal(size=(4, 8, 8))}, META))
        cache.lookup(embs[1], 20, model="tiny-sd")
        cache.lookup(embs[1], 20, model="tiny-sd")
    return tmp_path / "cache", ids


def test_stats(filled, capsys):
    assert main(["cache", "stats", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["prompts"] == 3 and out["latents"] == 6
    assert out["latents_by_k"] == {"10": 3, "20": 3} and out["hits_by_k"] == {"10": 0, "20": 2}
    assert out["bytes"] > 0
    assert main(["cache", "stats"]) == 0
    text = capsys.readouterr().out
    assert "prompts: 3  latents: 6" in text and "sim > 0.95 -> K=25" in text


def test_ls_sorted_by_hits(filled, capsys):
    _, ids = filled
    assert main(["cache", "ls", "--sort", "hits", "--json"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert len(rows) == 3 and rows[0]["prompt_id"] == ids[1] and rows[0]["hits"] == {"10": 0, "20": 2}
    assert main(["cache", "ls", "--limit", "1"]) == 0
    captured = capsys.readouterr()
    assert len(captured.out.splitlines()) == 1 and "(1 of 3 prompts)" in captured.err


def test_verify_dry_run_then_repair(filled, capsys):
    root, ids = filled
    (root / "blobs" / blob_key(ids[0], 10)).unlink()
    assert main(["cache", "verify", "--dry-run", "--json"]) == 1
    assert json.loads(capsys.readouterr().out)["dangling"] == 1
    assert main(["cache", "verify", "--deep"]) == 0
    assert "repaired: dangling 1" in capsys.readouterr().out
    assert main(["cache", "verify", "--dry-run"]) == 0


def test_clear_needs_yes_without_a_terminal(filled, capsys, monkeypatch):
    monkeypatch.setattr(sys, "stdin", open("/dev/null"))  # noqa: SIM115 - closed by pytest's monkeypatch teardown
    assert main(["cache", "clear"]) == 2
    assert "--yes" in capsys.readouterr().err
    assert main(["cache", "clear", "--yes"]) == 0
    assert "deleted 6 latent blobs" in capsys.readouterr().out
    assert main(["cache", "stats", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["prompts"] == 0


def test_path_option_and_bad_config(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("ARGUSDIFF_CACHE__PATH", raising=False)
    LatentCache.from_config(CacheConfig(path=str(tmp_path / "other"))).close()  # an empty cache
    assert main(["cache", "stats", "--path", str(tmp_path / "other"), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["prompts"] == 0
    monkeypatch.setenv("ARGUSDIFF_CACHE__INDEX", "faiss")
    assert main(["cache", "stats", "--path", str(tmp_path / "other")]) == 2
    assert "cache.index" in capsys.readouterr().err


def test_warm_rejects_bad_options(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("ARGUSDIFF_CACHE__PATH", str(tmp_path / "c"))
    assert main(["cache", "warm", "--profile", "demo-cpu", "--level", "nope"]) == 2
    assert "--level" in capsys.readouterr().err
    assert main(["cache", "warm", "--profile", "sm-a100"]) == 2
    assert "no approximate-caching level" in capsys.readouterr().err
    assert main(["cache", "warm", "--profile", "demo-cpu", "--limit", "0"]) == 2


def test_cli_module_imports_no_heavy_libraries():
    code = (
        "import sys; from argusdiff.cli import build_parser; build_parser('cache'); import cache.latent_cache; "
        "heavy = [m for m in ('torch', 'diffusers', 'transformers', 'timm', 'open_clip', 'qdrant_client', 'hnswlib', "
        "'boto3') if m in sys.modules]; print(heavy); sys.exit(1 if heavy else 0)"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.integration
@pytest.mark.slow
def test_warm_fills_the_cache_with_the_demo_pipeline(tmp_path, capsys, monkeypatch):
    pytest.importorskip("traces.embeddings", reason="the MiniLM prompt encoder (traces.embeddings) is not available")
    import torch

    torch.set_num_threads(1)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("ARGUSDIFF_CACHE__PATH", str(tmp_path / "c"))
    monkeypatch.setenv("ARGUSDIFF_WORKERS__MODELS_DIR", str(tmp_path / "models"))
    assert main(["cache", "warm", "--profile", "demo-cpu", "--limit", "2"]) == 0
    assert "warmed 2 of 2 prompts" in capsys.readouterr().out
    assert main(["cache", "stats", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["prompts"] == 2 and out["latents"] == 2 * len(out["latents_by_k"]) and out["latents_by_k"]


def test_stats_works_while_another_writer_holds_the_cache(filled, capsys):
    root, _ = filled
    with LatentCache.from_config(CacheConfig(path=str(root))):
        assert main(["cache", "stats", "--json"]) == 0
        assert json.loads(capsys.readouterr().out)["prompts"] == 3
        assert main(["cache", "verify"]) == 2
        assert "in use by another process" in capsys.readouterr().err


@pytest.mark.parametrize("action", [["stats"], ["ls"], ["verify"], ["clear", "--yes"]])
def test_reading_commands_refuse_a_path_that_is_not_a_cache(action, tmp_path, capsys, monkeypatch):
    """A typo in --path exits 2 naming the option, and creates nothing (it used to create an
    empty cache and report 0 prompts)."""
    monkeypatch.delenv("ARGUSDIFF_CACHE__PATH", raising=False)
    typo = tmp_path / "typo"
    assert main(["cache", *action, "--path", str(typo)]) == 2
    err = capsys.readouterr().err
    assert "--path" in err and "not a latent cache" in err and str(typo) in err
    assert not typo.exists()
    (tmp_path / "plain").mkdir()  # an existing folder that holds no cache
    assert main(["cache", *action, "--path", str(tmp_path / "plain")]) == 2
    assert "no index/index.sqlite, blobs" in capsys.readouterr().err
    assert list((tmp_path / "plain").iterdir()) == []
    monkeypatch.setenv("ARGUSDIFF_CACHE__PATH", str(typo))  # from the settings, not the option
    assert main(["cache", *action]) == 2
    assert "[cache] path" in capsys.readouterr().err
