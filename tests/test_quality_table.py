"""QualityTable: optimal levels by the ARGUS ratio rule, CSV round trip, clear errors."""

from __future__ import annotations

import numpy as np
import pytest

from traces.quality import QualityTable, QualityTableError


def _table():
    return QualityTable(
        level_ids=("k0", "k10", "k20"),
        prompt_ids=("a", "b", "c", "d"),
        prompts=("a cat", "two dogs, playing", 'quote "x"', "ünïcode"),
        scores=np.array([[20.0, 19.0, 18.5], [20.0, 17.0, 16.0], [20.0, 18.5, 15.0], [18.0, 21.0, 20.0]]),
        metric="pickscore",
        source="unit test",
        synthetic=True,
        profile="demo",
    )


def test_optimal_level_is_fastest_within_ratio_of_best():
    t = _table()
    # a: 18.5 >= 18 -> k20; b: 17 < 18 -> k0; c: 18.5 >= 18 at k10, 15 < 18 -> k10;
    # d: best is 21 (k10), 20 >= 18.9 -> k20
    assert t.optimal_levels(0.9).tolist() == [2, 0, 1, 2]
    assert t.optimal_levels(1.0).tolist() == [0, 0, 0, 1]


def test_csv_round_trip(tmp_path):
    t = _table()
    path = tmp_path / "q.csv"
    t.to_csv(path)
    back = QualityTable.from_csv(path)
    assert back.level_ids == t.level_ids
    assert back.prompts == t.prompts
    assert back.synthetic and back.profile == "demo" and back.source == "unit test"
    np.testing.assert_array_equal(back.scores, t.scores)


def test_bad_tables_fail_with_file_and_line(tmp_path):
    path = tmp_path / "bad.csv"
    path.write_text("prompt_id,prompt,k0,k1\np0,x,1.0,oops\n", encoding="utf-8")
    with pytest.raises(QualityTableError, match=r"bad.csv:2"):
        QualityTable.from_csv(path)
    path.write_text("prompt_id,prompt,k0,k1\np0,x,1.0\n", encoding="utf-8")
    with pytest.raises(QualityTableError, match=r"bad.csv:2: expected 4 fields"):
        QualityTable.from_csv(path)
    with pytest.raises(QualityTableError, match="do not match"):
        _table().check_levels(["k0", "k5", "k20"])
