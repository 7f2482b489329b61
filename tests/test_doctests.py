"""Every example (``>>>``) in corral's docstrings runs as shown.

Each module of ``src/corral`` whose source holds an example is one test; a module whose
optional dependency is not installed is skipped, naming it. No example is skipped: one that
would take long is written to be short.
"""

from __future__ import annotations

import doctest
import importlib
from pathlib import Path

import pytest

import corral
from corral.errors import MissingDependencyError

SRC = Path(corral.__file__).parent


def modules_with_examples() -> list[str]:
    """The dotted names of corral's modules whose source holds a ``>>>`` example."""
    found = []
    for path in sorted(SRC.rglob("*.py")):
        if ">>>" in path.read_text(encoding="utf-8"):
            parts = path.relative_to(SRC.parent).with_suffix("").parts
            found.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return found


MODULES = modules_with_examples()


def test_examples_are_found() -> None:
    assert len(MODULES) >= 8, MODULES


@pytest.mark.parametrize("name", MODULES)
def test_module_examples_run(name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # an example that writes files writes them here
    try:
        module = importlib.import_module(name)
    except (ModuleNotFoundError, MissingDependencyError) as err:
        if isinstance(err, ModuleNotFoundError) and (err.name or "").startswith("corral"):
            raise
        pytest.skip(f"{name} needs an optional dependency that is not installed: {err}")
    finder = doctest.DocTestFinder(exclude_empty=True)
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS)
    tests = finder.find(module, name)
    skipped = [
        f"{test.name} line {example.lineno}"
        for test in tests
        for example in test.examples
        if example.options.get(doctest.SKIP)
    ]
    assert not skipped, f"examples skipped (make them short instead): {skipped}"
    for test in tests:
        runner.run(test)
    result = runner.summarize(verbose=False)
    assert result.attempted > 0, f"{name}: no example found, but its source holds '>>>'"
    assert result.failed == 0, f"{name}: {result.failed} of {result.attempted} examples failed"
