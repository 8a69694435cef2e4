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
