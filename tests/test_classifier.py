"""Prompt -> level classifier: labels, training (learning happens), save/load, batching, CLI."""

from __future__ import annotations

import threading

import numpy as np
import pytest
from fixtures_classifiers import separable_table, tiny_bert  # noqa: F401 - fixture

from classifiers.errors import ClassifierInputError, ModelFormatError, ModelMismatchError, TrainingDataError
from classifiers.labelling import optimal_labels, routing_quality, select_levels
from classifiers.train import TrainConfig, classification_metrics, split_by_prompt, train_level_classifier
from traces.quality import QualityTable

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


@pytest.fixture(autouse=True)
def _one_thread():
    import torch

    torch.set_num_threads(1)


def fast_config(**kw) -> TrainConfig:
    base = dict(mode="full", epochs=12, lr=2e-3, max_length=16, progress=False, patience=20)
    base.update(kw)
    return TrainConfig(**base)


@pytest.fixture(scope="module")
def trained(tiny_bert):  # noqa: F811
    import torch

    torch.set_num_threads(1)
    table = separable_table(240)
    cfg = fast_config(backbone=str(tiny_bert), epochs=20, lr=1e-3)
    return table, *train_level_classifier(table, config=cfg, profile="test")


# ---- labels and metrics -----------------------------------------------------------------------


def test_optimal_level_is_fastest_within_ratio():
    t = QualityTable(
        level_ids=("a", "b", "c"),
        prompt_ids=("p0", "p1", "p2"),
        prompts=("x", "y", "z"),
        scores=np.array([[10.0, 9.5, 8.9], [10.0, 8.0, 9.2], [10.0, 11.0, 9.0]]),
    )
    labels = optimal_labels(t, 0.9)
    # p0: c is 0.89 < 0.9 -> b; p1: c 0.92 ok (fastest) -> c; p2: best is b=11 -> c 9/11 < .9, b ok -> b
    assert labels.index.tolist() == [1, 2, 1]
    assert labels.ids() == ["b", "c", "b"]
    assert labels.counts().tolist() == [0, 2, 1]
    assert optimal_labels(t, 1.0).index.tolist() == [0, 0, 1]


def test_routing_quality_numbers():
    scores = np.array([[10.0, 9.0], [10.0, 6.0]])
    r = routing_quality(scores, predicted=np.array([1, 1]), labels=np.array([1, 0]))
    assert r["classifier"] == pytest.approx(7.5)
    assert r["random"] == pytest.approx(8.75)
    assert r["oracle"] == pytest.approx(9.5)
    assert r["best"] == pytest.approx(10.0)
    assert r["too_fast"] == pytest.approx(0.5) and r["too_slow"] == 0.0


def test_classification_metrics_confusion():
    m = classification_metrics(np.array([0, 0, 1, 2]), np.array([0, 1, 1, 1]), ("a", "b", "c"))
    assert m["confusion"] == [[1, 1, 0], [0, 1, 0], [0, 1, 0]]
    assert m["accuracy"] == 0.5
    assert m["per_class"]["b"] == {"precision": pytest.approx(1 / 3), "recall": 1.0, "support": 1}
    assert m["per_class"]["c"]["recall"] == 0.0


def test_split_by_prompt_keeps_duplicates_together_and_is_deterministic():
    prompts = [f"p{i % 50}" for i in range(200)]
    tr, va = split_by_prompt(prompts, 0.2, seed=3)
    assert len(set(tr) | set(va)) == 200 and not set(tr) & set(va)
    assert not {prompts[i] for i in tr} & {prompts[i] for i in va}
    assert len({prompts[i] for i in va}) == 10
    tr2, va2 = split_by_prompt(prompts, 0.2, seed=3)
    assert tr.tolist() == tr2.tolist() and va.tolist() == va2.tolist()
    with pytest.raises(TrainingDataError):
        split_by_prompt(["same"] * 5, 0.2, 0)


def test_select_levels_and_single_class_error(tiny_bert):  # noqa: F811
    t = separable_table(30)
    sub = select_levels(t, ["l0", "l2"])
    assert sub.level_ids == ("l0", "l2") and sub.scores.shape == (30, 2)
    one = QualityTable(
        level_ids=("a", "b"), prompt_ids=("p0", "p1"), prompts=("x", "y"), scores=np.array([[1.0, 1.0], [2.0, 2.0]])
    )
    with pytest.raises(TrainingDataError, match="same optimal level"):
        train_level_classifier(one, config=fast_config(backbone=str(tiny_bert)))


# ---- learning ---------------------------------------------------------------------------------


def test_training_learns_a_separable_task(trained):
    table, _clf, report = trained
    losses = [h["train_loss"] for h in report.history]
    assert losses[-1] < 0.5 * losses[0]
    assert report.accuracy >= 0.9  # chance is 1/3
    assert report.n_train + report.n_val == len(table)
    assert sum(report.label_counts.values()) == len(table)
    r = report.routing
    assert r["classifier"] > r["random"]
    assert r["classifier"] >= r["oracle"] - 0.2
    assert sum(map(sum, report.confusion)) == report.n_val
    text = report.format()
    assert "confusion" in text and "random" in text


def test_save_load_identical_predictions_and_level_check(trained, tmp_path):
    from classifiers.level import LevelClassifier

    table, clf, _ = trained
    prompts = list(table.prompts[:20])
    out = clf.save(tmp_path / "clf")
    assert (out / "model.safetensors").is_file() and (out / "argusdiff_classifier.json").is_file()
    assert not any(p.suffix in (".bin", ".pt", ".pkl") for p in out.iterdir())
    again = LevelClassifier.load(out, level_ids=("l0", "l1", "l2"), profile="test")
    assert again.meta.level_ids == ("l0", "l1", "l2") and again.meta.profile == "test"
    np.testing.assert_allclose(again.predict_proba(prompts), clf.predict_proba(prompts), atol=1e-6)
    assert again.predict(prompts) == clf.predict(prompts)
    assert again.meta.report["accuracy"] == pytest.approx(clf.meta.report["accuracy"])
    with pytest.raises(ModelMismatchError, match="trained for levels"):
        LevelClassifier.load(out, level_ids=("sdxl-k0", "sdxl-k5", "sdxl-k10"))
    with pytest.raises(ModelMismatchError, match="profile"):
        LevelClassifier.load(out, profile="sm-a100")
    with pytest.raises(ModelFormatError):
        LevelClassifier.load(tmp_path / "nothing-here")
    # saving again over the directory replaces it atomically
    clf.save(out)
    assert LevelClassifier.load(out).predict(prompts) == clf.predict(prompts)


def test_training_is_deterministic_for_a_seed(tiny_bert):  # noqa: F811
    table = separable_table(60)
    cfg = fast_config(backbone=str(tiny_bert), epochs=3)
    a, ra = train_level_classifier(table, config=cfg)
    b, rb = train_level_classifier(table, config=cfg)
    assert [h["train_loss"] for h in ra.history] == [h["train_loss"] for h in rb.history]
    np.testing.assert_array_equal(a.predict_proba(list(table.prompts)), b.predict_proba(list(table.prompts)))


def test_resumed_training_matches_an_uninterrupted_run(tiny_bert, tmp_path):  # noqa: F811
    table = separable_table(60)
    full, rf = train_level_classifier(table, config=fast_config(backbone=str(tiny_bert), epochs=4))
    ckpt = str(tmp_path / "ckpt")
    _, r1 = train_level_classifier(table, config=fast_config(backbone=str(tiny_bert), epochs=2, checkpoint_dir=ckpt))
    assert r1.epochs_run == 2 and r1.resumed_from_epoch == 0
    resumed, r2 = train_level_classifier(
        table, config=fast_config(backbone=str(tiny_bert), epochs=4, checkpoint_dir=ckpt)
    )
    assert r2.resumed_from_epoch == 2 and r2.epochs_run == 4
    assert [h["train_loss"] for h in r2.history] == pytest.approx([h["train_loss"] for h in rf.history], rel=1e-5)
    p = list(table.prompts)
    np.testing.assert_allclose(resumed.predict_proba(p), full.predict_proba(p), atol=1e-5)


def test_early_stopping_stops_before_max_epochs(tiny_bert):  # noqa: F811
    t = separable_table(60)
    # labels shuffled across prompts: nothing generalises, so the validation loss stops improving
    shuffled = np.random.default_rng(0).permutation(t.scores)
    table = QualityTable(level_ids=t.level_ids, prompt_ids=t.prompt_ids, prompts=t.prompts, scores=shuffled)
    _, rep = train_level_classifier(table, config=fast_config(backbone=str(tiny_bert), epochs=200, patience=2, lr=5e-3))
    assert rep.epochs_run < 200
    assert rep.epochs_run - rep.best_epoch == 2


# ---- input rules ------------------------------------------------------------------------------


def test_empty_and_overlong_prompts(trained):
    from dataclasses import replace

    from classifiers.level import LevelClassifier

    _, clf, _ = trained
    probs = clf.predict_proba(["", "   ", "red apple " * 2000])
    assert probs[0].tolist() == [1.0, 0.0, 0.0] and probs[1].tolist() == [1.0, 0.0, 0.0]
    assert probs[2].sum() == pytest.approx(1.0)
    assert clf.tokenize(["red apple " * 2000])["input_ids"].shape[1] == clf.meta.max_length
    strict = LevelClassifier(clf.model, clf.tokenizer, replace(clf.meta, empty_prompt="error"))
    with pytest.raises(ClassifierInputError, match="prompt 1 is empty"):
        strict.predict(["ok", ""])
    with pytest.raises(ClassifierInputError):
        clf.predict("a single string")
    with pytest.raises(ClassifierInputError):
        clf.predict([None])


# ---- batching ---------------------------------------------------------------------------------


def test_batched_classifier_concurrent_submits_match_direct(trained):
    from classifiers.level import BatchedClassifier

    table, clf, _ = trained
    prompts = list(table.prompts[:64])
    expected = clf.predict(prompts)
    results: dict[int, str] = {}
    with BatchedClassifier(clf, max_batch=8, max_wait_s=0.05) as bc:

        def worker(lo: int) -> None:
            futs = [(i, bc.submit(prompts[i])) for i in range(lo, lo + 16)]
            for i, f in futs:
                results[i] = f.result(timeout=60)

        threads = [threading.Thread(target=worker, args=(lo,)) for lo in range(0, 64, 16)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert [results[i] for i in range(64)] == expected
        assert bc.items == 64
        assert 64 / 8 <= bc.batches < 64  # batched, never above max_batch
        assert bc.predict(["", prompts[0]]) == ["l0", expected[0]]
    with pytest.raises(RuntimeError):
        bc.submit("after close")


def test_batched_classifier_swap_checks_levels(trained, tiny_bert):  # noqa: F811
    from classifiers.level import BatchedClassifier, LevelClassifier

    _, clf, _ = trained
    other = LevelClassifier.new(("a", "b"), backbone=str(tiny_bert))
    with BatchedClassifier(clf, max_batch=4, max_wait_s=0.0) as bc:
        with pytest.raises(ModelMismatchError):
            bc.swap(other)
        same = LevelClassifier.new(("l0", "l1", "l2"), backbone=str(tiny_bert), seed=1)
        assert bc.swap(same) is clf
        assert bc.classifier is same
        assert bc.predict(["x"]) == same.predict(["x"])


# ---- the real MiniLM --------------------------------------------------------------------------


@pytest.mark.slow
def test_packaged_minilm_head_mode_learns():
    table = separable_table(150)
    clf, rep = train_level_classifier(table, config=TrainConfig(mode="head", epochs=15, max_length=24, progress=False))
    assert clf.meta.backbone.endswith("model")  # the packaged MiniLM folder
    assert clf.model.config.hidden_size == 384 and clf.model.config.num_hidden_layers == 6
    assert rep.accuracy >= 0.9


# ---- CLI --------------------------------------------------------------------------------------


def test_cli_train_classifier(tiny_bert, tmp_path, capsys):  # noqa: F811
    import json

    from argusdiff.cli import main
    from classifiers.level import LevelClassifier

    csv = tmp_path / "q.csv"
    separable_table(90).to_csv(csv)
    out = tmp_path / "model"
    argv = ["train-classifier", "--table", str(csv), "--out", str(out), "--backbone", str(tiny_bert)]
    argv += ["--mode", "full", "--epochs", "3", "--lr", "2e-3", "--max-length", "16", "--no-progress", "--json"]
    assert main(argv) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["n_train"] + report["n_val"] == 90 and report["epochs_run"] == 3
    assert LevelClassifier.load(out).level_ids == ("l0", "l1", "l2")
    # wrong profile for the table's levels: exit 2 with a message naming the level
    assert main([*argv[:7], "--profile", "sm-a100", "--no-progress"]) == 2
    assert "sd-xl" in capsys.readouterr().err
    assert main(["train-classifier", "--table", str(tmp_path / "missing.csv"), "--out", str(out)]) == 2
    assert main([*argv[:7], "--epochs", "0"]) == 2
    assert "--epochs" in capsys.readouterr().err


def test_cls_pooling_and_head_mode_fold_round_trip(tiny_bert, tmp_path):  # noqa: F811
    from classifiers.level import LevelClassifier

    table = separable_table(60)
    prompts = list(table.prompts)
    for pooling, mode in (("cls", "full"), ("cls", "head"), ("mean", "head")):
        cfg = fast_config(backbone=str(tiny_bert), epochs=3, pooling=pooling, mode=mode)
        clf, rep = train_level_classifier(table, config=cfg)
        assert clf.meta.pooling == pooling and rep.mode == mode
        again = LevelClassifier.load(clf.save(tmp_path / f"{pooling}-{mode}"))
        assert again.meta.pooling == pooling
        np.testing.assert_allclose(again.predict_proba(prompts), clf.predict_proba(prompts), atol=1e-5)
    # the head-mode report is computed by the saved model's own forward pass (standardization folded)
    assert rep.history[rep.best_epoch - 1]["val_acc"] == pytest.approx(rep.accuracy, abs=1e-9)


def test_load_for_profile_from_settings(tiny_bert, tmp_path):  # noqa: F811
    from argusdiff.config import ClassifierConfig
    from argusdiff.profile import load_profile
    from classifiers.level import LevelClassifier, load_for_profile

    profile = load_profile("sm-a100")
    clf = LevelClassifier.new(profile.ids, backbone=str(tiny_bert), profile=profile.name, strategy="sm")
    clf.save(tmp_path / "sm")
    got = load_for_profile(profile, ClassifierConfig(models={"sm": str(tmp_path / "sm")}))
    assert got.level_ids == profile.ids
    with pytest.raises(ModelFormatError, match="strategy 'sm'"):
        load_for_profile(profile, ClassifierConfig())
    with pytest.raises(ModelMismatchError):
        load_for_profile(load_profile("sdxl-ac-a100"), ClassifierConfig(models={"ac": str(tmp_path / "sm")}))


def test_length_sorted_batches_keep_input_order(trained):
    _, clf, _ = trained
    prompts = ["red apple " * 9, "dragon castle", "portrait of a woman in a long red coat by the sea", "x"]
    one_by_one = np.vstack([clf.predict_proba([p]) for p in prompts])
    np.testing.assert_allclose(clf.predict_proba(prompts, batch_size=3), one_by_one, atol=1e-5)
