"""DiffServe's real confidences, f(t) and runtimes."""

from __future__ import annotations

import numpy as np
import pytest

from argusdiff.profile import load_profile
from traces.diffserve import (
    DiffServeDataError,
    deferral_from_confidence,
    load_confidences,
    load_ft,
    load_light_confidence,
    load_runtimes,
    routing_confidence,
)


def test_shipped_confidences_reproduce_ft():
    for pair in ("sdturbo", "sdxs", "sdxlltn"):
        conf = load_light_confidence(pair)
        assert len(conf) == 5000
        assert conf.light.min() >= 0 and conf.light.max() <= 1
        t, f = load_ft(pair)
        assert t.size == 201 and f[0] == 0.0 and f[-1] == 1.0
        assert np.abs(deferral_from_confidence(conf, t) - f).max() < 0.002


def test_shipped_ft_matches_the_profile():
    prof = load_profile("cascade-sdturbo-sdv15")
    t, f = load_ft("sdturbo")
    for ti, fi in zip(prof.cascade.thresholds, prof.cascade.deferral, strict=True):
        assert abs(np.interp(ti, t, f) - fi) < 0.02


def test_confidence_scores_light_and_heavy():
    c = load_confidences()
    assert len(c) == 5000 and c.heavy is not None
    # DiffServe: for 20-40% of queries the light image is as good; this run judges more
    assert 0.2 < c.light_wins() < 0.8


def test_routing_confidence_wraps_and_checks():
    conf = load_light_confidence("sdturbo")
    got = routing_confidence(np.array([0, 1, 5000, 5001]))
    assert np.array_equal(got, conf.light[[0, 1, 0, 1]])
    assert routing_confidence(np.array([2]), source="scores")[0] == load_confidences().light[2]
    with pytest.raises(DiffServeDataError, match="pair sdturbo"):
        routing_confidence(np.array([0]), pair="sdxs", source="scores")
    with pytest.raises(DiffServeDataError, match="unknown cascade pair"):
        routing_confidence(np.array([0]), pair="nope")
    with pytest.raises(DiffServeDataError, match=">= 0"):
        routing_confidence(np.array([-1]))


def test_bad_files(tmp_path):
    f = tmp_path / "dist_sdturbo.txt"
    f.write_text("0.5\n0.2\n0.1\n")
    with pytest.raises(DiffServeDataError, match="groups of 4"):
        load_light_confidence("sdturbo", f)
    f.write_text("0.5\n0.2\nx\n0.1\n")
    with pytest.raises(DiffServeDataError, match=r"dist_sdturbo\.txt:3: P\(fake\) is not a number"):
        load_light_confidence("sdturbo", f)
    g = tmp_path / "ft.csv"
    g.write_text(",t,f_t\n0,0.0,0.5\n1,0.1,0.2\n")
    with pytest.raises(DiffServeDataError, match="non-decreasing"):
        load_ft("sdturbo", g)
    with pytest.raises(DiffServeDataError, match="not found"):
        load_confidences(tmp_path / "none.csv")


def test_raw_artifact_files(shared_dir):
    d = shared_dir / "data" / "diffserve"
    for pair in ("sdturbo", "sdxs", "sdxlltn"):
        raw = load_light_confidence(pair, d / f"dist_{pair}.txt")
        shipped = load_light_confidence(pair)
        assert np.allclose(raw.light, shipped.light, atol=1e-5)
    t, f = load_ft("sdturbo", d / "f_t_sdturbo_sdv15.csv")
    assert t.size == 21 and f[1] == pytest.approx(0.36)
    conf = load_light_confidence("sdturbo", d / "dist_sdturbo.txt")
    assert np.abs(deferral_from_confidence(conf, t) - f).max() < 0.002
    assert np.array_equal(load_confidences(d / "confidence_scores.csv").light, load_confidences().light)
    rt = load_runtimes(d / "stable_diffusion_runtimes_sdturbo.csv")
    assert rt["sdturbo"][1] == pytest.approx(0.1) and rt["sdv15"][1] == pytest.approx(1.78)
    rt = load_runtimes(d / "stable_diffusion_runtimes_sdxlltn.csv")
    assert 32 not in rt["sdv15"]  # 100000 ms = infeasible, dropped
