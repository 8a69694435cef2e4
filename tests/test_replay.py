"""``argusdiff replay``: outputs, provenance, bad options exit 2 naming the option."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from argusdiff.cli import main

os.environ.setdefault("HF_HUB_OFFLINE", "1")

SMALL = ["--trace", "poisson:qpm=40,duration=6m", "--no-embeddings", "--quiet"]


def test_replay_writes_every_output(tmp_path, capsys):
    out = tmp_path / "run"
    rc = main(["replay", *SMALL, "--policies", "argus,pac,clipper-ha,diffserve", "--out", str(out)])
    assert rc == 0
    table = capsys.readouterr().out
    for name in ("argus", "pac", "clipper-ha", "diffserve"):
        assert name in table
    assert "oracle stand-in" in table and "SYNTHETIC" in table
    for f in ("metrics.csv", "summary.json", "report.html", "timeline.png", "summary.png", "tradeoff.png"):
        assert (out / f).is_file() and (out / f).stat().st_size > 0, f
    summary = json.loads((out / "summary.json").read_text())
    assert set(summary["policies"]) == {"argus", "pac", "clipper-ha", "diffserve"}
    assert summary["provenance"]["quality_synthetic"] is True
    assert summary["policies"]["argus"]["classifier"].startswith("oracle stand-in")
    rows = (out / "metrics.csv").read_text().splitlines()
    assert rows[0].startswith("policy,minute,offered_qpm")
    per_policy = sum(1 for r in rows[1:] if r.startswith("argus,"))
    assert per_policy >= 6
    html = (out / "report.html").read_text()
    assert "data:image/png;base64," in html and "<table class='comparison'>" in html
    # every column explained; provenance values as a reader writes them, not raw JSON
    from argusdiff.report import COLUMNS

    assert html.count("<dt>") in (len(COLUMNS), len(COLUMNS) + 1) and "<dt>refused</dt>" in html
    assert "12.600000000000001" not in html and "\\u00a7" not in html and "12.6" in html
    assert "level mix" in table and "argus: sdxl-k0" in table


def test_reading_notes_say_what_the_numbers_are_only_where_they_apply():
    from types import SimpleNamespace

    from argusdiff.report import reading_notes

    def row(profile, goodput, thrpt, dropped, refused):
        return {
            "profile": profile,
            "goodput_qpm": goodput,
            "throughput_qpm": thrpt,
            "dropped": dropped,
            "refused": refused,
        }

    quiet = SimpleNamespace(
        summaries={"argus": row("sdxl-ac-a100", 10.0, 10.5, 0, 0)}, provenance={"quality": {"a": "SYNTHETIC x"}}
    )
    assert reading_notes(quiet) == []
    busy = SimpleNamespace(
        summaries={
            "argus": row("sdxl-ac-a100", 10.2, 10.0, 3, 3),
            "diffserve": row("cascade-sdxlltn-sdxl", 9.0, 9.5, 4, 0),
        },
        provenance={"quality": {"a": "SYNTHETIC x"}},
    )
    notes = reading_notes(busy)
    assert len(notes) == 3
    assert notes[0].startswith("Goodput is above throughput for argus:")
    assert "gave up on (diffserve)" in notes[1] and "routed them (argus)" in notes[1]
    assert "drawn separately" in notes[2]


def test_series_styles_tell_more_than_ten_series_apart():
    from argusdiff.report import series_styles

    labels = [f"p{k}" for k in range(30)]
    st = series_styles(labels)
    pairs = {(st[lb]["color"], st[lb]["marker"]) for lb in labels}
    assert len(pairs) == 30
    assert len({st[lb]["color"] for lb in labels[:11]}) == 11  # the 11th does not repeat the first


def test_replay_json_and_faults(capsys):
    rc = main(["replay", *SMALL, "--policies", "argus+", "--faults", "gpus:4@2m+2m", "--json", "--ablation"])
    assert rc == 0
    data = json.loads(capsys.readouterr().out)
    # the flagship (argus+ on every path) with its path ablations; argus+ (AC) as the base of its own
    unified = {"argus+", *(f"argus+ -{x}" for x in ("cascades", "AC", "SM", "tiers", "checks"))}
    assert set(data["policies"]) == {
        "argus+ (AC)",
        "argus+ (AC) -admission",
        "argus+ (AC) +backlog",
        "argus+ (AC) -switch",
        "argus+ (AC) -pooled",
        "argus+ (AC) -measured",
        "argus+ (AC) -checks",
        *unified,
    }
    assert data["policies"]["argus+"]["profile"] == "unified-a100"
    assert data["policies"]["argus+ (AC)"]["profile"] == "sdxl-ac-a100"
    assert data["provenance"]["faults"] == "gpus:4@2m+2m"
    s = data["policies"]["argus+"]
    assert s["served"] + s["dropped"] == s["requests"]


@pytest.mark.parametrize(
    ("args", "option"),
    [
        (["--gpus", "0"], "--gpus"),
        (["--policies", "argus,nope"], "--policies"),
        (["--faults", "gpus:3@1m"], "--faults"),
        (["--trace", "/no/such/trace.csv"], "trace"),
        (["--quality", "/no/such/table.csv"], "--quality"),
        (["--period", "-1"], "--period"),
        (["--confusion", "2"], "--confusion"),
        (["--profile", "no-such-profile"], "profile"),
    ],
)
def test_bad_options_exit_2_naming_the_option(args, option, capsys):
    rc = main(["replay", *SMALL, *args])
    assert rc == 2
    err = capsys.readouterr().err
    assert option in err
    assert "Traceback" not in err


def test_bad_trace_line_names_file_and_line(tmp_path, capsys):
    bad = tmp_path / "t.txt"
    bad.write_text("100,1\n200,2\nabc,3\n")
    rc = main(["replay", "--trace", str(bad), "--trace-format", "diffserve", "--no-embeddings", "--quiet"])
    assert rc == 2
    assert f"{bad}:3" in capsys.readouterr().err


def test_help_does_not_import_heavy_modules():
    code = (
        "import sys\nfrom argusdiff.cli import main\n"
        "try:\n    main(['replay', '--help'])\nexcept SystemExit:\n    pass\n"
        "bad = [m for m in ('torch', 'transformers', 'diffusers') if m in sys.modules]\n"
        "sys.exit(1 if bad else 0)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr


def test_quality_sources_diffserve_and_measured_file(tmp_path, capsys):
    rc = main(["replay", *SMALL, "--policies", "diffserve", "--quality", "diffserve", "--json"])
    assert rc == 0
    prov = json.loads(capsys.readouterr().out)["provenance"]
    assert "DiffServe artifact" in prov["cascade_confidence"]

    from argusdiff.profile import load_profile
    from traces.prompts import builtin_prompts
    from traces.synthetic import synthetic_quality_table

    sm = load_profile("sm-a100")
    table = synthetic_quality_table(builtin_prompts().head(50), sm, seed=3)
    path = tmp_path / "quality.csv"
    table.to_csv(path)
    rc = main(["replay", *SMALL, "--policies", "proteus,clipper-ht", "--quality", str(path), "--json"])
    assert rc == 0
    data = json.loads(capsys.readouterr().out)
    assert "50 prompts" in data["provenance"]["prompts"]
    assert data["policies"]["proteus"]["requests"] > 0


def test_replay_with_a_trained_level_classifier(tmp_path, capsys):
    from argusdiff.profile import load_profile
    from traces.prompts import builtin_prompts
    from traces.synthetic import synthetic_quality_table

    prompts = builtin_prompts().head(60)
    (tmp_path / "prompts.txt").write_text("\n".join(prompts.prompts) + "\n")
    synthetic_quality_table(prompts, load_profile("sdxl-ac-a100"), seed=0).to_csv(tmp_path / "q.csv")
    rc = main(
        [
            "train-classifier",
            "--table",
            str(tmp_path / "q.csv"),
            "--out",
            str(tmp_path / "clf"),
            "--mode",
            "head",
            "--epochs",
            "1",
            "--no-progress",
        ]
    )
    assert rc == 0
    capsys.readouterr()
    rc = main(
        [
            "replay",
            *SMALL,
            "--prompts",
            str(tmp_path / "prompts.txt"),
            "--policies",
            "argus",
            "--classifier",
            str(tmp_path / "clf"),
            "--json",
        ]
    )
    assert rc == 0
    prov = json.loads(capsys.readouterr().out)["provenance"]
    assert prov["classifier"].startswith(f"trained LevelClassifier from {tmp_path / 'clf'} for sdxl-ac-a100")


def test_replay_predictor_source_static_peak_and_cascade_baselines(capsys):
    rc = main(
        [
            "replay",
            *SMALL,
            "--policies",
            "argus,proteus,clipper-ha,diffserve,diffserve-static",
            "--predictor",
            "source",
            "--static-peak",
            "90",
            "--cascade-baselines",
            "--json",
        ]
    )
    assert rc == 0
    data = json.loads(capsys.readouterr().out)
    pol = data["policies"]
    assert pol["argus"]["predictor"].startswith("EWMA (alpha 0.5) of 60 s rates")
    assert pol["proteus"]["predictor"].startswith("EWMA (alpha 0.385) of 1 s rates over 20 bins")
    assert pol["diffserve"]["predictor"].endswith("x 1.05")
    assert "90.0 QPM given in advance" in pol["diffserve-static"]["predictor"]
    assert "given in advance (--static-peak)" in data["provenance"]["static_peak"]
    # DiffServe's comparison: the ladder baselines run on the cascade's two models
    assert pol["proteus"]["profile"] == pol["clipper-ha"]["profile"] == "cascade-sdxlltn-sdxl"
    assert pol["argus"]["profile"] == "sdxl-ac-a100"


def test_replay_load_fraction_scales_the_trace_to_the_cluster(capsys):
    from argusdiff.profile import load_profile
    from argusdiff.replay import cluster_capacity_qpm

    cap = cluster_capacity_qpm(load_profile("sdxl-ac-a100"), 8)
    assert cap == pytest.approx(8 * 60 / 2.2)
    rc = main(["replay", *SMALL, "--policies", "clipper-ht", "--load-fraction", "0.9", "--json"])
    assert rc == 0
    data = json.loads(capsys.readouterr().out)
    prov = data["provenance"]
    assert 0.88 * cap <= prov["peak_qpm"] <= 0.9 * cap + 1e-6
    assert "90% of the 8-worker sdxl-ac-a100 cluster's maximum" in prov["load_scaling"]


def test_scale_to_peak_keeps_the_pattern_and_caps_the_peak():
    from argusdiff.replay import scale_to_peak
    from traces.formats import load_trace

    tr = load_trace("bursty:low=100,high=400,period=3m,duration=12m", seed=1)
    out = scale_to_peak(tr, 180.0)
    assert len(out) == len(tr)
    assert 0.99 * 180.0 <= out.peak_qpm <= 180.0
    assert out.duration_s > tr.duration_s  # stretched, not thinned


@pytest.mark.parametrize(
    ("args", "option"),
    [
        (["--predictor", "median"], "--predictor"),
        (["--load-fraction", "0"], "--load-fraction"),
        (["--static-peak", "-5"], "--static-peak"),
    ],
)
def test_replay_new_options_exit_2_naming_the_option(args, option, capsys):
    assert main(["replay", *SMALL, "--policies", "clipper-ht", *args]) == 2
    assert option in capsys.readouterr().err


def test_variant_runs_come_from_the_policies_that_declare_them():
    from argusdiff.replay import ReplaySpec, variant_runs

    runs = variant_runs(ReplaySpec(ablation=True, mixed=True))
    labels = [label for label, _, _, _ in runs]
    # argus+ is the flagship on the unified profile, in its place among the policies; with the
    # ablations, argus+ (AC) (argus+ on the AC ladder alone) follows it as their base
    assert labels[:11] == [*ReplaySpec().policies[:2], "argus+ (AC)", *ReplaySpec().policies[2:]]
    assert labels[11:] == [
        "argus+ (AC) -admission",
        "argus+ (AC) +backlog",
        "argus+ (AC) -switch",
        "argus+ (AC) -pooled",
        "argus+ (AC) -measured",
        "argus+ (AC) -checks",
        "argus+ -cascades",
        "argus+ -AC",
        "argus+ -SM",
        "argus+ -tiers",
        "argus+ -checks",
        "argus+ (AC+SM)",
    ]
    on = {label: profile for label, _, _, profile in runs}
    assert on["argus+"] == "unified" and on["argus+ (AC)"] is None
    assert on["argus+ -SM"] == "unified" and on["argus+ (AC+SM)"] == "mixed" and on["argus+ (AC) -switch"] is None
    assert dict(runs[labels.index("argus+ -SM")][2]) == {"paths": ("ac", "cascade")}
    # by default no AC-only row: argus+ is the unified plan; ac_only adds it; without unified, argus+
    # is the AC ladder's
    assert [label for label, *_ in variant_runs(ReplaySpec())] == list(ReplaySpec().policies)
    assert "argus+ (AC)" in [label for label, *_ in variant_runs(ReplaySpec(ac_only=True))]
    assert ("argus+", "argus+", {}, None) in variant_runs(ReplaySpec(unified=False))
    # without argus+ selected there is no unified run; without the switches, only the policies
    assert [label for label, *_ in variant_runs(ReplaySpec(policies=["argus", "diffserve"]))] == ["argus", "diffserve"]


def test_default_replay_runs_on_real_prompts_without_the_encoder(tmp_path, monkeypatch):
    """The default prompt set is the packaged DiffusionDB sample, and its packaged embeddings spare
    a first replay the MiniLM encoding (an empty disk cache, and no model ever loaded)."""
    from argusdiff.replay import ReplaySpec, prepare
    from traces.embeddings import get_encoder

    monkeypatch.setenv("ARGUSDIFF_TRACES__EMBEDDING_CACHE_DIR", str(tmp_path / "emb"))
    prepared = prepare(ReplaySpec(trace="poisson:qpm=40,duration=3m", policies=["argus"]))
    assert prepared.provenance["prompts"].startswith("diffusiondb (4999 prompts")
    assert "MiniLM" in prepared.provenance["cache_similarity"]
    encoder = get_encoder()
    assert encoder.encoded == 0 and encoder._model is None and encoder.cache_hits >= 4999


def test_unwritable_out_exits_2_before_the_simulation(tmp_path, capsys, monkeypatch):
    """`--out` naming a file, or a folder under a file, is refused up front naming the option: the
    simulation never starts (a replay can take minutes)."""
    import argusdiff.replay as replay

    def boom(*_a, **_k):
        raise AssertionError("the simulation ran before --out was checked")

    monkeypatch.setattr(replay, "run_replay", boom)
    a_file = tmp_path / "file.txt"
    a_file.write_text("x")
    for out in (a_file, a_file / "sub"):
        rc = main(["replay", *SMALL, "--policies", "clipper-ht", "--out", str(out)])
        assert rc == 2
        err = capsys.readouterr().err
        assert "--out" in err and "Traceback" not in err
    assert a_file.read_text() == "x"


def test_bench_replay_cpu_prints_cpu_seconds_and_the_ratio_to_argus():
    """scripts/bench_replay_cpu.py (docs/benchmarks.md) on a small trace: a CPU-seconds line per run
    and each run's ratio to argus."""
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    out = subprocess.run(
        [sys.executable, str(root / "scripts" / "bench_replay_cpu.py"), "--trace", "poisson:qpm=60,duration=3m",
         "--gpus", "4", "--policies", "argus,argus+"],
        capture_output=True, text=True, timeout=300, env={**os.environ, "PYTHONPATH": str(root)},
    )  # fmt: skip
    assert out.returncode in (0, 1), out.stderr
    lines = out.stdout.splitlines()
    assert any(ln.startswith("argus ") and "1.00x argus" in ln for ln in lines), out.stdout
    assert any(ln.startswith("argus+ ") and "x argus" in ln and "CPU-s" in ln for ln in lines), out.stdout
    assert lines[-1].startswith("target: <= 12 CPU-s per policy")
