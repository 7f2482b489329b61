"""Every code block of README.md, docs/*.md and benchmarks/README.md is exercised as shown.

One test per fenced block, named ``file:line`` of its opening fence:

* a ```` ```python ```` block runs as a script of its own (in a subprocess, in an
  empty directory, so the runs it writes go there; ``examples`` is importable, as
  from the repository root);
* a shell block (``sh``, ``bash``, ``console``, ``shell``) has each ``corral ...``
  command parsed by the CLI's own parser, not run: a renamed flag or command fails;
  other commands (``make``, ``pip``, ``ray``, ``python``) are not checked;
* a block right after a line ``<!-- skip: <why> -->`` is reported as skipped, with
  that reason (a fragment, or a package that cannot be installed here);
* a block that stops on a ``MissingDependencyError`` (an optional extra that is not
  installed) is skipped, with corral's message naming the extra.

Other blocks (output, YAML, ``pycon`` sessions, which ``test_checker`` runs) are not
collected.
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import os
import re
import shlex
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from corral import cli

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), ROOT / "benchmarks/README.md"]
SHELLS = frozenset({"sh", "bash", "console", "shell"})
TIMEOUT_S = 180  # a block should take a few seconds; this only stops one that hangs

FENCE = re.compile(r"^(\s*)```(\S*)\s*$")
SKIP = re.compile(r"^<!--\s*skip:\s*(.*?)\s*-->$")


@dataclass(frozen=True)
class Block:
    """One fenced code block of a page."""

    page: Path
    line: int
    """Line of the opening fence (1-based)."""
    language: str
    code: str
    skip: str | None
    """The reason of a ``<!-- skip: ... -->`` line just before the block."""

    @property
    def name(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def blocks(page: Path) -> Iterator[Block]:
    """The fenced blocks of ``page``, in order."""
    lines = page.read_text().splitlines()
    i = 0
    while i < len(lines):
        opening = FENCE.match(lines[i])
        if opening is None:
            i += 1
            continue
        indent, language = opening.groups()  # a block in a list item is indented
        end = next((j for j in range(i + 1, len(lines)) if lines[j].strip() == "```"), None)
        if end is None:
            raise ValueError(f"{page}:{i + 1}: code block without a closing fence")
        before = next((s.strip() for s in reversed(lines[:i]) if s.strip()), "")
        marker = SKIP.match(before)
        code = "\n".join(s.removeprefix(indent) for s in lines[i + 1 : end]) + "\n"
        yield Block(page, i + 1, language, code, marker.group(1) if marker else None)
        i = end + 1


ALL = [b for page in PAGES for b in blocks(page)]
PYTHON = [b for b in ALL if b.language == "python"]
SHELL = [b for b in ALL if b.language in SHELLS]


def test_every_page_is_collected() -> None:
    assert {ROOT / "README.md", ROOT / "docs/training.md", ROOT / "docs/vector.md"} <= set(PAGES)
    assert len(PYTHON) >= 10 and len(SHELL) >= 3


@pytest.mark.parametrize("block", PYTHON, ids=lambda b: b.name)
def test_python_block_runs_as_a_script(block: Block, tmp_path: Path) -> None:
    if block.skip is not None:
        pytest.skip(block.skip)
    script = tmp_path / "block.py"
    script.write_text(block.code)
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
    # One torch thread: tiny models gain nothing from more, and lose much on a busy machine.
    env = dict(os.environ, PYTHONPATH=path, MPLBACKEND="Agg", OMP_NUM_THREADS="1")
    done = subprocess.run(
        [sys.executable, str(script)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
    )
    missing = re.search(r"MissingDependencyError: (.*)", done.stderr)
    if done.returncode != 0 and missing:
        pytest.skip(missing.group(1))
    assert done.returncode == 0, f"{block.name} failed:\n{block.code}\n{done.stderr[-4000:]}"


def commands(block: Block) -> list[list[str]]:
    """The commands of a shell block, as words (``console``: the ``$`` lines only)."""
    text = block.code.replace("\\\n", " ")
    lines = text.splitlines()
    if block.language == "console":
        lines = [line[2:] for line in lines if line.startswith("$ ")]
    return [words for line in lines if (words := shlex.split(line, comments=True))]


@pytest.mark.parametrize("block", SHELL, ids=lambda b: b.name)
def test_corral_commands_of_a_shell_block_parse(block: Block) -> None:
    if block.skip is not None:
        pytest.skip(block.skip)
    corral = [words[1:] for words in commands(block) if words[0] == "corral"]
    if not corral:
        pytest.skip("no corral command (make, pip, ray and python lines are not checked)")
    parser = cli._parser()
    for argv in corral:
        stderr = io.StringIO()
        with contextlib.redirect_stderr(stderr), contextlib.redirect_stdout(io.StringIO()):
            try:
                parser.parse_args(argv)
            except SystemExit:
                pytest.fail(f"{block.name}: `corral {shlex.join(argv)}`: {stderr.getvalue()}")


def test_a_skip_marker_names_its_block_and_reason(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text(
        "text\n\n<!-- skip: a fragment -->\n```python\nx\n```\n\n```sh\ncorral list\n```\n"
        "\n- item:\n\n  ```python\n  if y:\n      z\n  ```\n"
    )
    first, second, third = blocks(page)
    assert (first.line, first.code, first.skip) == (4, "x\n", "a fragment")
    assert (second.line, second.language, second.skip) == (8, "sh", None)
    assert (third.line, third.language, third.code, third.skip) == (
        14,
        "python",
        "if y:\n    z\n",
        None,
    )


def test_a_stale_corral_flag_fails_the_shell_check() -> None:
    block = Block(ROOT / "README.md", 1, "sh", "corral train mappo --envs x  # old flag\n", None)
    with pytest.raises(pytest.fail.Exception, match="--envs"):
        test_corral_commands_of_a_shell_block_parse(block)


def test_the_docs_give_mappos_default_for_truncated_episodes() -> None:
    pytest.importorskip("torch")
    from corral.algos.mappo import Config

    for page in ("docs/design.md", "docs/training.md"):
        said = re.findall(r"by default \(`bootstrap_truncated=(\w+)`\)", (ROOT / page).read_text())
        assert said == [str(Config().bootstrap_truncated)], page


def test_packaged_configs_use_the_actions_the_benchmark_measured() -> None:
    # The README and docs/training.md quote these results for `corral train ALGO --env ENV`.
    pytest.importorskip("yaml")
    from corral.training import load_config

    spec = importlib.util.spec_from_file_location(
        "learn_spread", ROOT / "benchmarks/learn_spread.py"
    )
    assert spec is not None and spec.loader is not None
    learn_spread = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(learn_spread)
    for algo, continuous in learn_spread.CONTINUOUS.items():
        kwargs = load_config(algo, learn_spread.ENV).run.env_kwargs
        assert kwargs.get("continuous_actions", False) == continuous, algo
