"""No function, method or class of corral is defined and then named nowhere else."""

from __future__ import annotations

import ast
import re
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SOURCES = ("src/**/*.py", "tests/**/*.py", "examples/**/*.py", "benchmarks/**/*.py")
DOCS = ("*.md", "docs/**/*.md")

# Named nowhere in this repository, yet used from outside it.
USED_OUTSIDE = {
    "num_agents": "PettingZoo's API, which MultiAgentEnv keeps for its users",
    "max_num_agents": "PettingZoo's API, which MultiAgentEnv keeps for its users",
    "emit_scalar": "TensorBoard's Output API, which its summary Writer calls",
    "emit": "logging's Handler API, which a logger calls",
}


def test_every_definition_is_named_somewhere_else() -> None:
    words: Counter[str] = Counter()
    for pattern in SOURCES + DOCS:
        for path in ROOT.glob(pattern):
            words.update(re.findall(r"\w+", path.read_text(encoding="utf-8")))
    unused = []
    for path in sorted(ROOT.glob("src/corral/**/*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            defines = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
            if not isinstance(node, defines) or node.name.startswith("__"):
                continue
            if words[node.name] <= 1 and node.name not in USED_OUTSIDE:
                unused.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name}")
    assert unused == [], "defined, and named nowhere else (dead code?)"
