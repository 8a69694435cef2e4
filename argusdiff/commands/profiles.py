"""``argusdiff profiles``, ``argusdiff profile show NAME`` and ``argusdiff profile measure``
(:mod:`argusdiff.commands.profile_measure`)."""

from __future__ import annotations

import argparse
import json


def add_arguments(parser: argparse.ArgumentParser, name: str) -> None:
    if name == "profiles":
        parser.add_argument("--json", action="store_true", help="machine-readable output")
        parser.set_defaults(run=run_list)
        return
    sub = parser.add_subparsers(dest="action", metavar="ACTION")
    show = sub.add_parser("show", help="show a profile's levels", description="show a profile's levels")
    show.add_argument("name", help="shipped profile name or path to a profile TOML file")
    show.add_argument("--json", action="store_true", help="machine-readable output")
    show.set_defaults(run=run_show)
    from argusdiff.commands import profile_measure

    what = "measure a profile's levels on this machine (latency, load time, memory) and write the profile"
    profile_measure.add_arguments(sub.add_parser("measure", help=what, description=what))


def run_list(args: argparse.Namespace) -> int:
    from argusdiff.profile import list_profiles, load_profile

    profiles = [load_profile(name) for name in list_profiles()]
    if args.json:
        print(
            json.dumps(
                [{"name": p.name, "gpu": p.gpu, "levels": list(p.ids), "description": p.description} for p in profiles],
                indent=2,
            )
        )
        return 0
    width = max(len(p.name) for p in profiles)
    gpu = max(len(p.gpu) for p in profiles)
    count = max(len(str(len(p.levels))) for p in profiles)
    for p in profiles:
        print(f"{p.name:<{width}}  {p.gpu:<{gpu}}  {len(p.levels):>{count}} levels  {p.description}")
    return 0


def measured_table(profile) -> dict | None:
    """The ``[measured]`` table of a profile file (provenance of measured numbers), if any."""
    import tomllib
    from pathlib import Path

    path = Path(profile.source)
    if not path.is_file():
        return None
    try:
        measured = tomllib.loads(path.read_text(encoding="utf-8")).get("measured")
    except (OSError, tomllib.TOMLDecodeError):
        return None
    return measured if isinstance(measured, dict) else None


def profile_to_dict(profile) -> dict:
    return {
        "name": profile.name,
        "gpu": profile.gpu,
        "description": profile.description,
        "source": profile.source,
        "slo_s": profile.default_slo_s(),
        "levels": [
            {
                "id": lv.id,
                "strategy": lv.strategy.value,
                "model": lv.model,
                "steps": lv.steps,
                "skip": lv.skip,
                "feature_cache": dict(lv.feature_cache) if lv.feature_cache else None,
                "latency_s": {str(b): t for b, t in sorted(lv.latency_s.items())},
                "peak_qpm": lv.peak_qpm,
                "quality": lv.quality,
                "load_time_s": lv.load_time_s,
            }
            for lv in profile.levels
        ],
        "cascade": None
        if profile.cascade is None
        else {
            "light": profile.cascade.light,
            "heavy": profile.cascade.heavy,
            "discriminator_latency_s": profile.cascade.discriminator_latency_s,
            "thresholds": list(profile.cascade.thresholds),
            "deferral": list(profile.cascade.deferral),
        },
        "measured": measured_table(profile),
    }


def run_show(args: argparse.Namespace) -> int:
    from argusdiff.profile import load_profile

    profile = load_profile(args.name)
    if args.json:
        print(json.dumps(profile_to_dict(profile), indent=2))
        return 0
    print(f"{profile.name} on {profile.gpu}: {profile.description}")
    print(f"source: {profile.source}")
    measured = measured_table(profile)
    if measured:
        versions = ", ".join(f"{k} {measured[k]}" for k in ("torch", "diffusers") if k in measured)
        print(
            f"measured: {measured.get('date', '?')} on {measured.get('device', '?')} "
            f"(driver {measured.get('driver', '?')}; {versions}; {measured.get('dtype', '?')})"
        )
        for name, m in (measured.get("models") or {}).items():
            memory = [f"{k} {v}" for k, v in m.items() if k.endswith("_gib") and not isinstance(v, dict)]
            print(f"  {name}: load {m.get('load_s', '?')} s" + (f", {', '.join(memory)}" if memory else ""))
    print(f"SLO: {profile.default_slo_s():.2f} s")
    print(
        f"{'level':<16}{'strategy':<9}{'model':<22}{'N':>4}{'K':>4}{'lat(b=1) s':>12}{'QPM/worker':>12}"
        f"{'quality':>9}{'load s':>8}"
    )
    for lv in profile.levels:
        print(
            f"{lv.id:<16}{lv.strategy.value:<9}{lv.model:<22}{lv.steps:>4}{lv.skip:>4}{lv.latency(1):>12.3f}"
            f"{lv.peak_qpm:>12.2f}{lv.quality:>9.3f}{lv.load_time_s:>8.2f}"
        )
    for lv in profile.levels:
        if lv.feature_cache:
            params = ", ".join(f"{k} {v}" for k, v in lv.feature_cache.items() if k != "method")
            print(
                f"feature cache: {lv.id} runs {lv.model} with {lv.feature_cache['method']}"
                + (f" ({params})" if params else "")
            )
    if profile.cascade:
        c = profile.cascade
        mid = c.f(0.5)
        print(
            f"cascade: {c.light} -> {c.heavy}; discriminator {c.discriminator_latency_s * 1000:.0f} ms; "
            f"f(t) on {len(c.thresholds)} thresholds, f(0.5) = {mid:.3f}"
        )
    return 0
