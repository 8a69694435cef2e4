"""The CLI: help works without heavy imports; bad usage exits 2 naming the problem."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from argusdiff import cli

HEAVY = ("torch", "diffusers", "timm", "open_clip", "transformers")


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "argusdiff", *args], capture_output=True, text=True, timeout=120)


def test_importing_the_cli_and_every_help_imports_no_heavy_module():
    """`argusdiff --help` and every `argusdiff <cmd> --help` run without torch & co."""
    code = (
        "import sys, contextlib, io\n"
        "from argusdiff import cli\n"
        "names = [None, *cli.COMMANDS]\n"
        "for name in names:\n"
        "    argv = ['--help'] if name is None else [name, '--help']\n"
        "    with contextlib.redirect_stdout(io.StringIO()):\n"
        "        try:\n"
        "            cli.main(argv)\n"
        "        except SystemExit as e:\n"
        "            assert e.code == 0, (name, e.code)\n"
        f"heavy = sorted(m for m in sys.modules if m.split('.')[0] in {HEAVY!r})\n"
        "print(','.join(heavy))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "", f"heavy modules imported: {out.stdout}"


@pytest.mark.parametrize("name", list(cli.COMMANDS))
def test_every_subcommand_has_help(name, capsys):
    with pytest.raises(SystemExit) as info:
        cli.main([name, "--help"])
    assert info.value.code == 0
    assert "usage: argusdiff" in capsys.readouterr().out


def test_profiles_listing_and_show():
    out = _run("profiles", "--json")
    assert out.returncode == 0, out.stderr
    names = {p["name"] for p in json.loads(out.stdout)}
    assert {"sdxl-ac-a100", "sm-a100"} <= names
    show = _run("profile", "show", "sdxl-ac-a100", "--json")
    assert show.returncode == 0
    assert [lv["skip"] for lv in json.loads(show.stdout)["levels"]] == [0, 5, 10, 15, 20, 25]


def test_bad_usage_exits_2_and_names_the_problem():
    out = _run("profile", "show", "no-such-profile")
    assert out.returncode == 2
    assert "no-such-profile" in out.stderr
    assert "Traceback" not in out.stderr
    out = _run("profiles", "--bogus")
    assert out.returncode == 2
    assert "--bogus" in out.stderr
    out = _run("no-such-command")
    assert out.returncode == 2


def test_a_closed_pipe_is_not_a_traceback():
    """`argusdiff profiles | head -1` ends quietly."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "argusdiff", "profiles"], stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    proc.stdout.close()  # the reader went away before the first line
    _, err = proc.communicate(timeout=120)
    assert b"Traceback" not in err, err.decode()
    assert proc.returncode == 0


def _every_parser():
    """(command path, parser) of every command and sub-command."""
    import argparse

    def walk(parser, path):
        yield path, parser
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    yield from walk(sub, [*path, name])

    for name in cli.COMMANDS:
        top = cli.build_parser(name)
        (subs,) = [a for a in top._actions if isinstance(a, argparse._SubParsersAction)]
        yield from walk(subs.choices[name], [name])


def test_every_option_has_help_and_states_its_default_once():
    """`replay --help` used to show "(default 0.1) (default: None)" and `--seed` had no help."""
    import argparse

    checked = 0
    for path, parser in _every_parser():
        formatter = parser._get_formatter()
        for action in parser._actions:
            if isinstance(action, argparse._HelpAction | argparse._SubParsersAction):
                continue
            where = f"argusdiff {' '.join(path)} {'/'.join(action.option_strings) or action.dest}"
            text = formatter._expand_help(action) if action.help else ""
            assert text.strip(), f"{where}: no help"
            assert text.lower().count("default") <= 1, f"{where}: {text!r}"
            assert "(default: None)" not in text, where
            if action.option_strings and action.nargs != 0 and action.default not in (None, False):
                assert str(action.default) in text, f"{where}: default {action.default!r} not in {text!r}"
            checked += 1
    assert checked > 100


def test_replay_help_shows_one_default_per_option():
    out = _run("replay", "--help")
    assert out.returncode == 0
    assert "(default: None)" not in out.stdout
    assert "--seed SEED" in out.stdout and "(default: 0)" in out.stdout
    assert "0.1) (default" not in out.stdout


def test_worker_says_at_once_that_redis_is_unreachable():
    """It used to print nothing for 20 s (the --wait-s loop on an unreachable Redis)."""
    out = _run("worker", "--redis", "redis://:secret@127.0.0.1:1/0", "--wait-s", "600")
    assert out.returncode == 2, out.stderr  # (the 600 s wait for a deployment would time the test out)
    assert "--redis" in out.stderr and "unreachable" in out.stderr and "127.0.0.1:1" in out.stderr
    assert "secret" not in out.stderr and "Traceback" not in out.stderr
    bad = _run("worker", "--redis", "http://localhost:6379")
    assert bad.returncode == 2 and "--redis" in bad.stderr and "not a Redis URL" in bad.stderr
