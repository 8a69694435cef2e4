"""Trace readers, generators, spec strings and the native format."""

from __future__ import annotations

import numpy as np
import pytest

import argusdiff.config  # noqa: F401  (installs [traces], with ARGUSDIFF_TRACES__*, as traces.settings' source)
from traces.formats import detect_format, load_trace, write_trace
from traces.generators import GENERATORS, load_shape, parse_duration, parse_spec, rate_curve_trace, scale_shape
from traces.trace import Trace, TraceError


def test_parse_duration_and_spec():
    assert parse_duration("5m") == 300.0
    assert parse_duration("2h") == 7200.0
    assert parse_duration("90") == 90.0
    assert parse_duration("1.5s") == 1.5
    with pytest.raises(TraceError, match="duration"):
        parse_duration("five minutes")
    assert parse_spec("bursty:low=60,high=480,period=5m") == ("bursty", {"low": "60", "high": "480", "period": "5m"})
    with pytest.raises(TraceError, match="key=value"):
        parse_spec("bursty:low")
    with pytest.raises(TraceError, match="twice"):
        parse_spec("poisson:qpm=1,qpm=2")


def test_poisson_rate_and_determinism():
    a = load_trace("poisson:qpm=120,duration=60m", seed=3)
    b = load_trace("poisson:qpm=120,duration=60m", seed=3)
    c = load_trace("poisson:qpm=120,duration=60m", seed=4)
    assert np.array_equal(a.arrivals_s, b.arrivals_s)
    assert not np.array_equal(a.arrivals_s[:10], c.arrivals_s[:10])
    # 7200 expected; Poisson sd ~85
    assert 6800 < len(a) < 7600
    assert np.all(np.diff(a.arrivals_s) >= 0)
    assert a.duration_s == 3600.0
    assert a.qpm(60).size == 60


def test_seed_key_in_spec_overrides_argument():
    a = load_trace("poisson:qpm=60,duration=10m,seed=7", seed=0)
    b = load_trace("poisson:qpm=60,duration=10m", seed=7)
    assert np.array_equal(a.arrivals_s, b.arrivals_s)


def test_bursty_alternates_low_and_high():
    t = load_trace("bursty:low=60,high=480,period=5m,duration=40m", seed=0)
    per_period = t.qpm(300.0)
    assert per_period.size == 8
    lows, highs = per_period[0::2], per_period[1::2]
    assert np.all(lows < 100) and np.all(lows > 30)
    assert np.all(highs > 420) and np.all(highs < 540)


def test_diagonal_ramps_from_start_to_end():
    t = load_trace("diagonal:start=50,end=600,duration=800m", seed=1)
    per_min = t.qpm(60.0)
    assert per_min.size == 800
    assert abs(per_min[:20].mean() - 57) < 10
    assert abs(per_min[-20:].mean() - 593) < 25
    # expected total = mean rate 325 QPM x 800 min
    assert abs(len(t) - 260_000) < 3_000


def test_rate_curve_linear_matches_integral():
    t = rate_curve_trace(np.array([0.0, 600.0, 1200.0]), np.array([0.0, 600.0, 0.0]), seed=2)
    # integral = 2 * 0.5 * 600 s * 10 /s = 6000
    assert abs(len(t) - 6000) < 300
    first, second = t.qpm(600.0)
    assert abs(first - second) / first < 0.1
    per_min = t.qpm(60.0)
    assert per_min[0] < per_min[9] and per_min[19] < per_min[10]


def test_azure_shape_scaling_preserves_shape():
    shape = load_shape("azure")
    assert shape.size == 347
    scaled = scale_shape(shape, low=50, high=600)
    assert scaled.min() == pytest.approx(50) and scaled.max() == pytest.approx(600)
    # affine: correlation 1 with the original
    assert np.corrcoef(shape, scaled)[0, 1] == pytest.approx(1.0)
    peaked = scale_shape(shape, peak=300)
    assert peaked.max() == pytest.approx(300)
    assert np.allclose(peaked / shape, peaked[0] / shape[0])
    with pytest.raises(TraceError, match="both low= and high="):
        scale_shape(shape, low=5)


def test_azure_generator_follows_shape():
    t = load_trace("azure:low=50,high=600,length=120", seed=0)
    assert t.duration_s == pytest.approx(119 * 60.0)
    per_min = t.qpm(60.0)
    target = scale_shape(load_shape("azure"), low=50, high=600)[:120]
    # per-minute counts follow the (scaled) shape of the selected 120 hours
    assert np.corrcoef(per_min[:119], target[:119])[0, 1] > 0.6 or np.ptp(target[:120]) < 50
    t2 = load_trace("diurnal:shape=azure,peak=200,duration=100m", seed=0)
    assert t2.duration_s == pytest.approx(6000.0)
    assert t2.peak_qpm < 260


def test_prompt_assignment_orders():
    t = load_trace("poisson:qpm=600,duration=10m,prompts=50,order=sequential")
    assert t.prompt_idx is not None
    assert list(t.prompt_idx[:55]) == list(range(50)) + list(range(5))
    r = load_trace("poisson:qpm=600,duration=10m", n_prompts=50, seed=1)
    assert r.prompt_idx.min() >= 0 and r.prompt_idx.max() < 50
    assert len(np.unique(r.prompt_idx)) == 50
    with pytest.raises(TraceError, match="order"):
        load_trace("poisson:qpm=60,order=zigzag", n_prompts=5)


def test_prompt_indices_checked_against_set():
    t = Trace(arrivals_s=np.array([0.0, 1.0]), prompt_idx=np.array([0, 9]))
    with pytest.raises(TraceError, match="prompt index 9"):
        t.prompt_indices(5)
    assert list(t.prompt_indices(5, wrap=True)) == [0, 4]
    u = Trace(arrivals_s=np.arange(4.0))
    assert list(u.prompt_indices(3, order="sequential")) == [0, 1, 2, 0]


def test_unsorted_arrivals_are_sorted_with_their_data():
    t = Trace(arrivals_s=np.array([3.0, 1.0, 2.0]), prompt_idx=np.array([30, 10, 20]), tier=("c", "a", "b"))
    assert list(t.arrivals_s) == [1.0, 2.0, 3.0]
    assert list(t.prompt_idx) == [10, 20, 30]
    assert t.tier == ("a", "b", "c")


def test_unknown_generator_and_keys():
    with pytest.raises(TraceError, match="unknown key"):
        load_trace("bursty:lo=60")
    with pytest.raises(TraceError, match="no such file and not a generator"):
        load_trace("nosuch:qpm=1")
    with pytest.raises(TraceError, match="missing qpm"):
        load_trace("poisson:duration=5m")
    with pytest.raises(TraceError, match="qpm"):
        load_trace("poisson:qpm=fast")
    for name, gen in GENERATORS.items():
        assert len(load_trace(gen.example.replace("800m", "20m").replace("40m", "10m"), seed=0)) > 0, name


def test_diffserve_reader(tmp_path):
    f = tmp_path / "ds.txt"
    f.write_text("368.0,1236\n509.0,2011\n685.0,1\n")
    assert detect_format(f) == "diffserve"
    t = load_trace(f)
    assert t.format == "diffserve"
    assert list(t.arrivals_s) == [0.368, 0.509, 0.685]
    assert list(t.prompt_idx) == [1235, 2010, 0]  # 1-based in the file


def test_proteus_reader(tmp_path):
    f = tmp_path / "tw.txt"
    f.write_text("5,1,300\n6,2,300\n15,1,75\n")
    assert detect_format(f) == "proteus"
    t = load_trace(f)
    assert list(t.slo_s) == [0.3, 0.3, 0.075]
    assert t.tier is None  # qos levels are validated, not kept (no text-to-image meaning)
    assert t.prompt_idx is None


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("1.0,5\n2.0,x\n", ":2: prompt_idx (1-based) is not a number"),
        ("1.0,5\n2.0,0\n", ":2: prompt_idx (1-based) must be >= 1"),
        ("1.0,5\n\n-3.0,1\n", ":3: arrival_ms must be >= 0"),
        ("1.0,5\n2.0,1,4\n", ":2: expected 2 fields"),
        ("1.0,5\nnan,1\n", ":2: arrival_ms must be finite"),
        ("5,1,300\n6,1,0\n", ":2: deadline_ms must be > 0"),
        ("5,1,300\n6,1.5,10\n", ":2: qos_level must be an integer"),
        ("a,b,c,d\n", ":1: cannot detect the trace format"),
    ],
)
def test_bad_lines_name_file_and_line(tmp_path, content, message):
    f = tmp_path / "bad.txt"
    f.write_text(content)
    with pytest.raises(TraceError) as info:
        load_trace(f)
    assert str(f) + message in str(info.value)


def test_native_round_trip(tmp_path):
    t = Trace(
        arrivals_s=np.array([0.5, 1.25, 7.0]),
        prompt_idx=np.array([3, 1, 2]),
        slo_s=np.array([1.0, 2.0, 3.0]),
        tier=("interactive", "batch", "standard"),
        name="mine",
        duration=10.0,
    )
    f = tmp_path / "t.csv"
    write_trace(t, f)
    assert detect_format(f) == "argusdiff"
    back = load_trace(f)
    assert np.array_equal(back.arrivals_s, t.arrivals_s)
    assert np.array_equal(back.prompt_idx, t.prompt_idx)
    assert np.array_equal(back.slo_s, t.slo_s)
    assert back.tier == t.tier
    assert back.name == "mine" and back.duration_s == 10.0
    g = load_trace("bursty:low=60,high=480,period=1m,duration=5m,prompts=10", seed=5)
    write_trace(g, f)
    back = load_trace(f)
    assert np.array_equal(back.arrivals_s, g.arrivals_s) and np.array_equal(back.prompt_idx, g.prompt_idx)


def test_native_bad_header_and_row(tmp_path):
    f = tmp_path / "t.csv"
    f.write_text("arrival_s,prompt,slo_s\n1,2,3\n")
    with pytest.raises(TraceError, match=":1: header must be"):
        load_trace(f, format="argusdiff")
    f.write_text("# name: x\narrival_s,slo_s\n1,2\n2,-1\n")
    with pytest.raises(TraceError, match=r"t.csv:4: slo_s must be"):
        load_trace(f)


def test_azure_minute_reader(tmp_path):
    minutes = ",".join(str(i) for i in range(1, 1441))
    row1 = ",".join(["o", "a", "f1", "http"] + [str(i % 3) for i in range(1440)])
    row2 = ",".join(["o", "a", "f2", "timer"] + ["1"] * 1440)
    f = tmp_path / "invocations_per_function_md.anon.d01.csv"
    f.write_text(f"HashOwner,HashApp,HashFunction,Trigger,{minutes}\n{row1}\n{row2}\n")
    assert detect_format(f) == "azure-minute"
    t = load_trace(f, seed=0)
    expected = np.array([i % 3 + 1 for i in range(1440)], dtype=float)
    assert len(t) == int(expected.sum())
    assert np.array_equal(t.qpm(60.0), expected)
    scaled = load_trace(f, seed=0, low=100, high=300)
    per_min = scaled.qpm(60.0)
    # minutes with the highest raw count are scaled to ~300 QPM, the lowest to ~100
    assert abs(per_min[expected == 3].mean() - 300) < 10
    assert abs(per_min[expected == 1].mean() - 100) < 10
    bad = tmp_path / "bad.csv"
    bad.write_text(f"HashOwner,HashApp,HashFunction,Trigger,{minutes}\n{row1}\n{row2.replace(',1,', ',x,', 1)}\n")
    with pytest.raises(TraceError, match=r"bad\.csv:3: minute"):
        load_trace(bad)


def test_rescale_keeps_pattern():
    t = load_trace("bursty:low=60,high=480,period=5m,duration=40m", seed=0)
    half = t.rescale(factor=0.5)
    assert len(half) == len(t) and half.duration_s == pytest.approx(2 * t.duration_s)
    m = t.rescale(mean_qpm=100)
    assert m.mean_qpm == pytest.approx(100, rel=1e-6)
    with pytest.raises(TraceError, match="exactly one"):
        t.rescale()


def test_window():
    t = load_trace("poisson:qpm=60,duration=10m,prompts=5", seed=0)
    w = t.window(120, 240)
    assert w.duration_s == 120 and np.all(w.arrivals_s < 120)
    assert len(w) == int(np.sum((t.arrivals_s >= 120) & (t.arrivals_s < 240)))


def test_shared_traces_read(shared_dir):
    d = shared_dir / "data" / "traces"
    ds = load_trace(d / "diffserve_maf_fixed_10qps.txt")
    assert ds.format == "diffserve" and len(ds) == 3674 and ds.prompt_idx.max() < 5000
    assert abs(ds.mean_qpm - 600) < 60  # ~10 QPS
    tw = load_trace(d / "twitter_proteus_low_load_300.txt")
    assert tw.format == "proteus" and len(tw) == 8690 and tw.duration_s < 300
    az = load_trace(d / "azure_functions_2019_hourly.csv", low=50, high=600)
    assert az.format == "azure-hourly"
    assert az.duration_s == pytest.approx(346 * 60)


def test_default_prompt_order_is_configured(monkeypatch):
    seq = load_trace("poisson:qpm=600,duration=1m", n_prompts=1000)
    assert list(seq.prompt_idx[:5]) == [0, 1, 2, 3, 4]  # default: walk the set
    monkeypatch.setenv("ARGUSDIFF_TRACES__PROMPT_ORDER", "random")
    rnd = load_trace("poisson:qpm=600,duration=1m", n_prompts=1000)
    assert list(rnd.prompt_idx[:5]) != [0, 1, 2, 3, 4]
    assert list(load_trace("poisson:qpm=600,duration=1m,order=sequential", n_prompts=1000).prompt_idx[:3]) == [0, 1, 2]


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("poisson:qpm=10,duration=0", "poisson: duration must be > 0"),
        ("diagonal:duration=0", "diagonal: duration must be > 0"),
        ("poisson:qpm=10,duration=1e12", "limit"),
        ("bursty:period=0", "period must be > 0"),
        ("azure:low=100,high=50", "must be >= low"),
        ("diurnal:shape=/nonexistent/shape.csv", "not a shipped shape"),
    ],
)
def test_generator_parameter_errors(spec, message):
    with pytest.raises(TraceError, match=message):
        load_trace(spec)


def test_file_options_after_at(tmp_path):
    f = tmp_path / "tw.txt"
    f.write_text("".join(f"{i * 10},1,300\n" for i in range(6000)))  # 6000 QPM for 60 s
    t = load_trace(f"{f}@mean_qpm=100")
    assert len(t) == 6000 and t.mean_qpm == pytest.approx(100, rel=1e-3)
    w = load_trace(f"{f}@mean_qpm=600,start=0,end=60,prompts=7,order=sequential")
    assert abs(len(w) - 600) <= 1 and list(w.prompt_idx[:8]) == [0, 1, 2, 3, 4, 5, 6, 0]
    assert len(load_trace(f, peak_qpm=60)) == 6000
    with pytest.raises(TraceError, match="unknown option"):
        load_trace(f"{f}@speed=2")
    with pytest.raises(TraceError, match="mean_qpm"):
        load_trace(f"{f}@mean_qpm=fast")
    with pytest.raises(TraceError, match="no such file"):
        load_trace(f"{tmp_path / 'none.txt'}@mean_qpm=1")
    g = load_trace("bursty:low=60,high=480,period=5m,duration=40m", mean_qpm=27)
    assert g.mean_qpm == pytest.approx(27, rel=1e-6)


def test_tier_assignment():
    t = load_trace("poisson:qpm=600,duration=20m,tiers=0.2/0.5/0.3", seed=1)
    assert t.tier is not None and len(t.tier) == len(t)
    share = {k: t.tier.count(k) / len(t) for k in ("interactive", "standard", "batch")}
    assert abs(share["interactive"] - 0.2) < 0.03 and abs(share["batch"] - 0.3) < 0.03
    from argusdiff.domain import Tier

    assert {Tier(x) for x in set(t.tier)} == set(Tier)
    with pytest.raises(TraceError, match="three shares"):
        load_trace("poisson:qpm=60,tiers=0.5/0.5")
    with pytest.raises(TraceError, match="three shares"):
        load_trace("poisson:qpm=60,tiers=-1/1/1")
