"""The ``argusdiff`` command line.

Subcommands live in :mod:`argusdiff.commands`, one module each, imported only when that
subcommand is chosen, so ``argusdiff --help`` and ``argusdiff <cmd> --help`` never import torch,
diffusers, timm or open_clip. Each command module provides ``add_arguments(parser)`` and
``run(args) -> int``.

Exit codes: 0 success, 1 failure while running, 2 bad usage or bad input (the message names the
option, file or field).

Help text: every option says what it does, and its default once. :class:`HelpFormatter` appends
``(default: X)`` to an option whose help does not already state its default; a help that says
where the default comes from (``default: settings``) keeps its own words.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import os
import sys
from collections.abc import Sequence

from argusdiff import __version__
from argusdiff.errors import ArgusdiffError

# name -> (module under argusdiff.commands, one-line help). Order is the order in --help.
COMMANDS: dict[str, tuple[str, str]] = {
    "replay": ("replay", "replay a trace through policies on a simulated cluster and compare them"),
    "bound": (
        "bound",
        "the clairvoyant bound of a trace: the fewest violations and best quality any policy could reach",
    ),
    "plan": ("plan", "solve one allocation (ILP) and PASM for a profile, cluster size and load"),
    "serve": ("serve", "run the REST endpoint, router and control loop (embedded workers by default)"),
    "worker": ("worker", "run one worker that takes work from Redis Streams"),
    "status": ("status", "show the routers, the leader, the workers and the plan of a deployment"),
    "generate": ("generate", "generate one image locally at a given level"),
    "cache": ("cache", "inspect, fill or clear the latent cache"),
    "trace": ("trace", "list, show, generate or convert arrival traces"),
    "prompts": ("prompts", "list or show prompt sets"),
    "quality": ("quality", "build, calibrate or inspect a QualityTable"),
    "train-classifier": ("train_classifier", "train the prompt -> level classifier from a quality table"),
    "train-discriminator": ("train_discriminator", "train the cascade discriminator; reports ROC-AUC and f(t)"),
    "profiles": ("profiles", "list the shipped deployment profiles"),
    "profile": ("profiles", "show a profile (profile show NAME), or measure one on this machine (profile measure)"),
}


class HelpFormatter(argparse.HelpFormatter):
    """Appends ``(default: X)`` to an option's help unless the help already speaks of its default,
    or the default is nothing worth showing (``None``, ``False``, suppressed)."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        default = action.default
        if (
            "default" in text.lower()
            or default is None
            or default is False
            or default is argparse.SUPPRESS
            or not action.option_strings
            or action.nargs == 0
        ):
            return text
        return f"{text} (default: %(default)s)"


class Parser(argparse.ArgumentParser):
    """An argument parser whose sub-parsers (and theirs) all use :class:`HelpFormatter`."""

    def __init__(self, *args, **kwargs) -> None:
        kwargs.setdefault("formatter_class", HelpFormatter)
        super().__init__(*args, **kwargs)


def _module(name: str):
    return importlib.import_module(f"argusdiff.commands.{COMMANDS[name][0]}")


def build_parser(selected: str | None = None) -> argparse.ArgumentParser:
    """The top-level parser; only the ``selected`` subcommand's module is imported."""
    parser = Parser(
        prog="argusdiff",
        description=(
            "Quality-aware router for text-to-image serving: routes each prompt to the cheapest "
            "approximation level (cached latents, smaller models, cascades) that keeps its quality "
            "while the cluster meets its latency SLO."
        ),
    )
    parser.add_argument("--version", action="version", version=f"argusdiff {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (_, help_text) in COMMANDS.items():
        sp = sub.add_parser(name, help=help_text, description=help_text)
        if name == selected:
            _module(name).add_arguments(sp, name)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args_list = list(sys.argv[1:] if argv is None else argv)
    selected = next((a for a in args_list if not a.startswith("-")), None)
    parser = build_parser(selected if selected in COMMANDS else None)
    args = parser.parse_args(args_list)
    if not args.command:
        parser.print_help()
        return 2
    run = getattr(args, "run", None)
    if run is None:  # a command whose module did not register a runner
        parser.error(f"{args.command}: missing subcommand")
    args.argv = tuple(args_list)  # the command line as given (e.g. recorded in what a command writes)
    try:
        return int(run(args) or 0)
    except BrokenPipeError:  # e.g. `argusdiff ... | head`: not an error of ours
        with contextlib.suppress(OSError):
            sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - keep interpreter shutdown quiet
        return 0
    except ArgusdiffError as exc:
        print(f"argusdiff {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
