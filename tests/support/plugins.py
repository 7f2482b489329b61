"""Plugin packages as ``pip install`` leaves them, registering envs through entry points."""

from __future__ import annotations

import uuid
from pathlib import Path


def installed_package(directory: Path, entry_points: dict[str, str], modules: dict[str, str]):
    """A package as ``pip install`` leaves it in ``directory`` (a dist-info with the
    ``corral.envs`` entry points, and its modules); put ``directory`` on ``sys.path``."""
    dist = f"plugin_{uuid.uuid4().hex[:8]}"
    info = directory / f"{dist}-1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 1.0\n")
    lines = [f"{name} = {value}" for name, value in entry_points.items()]
    (info / "entry_points.txt").write_text("[corral.envs]\n" + "\n".join(lines) + "\n")
    for name, text in modules.items():
        (directory / f"{name}.py").write_text(text)
    return dist


def plugin_module(source: str) -> str:
    """A module that registers ``SOURCE/rps`` on import and ``SOURCE/more`` in ``more()``."""
    return (
        "import corral\n\n"
        f"corral.register('{source}/rps', 'corral.envs.rps:RockPaperScissors')\n\n\n"
        "def more():\n"
        f"    corral.register('{source}/more', 'corral.envs.rps:RockPaperScissors')\n"
    )
