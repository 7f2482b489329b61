"""The tests' own layout: folders that mirror ``src/corral/``'s packages, test modules of
unique names, and helpers shared through ``tests/support/`` (no test module imports another).
"""

from __future__ import annotations

import ast
import re
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

from support.paths import SRC, TESTS

NOT_MIRRORS = ("support", "oracles")
"""Folders of ``tests/`` that mirror no package: the shared helpers, and the paths corral
replaced (kept as the oracles of differential tests, with the tests of those oracles)."""

NAMED = re.compile(r"(?<![\w./])(test_\w+|conftest)(?=:\w|\.(?!py\b)\w)|(?:from|import) (test_\w+)")
"""A module named in a string: ``"module:attr"`` (the CLI, ``--policies``, a run's
config), ``"module.attr"`` (``monkeypatch.setattr``) or an import in code run elsewhere."""


def files_of_tests() -> list[Path]:
    """Every test module under tests/, in subfolders too."""
    return sorted(TESTS.rglob("test_*.py"))


def test_every_test_folder_mirrors_a_package_of_corral() -> None:
    folders = {path.parent.relative_to(TESTS) for path in files_of_tests()} - {Path()}
    strays = [
        str(folder)
        for folder in sorted(folders)
        if folder.parts[0] not in NOT_MIRRORS and not (SRC / "corral" / folder).is_dir()
    ]
    assert strays == [], "test folders with no package of src/corral/ of the same path"


def test_helpers_live_in_support() -> None:
    helpers = [
        str(path.relative_to(TESTS))
        for path in sorted(TESTS.rglob("*.py"))
        if not path.name.startswith("test_")
        and path.name != "conftest.py"
        and path.relative_to(TESTS).parts[0] not in NOT_MIRRORS
    ]
    assert helpers == [], "modules that tests import belong in tests/support/"


def test_test_modules_have_unique_names() -> None:
    # pytest's default import mode imports a test module by its file name
    counts = Counter(path.name for path in files_of_tests())
    assert [name for name, count in counts.items() if count > 1] == []


def named_modules(tree: ast.AST) -> Iterator[tuple[int, str]]:
    """The modules ``tree`` imports or names in a string, with their lines."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from ((node.lineno, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            yield node.lineno, node.module
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            for match in NAMED.finditer(node.value):
                yield node.lineno, match.group(1) or match.group(2)


def test_no_test_module_imports_another() -> None:
    local = {path.stem for path in files_of_tests()} | {"conftest"}
    found = []
    for path in sorted(TESTS.rglob("*.py")):
        for line, module in named_modules(ast.parse(path.read_text(encoding="utf-8"))):
            if module.split(".")[0] in local:
                found.append(f"{path.relative_to(TESTS)}:{line} {module}")
    assert found == [], "shared helpers belong in tests/support/"
