"""Level-classifier inference paths: length buckets, precision modes (bfloat16, int8), threads.

Agreement, not time: every fast path must give the float32 decisions (buckets: the same logits up to
rounding; bfloat16 / int8: the same level on >= 98 % of a prompt sample, accuracy within 0.5 pp
for bfloat16).
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from fixtures_classifiers import separable_table, tiny_bert  # noqa: F401 - fixture

from classifiers.errors import ClassifierInputError
from classifiers.train import TrainConfig, train_level_classifier

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


@pytest.fixture(autouse=True)
def _one_thread():
    import torch

    torch.set_num_threads(1)


@pytest.fixture(scope="module")
def saved(tiny_bert, tmp_path_factory):  # noqa: F811
    import torch

    torch.set_num_threads(1)
    table = separable_table(240)
    cfg = TrainConfig(
        mode="full", epochs=20, lr=1e-3, max_length=24, progress=False, patience=20, backbone=str(tiny_bert)
    )
    clf, _ = train_level_classifier(table, config=cfg, profile="test")
    return table, clf, clf.save(tmp_path_factory.mktemp("inference") / "clf")


def mixed_prompts(table) -> list[str]:
    """The table's prompts with very different lengths mixed in (padding matters)."""
    out = []
    for i, p in enumerate(table.prompts):
        out.append(p if i % 4 else f"{p} " + "with many more words " * (i % 9))
    return out


# ---- length buckets -----------------------------------------------------------------------------


def _cost(lengths, buckets, overhead):
    return sum(overhead + (hi - lo) * lengths[hi - 1] for lo, hi in buckets)


def test_length_buckets_partition_and_are_optimal():
    from classifiers.level import length_buckets

    rng = np.random.default_rng(0)
    for _ in range(30):
        lengths = sorted(rng.integers(1, 60, rng.integers(1, 9)).tolist())
        got = length_buckets(lengths, 12)
        # contiguous, covering, non-empty
        assert got[0][0] == 0 and got[-1][1] == len(lengths)
        assert all(a[1] == b[0] for a, b in itertools.pairwise(got)) and all(lo < hi for lo, hi in got)
        # no other contiguous split is cheaper (brute force over the cut points)
        n = len(lengths)
        best = min(
            _cost(lengths, list(itertools.pairwise((0, *cuts, n))), 12)
            for k in range(n)
            for cuts in itertools.combinations(range(1, n), k)
        )
        assert _cost(lengths, got, 12) == pytest.approx(best)
    assert length_buckets([5, 5, 9, 40], 1e9) == [(0, 4)]  # costly forwards: one batch
    assert _cost([5, 5, 9, 40], length_buckets([5, 5, 9, 40], 0), 0) == 59  # free forwards: no padding
    assert length_buckets([], 12) == []


def test_bucketed_logits_equal_one_padded_batch_and_one_by_one(saved):
    import torch

    table, clf, _ = saved
    prompts = mixed_prompts(table)[:64]
    with torch.inference_mode():
        padded = clf.forward(clf.tokenize(prompts)).numpy()  # every prompt padded to the longest
    one_by_one = np.vstack([clf.logits([p]) for p in prompts[:16]])
    for bs in (1, 5, 32, 64):
        got = clf.logits(prompts, batch_size=bs)
        np.testing.assert_allclose(got, padded, atol=1e-4)
        np.testing.assert_allclose(got[:16], one_by_one, atol=1e-4)
    assert clf.predict(prompts, batch_size=32) == [clf.level_ids[i] for i in padded.argmax(1)]
    with pytest.raises(ClassifierInputError, match="batch_size"):
        clf.logits(prompts, batch_size=0)


# ---- precision modes ----------------------------------------------------------------------------


@pytest.mark.parametrize("precision", ["bfloat16", "int8"])
def test_precision_modes_agree_with_float32(saved, precision):
    from classifiers.labelling import optimal_labels
    from classifiers.level import LevelClassifier

    table, _, path = saved
    prompts = mixed_prompts(table)
    ref = LevelClassifier.load(path)
    fast = LevelClassifier.load(path, precision=precision)
    assert fast.precision == precision and ref.precision == "float32"
    a, b = ref.predict_index(prompts), fast.predict_index(prompts)
    assert np.mean(a == b) >= 0.98
    truth = optimal_labels(table, 0.9).index
    assert abs(np.mean(a == truth) - np.mean(b == truth)) <= 0.005 + (precision == "int8") * 0.02
    p = fast.predict_proba(prompts)
    assert p.dtype == np.float64 and np.allclose(p.sum(1), 1.0)
    if precision == "bfloat16":
        import torch

        assert next(fast.model.base_model.parameters()).dtype == torch.bfloat16
        assert fast.model.classifier.weight.dtype == torch.float32  # the mean-pooling head stays float32


def test_precision_rules(saved, tmp_path):
    from classifiers.level import LevelClassifier, native_bf16

    _, _, path = saved
    auto = LevelClassifier.load(path, precision="auto")
    assert auto.precision == ("int8" if auto.int8_gate_passed else "bfloat16" if native_bf16() else "float32")
    with pytest.raises(ClassifierInputError, match="precision must be one of"):
        LevelClassifier.load(path, precision="fp8")
    q = LevelClassifier.load(path, precision="int8")
    q.save(tmp_path / "q")  # int8 runs beside the float32 model, which is saved unchanged
    assert LevelClassifier.load(tmp_path / "q").predict(["a red apple"]) == LevelClassifier.load(path).predict(
        ["a red apple"]
    )
    bf = LevelClassifier.load(path, precision="bfloat16")
    with pytest.raises(ClassifierInputError, match="save the float32 model"):
        bf.save(tmp_path / "bf")
    assert not (tmp_path / "bf").exists()
    with pytest.raises(ClassifierInputError, match="reload it"):
        q.set_precision("bfloat16")
    assert q.set_precision("int8") == "int8"  # same precision again is a no-op
    # an empty prompt still goes to the best level in every mode
    assert q.predict(["", "   "]) == ["l0", "l0"]


def test_cls_pooling_in_bfloat16(tiny_bert, tmp_path):  # noqa: F811
    from classifiers.level import LevelClassifier

    table = separable_table(60)
    cfg = TrainConfig(
        mode="full", epochs=3, lr=2e-3, max_length=16, progress=False, pooling="cls", backbone=str(tiny_bert)
    )
    clf, _ = train_level_classifier(table, config=cfg)
    path = clf.save(tmp_path / "cls")
    fast = LevelClassifier.load(path, precision="bfloat16")
    np.testing.assert_allclose(
        fast.predict_proba(list(table.prompts)), clf.predict_proba(list(table.prompts)), atol=0.05
    )


# ---- threads and configuration --------------------------------------------------------------------


def test_threads_apply_while_classifying_and_restore(saved):
    import torch

    from classifiers.level import LevelClassifier, torch_threads

    table, _, path = saved
    clf = LevelClassifier.load(path, threads=2)
    seen = []
    inner = clf.forward

    def spy(enc):
        seen.append(torch.get_num_threads())
        return inner(enc)

    clf.forward = spy
    clf.predict(list(table.prompts[:10]))
    assert seen and set(seen) == {2}
    assert torch.get_num_threads() == 1  # restored
    with torch_threads(None):
        assert torch.get_num_threads() == 1
    with pytest.raises(ClassifierInputError, match="threads"):
        LevelClassifier.load(path, threads=0)


def test_config_precision_and_threads_reach_load_for_profile(tiny_bert, tmp_path):  # noqa: F811
    import pydantic

    from argusdiff.config import ClassifierConfig
    from argusdiff.profile import load_profile
    from classifiers.level import LevelClassifier, load_for_profile

    profile = load_profile("sm-a100")
    LevelClassifier.new(profile.ids, backbone=str(tiny_bert), profile=profile.name).save(tmp_path / "sm")
    cfg = ClassifierConfig(models={"sm": str(tmp_path / "sm")}, precision="int8", threads=2)
    got = load_for_profile(profile, cfg)
    assert got.precision == "int8" and got.threads == 2
    assert ClassifierConfig().precision == "auto" and ClassifierConfig().threads is None
    with pytest.raises(pydantic.ValidationError):
        ClassifierConfig(threads=0)
    with pytest.raises(pydantic.ValidationError):
        ClassifierConfig(precision="fp16")


# ---- the real MiniLM ----------------------------------------------------------------------------


@pytest.mark.slow
def test_packaged_minilm_bfloat16_agrees_with_float32(tmp_path):
    from classifiers.level import LevelClassifier
    from traces.prompts import builtin_prompts

    table = separable_table(150)
    clf, _ = train_level_classifier(table, config=TrainConfig(mode="head", epochs=15, max_length=64, progress=False))
    path = clf.save(tmp_path / "minilm")
    sample = list(builtin_prompts().prompts[:200]) + list(table.prompts)
    ref = clf.predict_index(sample, batch_size=32)
    for precision in ("bfloat16", "int8"):
        fast = LevelClassifier.load(path, precision=precision)
        agree = np.mean(fast.predict_index(sample, batch_size=32) == ref)
        assert agree >= (0.98 if precision == "bfloat16" else 0.9), (precision, agree)
