"""``argusdiff prompts list|show``: prompt sets."""

from __future__ import annotations

import argparse
import json


def add_arguments(parser: argparse.ArgumentParser, name: str) -> None:
    sub = parser.add_subparsers(dest="action", metavar="ACTION")
    ls = sub.add_parser("list", help="built-in prompt sets and the file formats read", description="prompt sets")
    ls.add_argument("--json", action="store_true", help="machine-readable output")
    ls.set_defaults(run=run_list)
    show = sub.add_parser("show", help="summarize a prompt set and print some prompts", description="show prompts")
    show.add_argument(
        "prompts",
        nargs="?",
        default=None,
        help="'diffusiondb', 'builtin' or a text/TSV/CSV file (default: [traces] prompts, diffusiondb)",
    )
    show.add_argument("--head", type=int, default=10, metavar="N", help="print the first N prompts (default 10)")
    show.add_argument("--json", action="store_true", help="machine-readable output")
    show.set_defaults(run=run_show)


def run_list(args: argparse.Namespace) -> int:
    from traces.prompts import list_prompt_sets

    sets = list_prompt_sets()
    formats = [
        "text: one prompt per line",
        "TSV/CSV with a 'prompt' column (+ optional id/prompt_id, category, challenge), e.g. PartiPrompts",
        "headerless TSV: first column",
    ]
    if args.json:
        print(json.dumps({"sets": sets, "file_formats": formats}, indent=2))
        return 0
    for s in sets:
        print(f"{s['name']}  {s['prompts']} prompts  {s['help']}")
    print("files: " + "; ".join(formats))
    return 0


def run_show(args: argparse.Namespace) -> int:
    from argusdiff.errors import ConfigError
    from traces.prompts import load_prompts

    if args.head < 0:
        raise ConfigError(f"--head: must be >= 0, got {args.head}")
    ps = load_prompts(args.prompts)
    summary = ps.summary()
    head = ps.head(args.head) if args.head else None
    if args.json:
        if head is not None:
            summary["head"] = [{"id": i, "prompt": p} for i, p in zip(head.ids, head.prompts, strict=True)]
        print(json.dumps(summary, indent=2))
        return 0
    kind = "generated from templates" if ps.generated else "real prompts" if ps.name == "diffusiondb" else "from file"
    print(f"{ps.name}: {len(ps)} prompts ({summary['distinct']} distinct), {kind}; source: {ps.source}")
    print(f"words per prompt: mean {summary['mean_words']}, median {summary['median_words']:g}")
    for label in ("categories", "challenges"):
        if label in summary:
            print(f"{label}: " + ", ".join(f"{k} {v}" for k, v in summary[label].items()))
    if head is not None:
        for i, p in zip(head.ids, head.prompts, strict=True):
            print(f"  {i}: {p}")
    return 0
