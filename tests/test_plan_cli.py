"""``argusdiff plan``: text and JSON output, cascades, bad options exit 2 naming the option."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from argusdiff.cli import main


def run(capsys, *argv):
    code = main(["plan", *argv])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_plan_text(capsys):
    code, out, _ = run(capsys, "--profile", "sdxl-ac-a100", "--gpus", "8", "--load-qpm", "180")
    assert code == 0
    assert "expected mean quality 0.9328 by level" in out
    assert "PASM" in out
    table = out.split("PASM")[0]
    lines = {ln.split()[0]: ln.split() for ln in table.splitlines() if ln.startswith("sdxl-k")}
    assert lines["sdxl-k15"][1] == "1" and lines["sdxl-k20"][1] == "7"


def test_plan_json_with_affinity(capsys):
    code, out, _ = run(
        capsys,
        "--profile",
        "sdxl-ac-a100",
        "--gpus",
        "8",
        "--load-qpm",
        "300",
        "--affinity",
        "0.2,0.2,0.2,0.2,0.1,0.1",
        "--json",
    )
    assert code == 0
    data = json.loads(out)
    assert data["saturated"] is True and data["shortfall_qpm"] > 0
    assert data["counts"] == [0, 0, 0, 0, 0, 8]
    assert len(data["pasm"]) == 6 and all(abs(sum(r) - 1) < 1e-9 for r in data["pasm"])
    # everything is served at the fastest level: every row maps there
    assert all(r[-1] == pytest.approx(1.0) for r in data["pasm"])
    assert data["affinity"] == pytest.approx([0.2, 0.2, 0.2, 0.2, 0.1, 0.1])


@pytest.mark.parametrize("formulation", ["exact", "aggregated", "paper"])
def test_plan_formulations_agree(capsys, formulation):
    code, out, _ = run(
        capsys,
        "--profile",
        "sm-a100",
        "--gpus",
        "6",
        "--load-qpm",
        "120",
        "--json",
        "--formulation",
        formulation,
        *(["--backend", "highs"] if formulation != "exact" else []),  # exact solves without a MILP backend
        "--affinity",
        "sd-xl=1,tiny-sd=1",
    )
    assert code == 0
    data = json.loads(out)
    ref = json.loads(
        subprocess.run(
            [
                sys.executable,
                "-m",
                "argusdiff",
                "plan",
                "--profile",
                "sm-a100",
                "--gpus",
                "6",
                "--load-qpm",
                "120",
                "--json",
            ],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    )
    assert data["expected_quality"] == pytest.approx(ref["expected_quality"], abs=1e-9)


def test_plan_with_current_reports_moves(capsys):
    cur = ",".join(["sdxl-k10"] * 4 + ["sdxl-k15"] * 4)
    code, out, _ = run(capsys, "--profile", "sdxl-ac-a100", "--gpus", "8", "--load-qpm", "160", "--current", cur)
    assert code == 0
    assert "moved workers: 1" in out


def test_plan_cascade(capsys):
    code, out, _ = run(capsys, "--profile", "cascade-sdturbo-sdv15", "--gpus", "16", "--load-qpm", "1500", "--json")
    assert code == 0
    data = json.loads(out)
    assert data["threshold"] == pytest.approx(0.195)
    assert data["x_light"] + data["x_heavy"] == 16
    code, out, _ = run(capsys, "--profile", "cascade-sdturbo-sdv15", "--gpus", "16", "--load-qpm", "1500")
    assert "threshold t = 0.195" in out


def test_plan_cascade_queue_models(capsys):
    base = ["--profile", "cascade-sdturbo-sdv15", "--gpus", "8", "--load-qpm", "20", "--queue-light", "3"]
    base += ["--queue-heavy", "2", "--json"]
    code, out, _ = run(capsys, *base)
    drain = json.loads(out)
    assert code == 0 and drain["feasible"] and drain["threshold"] == 1.0
    code, out, _ = run(capsys, *base, "--queue-model", "little")
    little = json.loads(out)
    assert code == 0 and not little["feasible"]  # Little: 2 heavy requests at <= 20 QPM wait >= 6 s


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["--gpus", "4", "--load-qpm", "10", "--queue-model", "fifo"], "--queue-model"),
        (["--gpus", "-2", "--load-qpm", "10"], "--gpus"),
        (["--gpus", "x", "--load-qpm", "10"], "--gpus"),
        (["--gpus", "4", "--load-qpm", "-1"], "--load-qpm"),
        (["--gpus", "4", "--load-qpm", "nan"], "--load-qpm"),
        (["--gpus", "4", "--load-qpm", "10", "--affinity", "1,2"], "--affinity"),
        (["--gpus", "4", "--load-qpm", "10", "--affinity", "a,b,c,d,e,f"], "--affinity"),
        (["--gpus", "4", "--load-qpm", "10", "--affinity", "nope=1"], "--affinity"),
        (["--gpus", "4", "--load-qpm", "10", "--formulation", "magic"], "--formulation"),
        (["--gpus", "4", "--load-qpm", "10", "--backend", "cplex"], "--backend"),
        (["--gpus", "4", "--load-qpm", "10", "--margin", "0.5"], "--margin"),
        (["--gpus", "2", "--load-qpm", "10", "--current", "sdxl-k0"], "--current"),
        (["--gpus", "4", "--load-qpm", "10", "--profile", "no-such-profile"], "no-such-profile"),
        (["--load-qpm", "10"], "--gpus"),
        (["--gpus", "4", "--load-qpm", "10", "--time-limit-s", "0"], "--time-limit-s"),
    ],
)
def test_bad_options_exit_2(capsys, argv, needle):
    if "--profile" not in argv:
        argv = ["--profile", "sdxl-ac-a100", *argv]
    with pytest.raises(SystemExit) as exc:
        code = main(["plan", *argv])
        raise SystemExit(code)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert needle in err
    assert "Traceback" not in err


def test_plan_zero_gpus(capsys):
    code, out, _ = run(capsys, "--profile", "sdxl-ac-a100", "--gpus", "0", "--load-qpm", "10", "--json")
    assert code == 0
    data = json.loads(out)
    assert data["saturated"] and data["shortfall_qpm"] == 10
    assert data["pasm"] is None and data["expected_quality_by_prompt"] is None
    code, out, _ = run(capsys, "--profile", "sdxl-ac-a100", "--gpus", "0", "--load-qpm", "10")
    lines = out.splitlines()
    assert code == 0 and "no GPUs: nothing to solve" in lines[0] and "via none" not in out
    assert lines[1].startswith("SATURATED: short by 10.0 QPM")  # first, not after a table
    assert "expected quality: none" in out and "PASM P(" not in out and "1.0000" not in out
    code, out, _ = run(capsys, "--profile", "unified-a100", "--gpus", "0", "--load-qpm", "10")
    assert code == 0 and "expected quality: none, in-SLO share: none" in out and "100.0%" not in out


def test_ac_and_unified_plans_report_quality_on_one_named_scale(capsys):
    """The AC plan prints its mean by level and by prompt; the unified plan's expected quality is
    the by-prompt reading, and both agree for the same allocation of the same levels."""
    code, out, _ = run(capsys, "--profile", "sdxl-ac-a100", "--gpus", "8", "--load-qpm", "120", "--json")
    assert code == 0
    ac = json.loads(out)
    assert ac["expected_quality"] == pytest.approx(0.9948, abs=1e-4)
    assert ac["expected_quality_by_prompt"] == pytest.approx(1.0)
    code, out, _ = run(capsys, "--profile", "unified-a100", "--gpus", "8", "--load-qpm", "120", "--json")
    assert code == 0
    unified = json.loads(out)
    assert {p["id"]: p["workers"] for p in unified["paths"] if p["workers"]} == {"sdxl-k0": 4, "sdxl-k5": 4}
    assert unified["expected_quality"] == pytest.approx(ac["expected_quality_by_prompt"], abs=1e-4)
    _code, out, _ = run(capsys, "--profile", "sdxl-ac-a100", "--gpus", "8", "--load-qpm", "180")
    assert "0.9328 by level" in out and "by prompt" in out


def test_backend_flag_is_honoured(capsys):
    """`--backend highs` solves with HiGHS (it used to print "via exact": the flag was ignored)."""
    base = ["--profile", "sdxl-ac-a100", "--gpus", "8", "--load-qpm", "120"]
    code, out, _ = run(capsys, *base, "--backend", "highs")
    assert code == 0
    assert out.splitlines()[0].split(";")[1].split(",")[0].strip() == "aggregated formulation via highs"
    code, out, _ = run(capsys, *base, "--backend", "highs", "--json")
    assert code == 0
    got = json.loads(out)  # nothing else on stdout (HiGHS prints a banner on its first use)
    assert got["backend"] == "highs" and got["formulation"] == "aggregated"
    code, out, _ = run(capsys, *base, "--json")
    default = json.loads(out)
    assert default["backend"] == "exact" and default["counts"] == got["counts"]
    code, out, _ = run(capsys, *base, "--backend", "highs", "--formulation", "paper", "--json")
    assert code == 0 and json.loads(out)["backend"] == "highs"
    code, _, err = run(capsys, *base, "--backend", "highs", "--formulation", "exact")
    assert code == 2 and "--backend" in err and "exact formulation" in err
    current = ",".join(["sdxl-k25"] * 8)
    code, out, _ = run(capsys, *base, "--backend", "highs", "--formulation", "exact", "--current", current, "--json")
    assert code == 0 and json.loads(out)["backend"] == "exact+highs"
    code, out, _ = run(capsys, "--profile", "cascade-sdturbo-sdv15", "--gpus", "16", "--load-qpm", "1200",
                       "--backend", "highs", "--json")  # fmt: skip
    assert code == 0 and json.loads(out)["backend"] == "highs"


def test_readme_plan_example_is_current_and_not_saturated():
    """README.md shows a normal plan: its command, run now, prints the README's output (but the
    solve time)."""
    import re
    from pathlib import Path

    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text(encoding="utf-8")
    block = readme.split("<!-- plan-example -->")[1].split("<!-- /plan-example -->")[0]
    lines = block.strip().strip("`").strip().splitlines()
    command, shown = lines[0], lines[1:]
    assert command.startswith("$ argusdiff plan ")
    proc = subprocess.run(
        [sys.executable, "-m", "argusdiff", *command.split()[2:]], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr

    def timeless(text: str) -> str:
        return re.sub(r"\d+(\.\d+)? ms", "<t> ms", text)

    assert timeless(proc.stdout).splitlines() == [timeless(x) for x in shown]
    assert "SATURATED" not in proc.stdout and "saturated" not in proc.stdout


ROOT = Path(__file__).resolve().parent.parent
TIERS = "interactive=0.2,standard=0.5,batch=0.3"
# check_refactor_equal's aggregated case: HiGHS needs 4-5.5 s for its MILP on a loaded 2-core
# machine, so under the 5 s wall-clock limit it planned w0, w1 on sdxl-k10 in one run and on
# sdxl-k0 in another (two plans of the same value to 2.5e-9: whichever incumbent the cut found)
AGGREGATED = ["--profile", "unified-a100", "--gpus", "6", "--load-qpm", "150", "--tiers", TIERS,
              "--formulation", "aggregated"]  # fmt: skip


@pytest.mark.parametrize(
    "argv",
    [
        ["--profile", "unified-a100", "--gpus", "2", "--load-qpm", "20", "--formulation", "aggregated"],
        ["--profile", "sdxl-ac-a100", "--gpus", "8", "--load-qpm", "120", "--backend", "highs"],
        ["--profile", "cascade-sdturbo-sdv15", "--gpus", "16", "--load-qpm", "1200", "--backend", "highs"],
    ],
)
def test_plan_solves_without_a_wall_clock_limit(capsys, monkeypatch, argv):
    """Every solve of `argusdiff plan` stops at the backends' deterministic limits only (a plan is a
    pure function of its inputs, whatever the machine's load); `--time-limit-s` sets a wall clock."""
    from solver import allocate, backends, cascade

    seen: list[float] = []
    solve = backends.solve_milp

    def spy(*a, **kw):
        seen.append(kw["time_limit_s"])
        return solve(*a, **kw)

    for mod in (backends, allocate, cascade):  # the last two import the function by name
        monkeypatch.setattr(mod, "solve_milp", spy)
    code, out, _ = run(capsys, *argv, "--json")
    assert code == 0 and json.loads(out)
    assert seen and all(math.isinf(t) for t in seen), seen
    seen.clear()
    code, _, _ = run(capsys, *argv, "--time-limit-s", "30", "--json")
    assert code == 0 and seen and all(t == 30 for t in seen), seen


def test_aggregated_plan_is_the_same_under_any_hash_seed_and_load():
    """check_refactor_equal's aggregated plan, planned in two processes side by side (each loading
    the other's core) under PYTHONHASHSEED 0 and 2: the same JSON but the solve time."""
    procs = []
    for seed in ("0", "2"):
        env = {**os.environ, "PYTHONHASHSEED": seed, "PYTHONPATH": str(ROOT)}
        cmd = [sys.executable, "-m", "argusdiff", "plan", *AGGREGATED, "--json"]
        procs.append(subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env))
    plans = []
    for proc in procs:
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err[-3000:]
        got = json.loads(out)
        got.pop("solve_s")
        plans.append(got)
    a, b = plans
    assert a == b, (a["assignment"], b["assignment"])
