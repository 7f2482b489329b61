"""Running one benchmark script against two source trees, each in its own interpreter.

Every script that compares trees takes the same options (:func:`add_tree_options`):
``--after-src PATH`` (by default the ``src`` of this checkout) and ``--before-src PATH``
(none by default: then only the after-tree is measured). A before-tree is any
checkout's ``src``, e.g. of ``git worktree add ../before REV`` (benchmarks/README.md).

A script measures a tree by running itself in a child process with
``PYTHONPATH`` set to the tree's ``src``; the child prints one line
``RESULT <json>`` (:func:`print_result`) whose ``"corral"`` entry says which
corral it imported, and :func:`run_child` returns the parsed result after
checking that it was the tree's.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

RESULT_PREFIX = "RESULT "
THIS_SRC = str(Path(__file__).resolve().parents[1] / "src")


def add_tree_options(parser: argparse.ArgumentParser) -> None:
    """Add ``--before-src`` and ``--after-src`` to a script's parser."""
    parser.add_argument(
        "--before-src",
        metavar="PATH",
        help="also measure the corral of this src, alternating with --after-src, and print "
        "after / before (a checkout of the older commit: see benchmarks/README.md)",
    )
    parser.add_argument(
        "--after-src",
        metavar="PATH",
        default=THIS_SRC,
        help="the src measured (default: this checkout's)",
    )


def chosen_trees(parser: argparse.ArgumentParser, args: argparse.Namespace) -> dict[str, str]:
    """The trees to measure in the order of a round: "before" where ``--before-src`` was
    given, then "after"; a path without a corral package is a usage error."""
    trees = {"before": args.before_src, "after": args.after_src}
    trees = {name: src for name, src in trees.items() if src is not None}
    for name, src in trees.items():
        if not (Path(src) / "corral" / "__init__.py").is_file():
            parser.error(f"--{name}-src {src} holds no corral package (give a checkout's src)")
    return trees


def print_result(result: dict[str, Any]) -> None:
    """Print the child's result, with the corral it imported, for :func:`run_child`."""
    import corral

    result = {"corral": str(Path(corral.__file__).resolve()), **result}
    print(RESULT_PREFIX + json.dumps(result), flush=True)


def run_child(src: str, script: Path, args: list[str]) -> dict[str, Any]:
    """Run ``script`` with ``args`` in a fresh interpreter that imports corral from ``src``;
    the result it printed (:func:`print_result`)."""
    out = subprocess.run(
        [sys.executable, str(script), *args],
        env={**os.environ, "PYTHONPATH": src},
        capture_output=True,
        text=True,
        check=False,
    )
    lines = [line for line in out.stdout.splitlines() if line.startswith(RESULT_PREFIX)]
    if out.returncode != 0 or not lines:
        raise RuntimeError(f"measuring {src} failed (exit {out.returncode}):\n{out.stderr}")
    result = json.loads(lines[-1][len(RESULT_PREFIX) :])
    if not Path(result["corral"]).is_relative_to(Path(src).resolve()):
        raise RuntimeError(f"PYTHONPATH={src} imported corral from {result['corral']}")
    return result


def describe_tree(src: str) -> str:
    """``src`` with its git commit (and ``+changes`` when its worktree has some)."""
    git = ["git", "-C", src]
    head = subprocess.run([*git, "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    if head.returncode != 0:
        return src
    dirty = subprocess.run([*git, "status", "--porcelain", "--", "."], capture_output=True)
    return f"{src} ({head.stdout.strip()}{'+changes' if dirty.stdout.strip() else ''})"
