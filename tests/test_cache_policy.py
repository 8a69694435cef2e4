"""NIRVANA similarity thresholds and LCBFU retention (cache/policy.py)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from argusdiff.errors import ConfigError
from cache.policy import (
    NIRVANA_THRESHOLDS,
    CachePolicy,
    LatentStat,
    RetentionPolicy,
    k_for_similarities,
    k_for_similarity,
    lcbfu_value,
    min_similarity_for_k,
    validate_thresholds,
)


@pytest.mark.parametrize(
    ("sim", "k"),
    [
        (1.0, 25),
        (0.951, 25),
        (0.95, 20),  # strict: exactly the threshold earns the next K down
        (0.9001, 20),
        (0.90, 15),
        (0.86, 15),
        (0.85, 10),
        (0.76, 10),
        (0.75, 5),
        (0.66, 5),
        (0.65, 0),
        (0.0, 0),
        (-1.0, 0),
        (float("nan"), 0),
    ],
)
def test_nirvana_defaults(sim, k):
    assert k_for_similarity(sim) == k
    assert k_for_similarities([sim])[0] == k


@given(st.lists(st.floats(min_value=-1.0, max_value=1.0, allow_nan=False), min_size=1, max_size=50))
def test_vectorised_matches_scalar(sims):
    got = k_for_similarities(np.array(sims))
    assert got.dtype == np.int64
    assert got.tolist() == [k_for_similarity(s) for s in sims]


def test_vectorised_keeps_shape_and_custom_table():
    table = ((0.8, 10), (0.5, 3))
    got = k_for_similarities(np.array([[0.9, 0.8], [0.6, 0.1]]), table)
    assert got.shape == (2, 2)
    assert got.tolist() == [[10, 3], [3, 0]]


def test_min_similarity_for_k():
    assert min_similarity_for_k(25) == 0.95
    assert min_similarity_for_k(20) == 0.90
    assert min_similarity_for_k(12) == 0.85  # the loosest threshold whose K covers 12
    assert min_similarity_for_k(5) == 0.65
    assert min_similarity_for_k(1) == 0.65
    assert min_similarity_for_k(0) == -math.inf
    assert min_similarity_for_k(26) == math.inf


@given(st.floats(min_value=-1.0, max_value=1.0, allow_nan=False), st.integers(min_value=1, max_value=25))
def test_admits_agrees_with_min_similarity(sim, k):
    policy = CachePolicy()
    assert policy.admits(sim, k) == (sim > min_similarity_for_k(k))


@pytest.mark.parametrize(
    ("table", "message"),
    [
        ([], "at least one"),
        ([[0.9, 5], [0.95, 10]], "similarities must strictly decrease"),
        ([[0.95, 5], [0.9, 10]], "K must strictly decrease"),
        ([[1.5, 5]], "in [-1, 1]"),
        ([[0.9, 0]], "positive integer"),
        ([[0.9, 2.5]], "positive integer"),
        ([[0.9]], "pair"),
        ([["high", 5]], "number"),
    ],
)
def test_threshold_validation_names_the_entry(table, message):
    with pytest.raises(ConfigError, match="thresholds") as info:
        validate_thresholds(table)
    assert message in str(info.value)


def test_cache_config_rejects_bad_thresholds():
    from argusdiff.config import load_settings

    with pytest.raises(ConfigError, match=r"cache\.thresholds"):
        load_settings(environ={"ARGUSDIFF_CACHE__THRESHOLDS": "[[0.5, 5], [0.9, 10]]"})
    ok = load_settings(environ={"ARGUSDIFF_CACHE__THRESHOLDS": "[[0.9, 10], [0.8, 5]]"})
    assert ok.cache.thresholds == ((0.9, 10), (0.8, 5))
    assert load_settings(environ={}).cache.thresholds == NIRVANA_THRESHOLDS


def _stat(pid, k, size=100, hits=0, last=0.0):
    return LatentStat(pid, k, size, hits, last)


def test_lcbfu_orders_by_steps_saved_then_recency():
    stats = [
        _stat("a", 5, hits=4, last=1),  # value 20
        _stat("b", 25, hits=1, last=1),  # value 25
        _stat("c", 10, hits=0, last=9),  # value 0, recent
        _stat("d", 10, hits=0, last=2),  # value 0, older
        _stat("e", 20, hits=1, last=0),  # value 20, older than a
    ]
    order = [s.prompt_id for s in RetentionPolicy.order(stats)]
    assert order == ["d", "c", "e", "a", "b"]
    assert lcbfu_value(4, 5) == 20


def test_victims_respect_byte_budget_and_incoming():
    stats = [_stat(p, 10, size=100, hits=h) for p, h in (("a", 3), ("b", 0), ("c", 1), ("d", 2))]
    policy = RetentionPolicy(byte_budget=400)
    assert policy.victims(stats) == []
    assert policy.victims(stats, incoming_bytes=150) == [("b", 10), ("c", 10)]
    assert len(policy.victims(stats, incoming_bytes=10_000)) == 4


def test_victims_respect_max_latents():
    stats = [_stat(p, 5, hits=h) for p, h in (("a", 3), ("b", 0), ("c", 1))]
    assert RetentionPolicy(max_latents=2).victims(stats) == [("b", 5)]
    assert RetentionPolicy(max_latents=2).victims(stats, incoming_count=1) == [("b", 5), ("c", 5)]
    assert RetentionPolicy().victims(stats, incoming_bytes=10**12) == []


def test_retention_rejects_negative_budget():
    with pytest.raises(ConfigError, match="byte_budget"):
        RetentionPolicy(byte_budget=-1)


def test_k_scaled_to_the_reference_schedule():
    policy = CachePolicy()
    assert policy.scaled_k(4, 8) == 25 and policy.scaled_k(2, 8) == 13 and policy.scaled_k(10, 50) == 10
    assert policy.min_similarity(4, 8) == 0.95  # half of the trajectory, like K=25 of 50
    assert policy.min_similarity(2, 8) == 0.85
    assert policy.min_similarity(2) == 0.65  # unscaled: K=2 of 50
    assert policy.admits(0.96, 4, 8) and not policy.admits(0.94, 4, 8)
    assert policy.min_similarity(5, 4) == math.inf  # K > N is never servable
