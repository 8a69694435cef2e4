"""A newcomer's first replay against the next one: CPU seconds of the main command cold and warm.

Runs ``argusdiff replay`` (the README's main job on embedded defaults, or ``-- ARGS`` instead)
twice in child processes that share one fresh cache root: the first finds every per-user cache
empty (the prompt-embedding disk cache, matplotlib's font cache; with ``--fresh-bytecode`` also
Python's bytecode of every module, harsher than a real first run, where pip compiled the
dependencies), the second finds them filled. Prints each run's CPU seconds (user + system of the
child and its children), wall seconds, and the cold/warm ratio.

Usage: python scripts/bench_first_replay.py [--fresh-bytecode] [--keep DIR] [-- replay args...]
"""

from __future__ import annotations

import argparse
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
from datetime import date
from pathlib import Path


def run(cmd: list[str], env: dict[str, str]) -> tuple[float, float, int]:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, check=False)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        sys.stderr.write(proc.stderr[-4000:])
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return cpu, wall, proc.returncode


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--fresh-bytecode", action="store_true", help="also start with no compiled bytecode")
    ap.add_argument("--keep", type=Path, help="use (and keep) this cache root instead of a temporary one")
    ap.add_argument("replay_args", nargs="*", help="arguments of argusdiff replay (after --)")
    args = ap.parse_args()

    with tempfile.TemporaryDirectory(prefix="argusdiff-first-") as tmp:
        root = args.keep or Path(tmp)
        root.mkdir(parents=True, exist_ok=True)
        env = dict(os.environ)
        for var in ("ARGUSDIFF_TRACES__EMBEDDING_CACHE_DIR", "MPLCONFIGDIR"):
            env.pop(var, None)
        env["XDG_CACHE_HOME"] = str(root / "cache")  # embeddings: $XDG_CACHE_HOME/argusdiff/embeddings
        env["MPLCONFIGDIR"] = str(root / "matplotlib")
        env["HF_HUB_OFFLINE"] = "1"
        if args.fresh_bytecode:
            env["PYTHONPYCACHEPREFIX"] = str(root / "pycache")
        out = root / "replay-out"
        cmd = [sys.executable, "-m", "argusdiff", "replay", "--quiet", *(args.replay_args or ["--out", str(out)])]
        print(f"machine: {platform.node()}, {os.cpu_count()} cores, {platform.python_implementation()} "
              f"{platform.python_version()}; {date.today().isoformat()}")  # fmt: skip
        print("command: " + " ".join(cmd[2:]))
        results = {}
        for label in ("cold", "warm"):
            cpu, wall, rc = run(cmd, env)
            if rc != 0:
                print(f"{label} run exited {rc}", file=sys.stderr)
                return rc
            results[label] = cpu
            print(f"{label}: {cpu:6.1f} CPU-s  {wall:6.1f} s wall")
        print(f"cold / warm: {results['cold'] / results['warm']:.2f}x CPU")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
