"""Where a run's metrics rows go besides ``metrics.csv``: TensorBoard and wandb.

A tracker receives each row as :class:`~corral.training.metrics.MetricsLog` writes it to
the CSV (the same keys and values; ``env_steps`` is the step) and is closed with the run.
TensorBoard events go to a new file of ``run_dir/tb`` when ``tensorboard`` is installed,
opened as every file of the run is (:mod:`corral.training.event_file`). wandb
(``logger=wandb``, ``pip install 'corral[track]'``) gets the run's config as
``config.yaml`` holds it once, then every row, in a wandb run whose files stay in
``run_dir/wandb``: offline (``wandb sync run_dir/wandb/offline-run-*`` uploads it later)
unless ``wandb_mode=online`` or the environment's ``WANDB_MODE=online`` asks for the
network. Its id is kept in ``run_dir/wandb_id.txt``, so that a resumed run continues the
same wandb run.
"""

from __future__ import annotations

import os
import re
import secrets
import types
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

from corral.errors import ConfigError, MissingDependencyError
from corral.training import run_files

TENSORBOARD = "tb"
"""The directory of a run's TensorBoard events."""
WANDB_DIR = "wandb"
"""The directory of a run's wandb files."""
WANDB_ID = "wandb_id.txt"
"""The file holding the id of a run's wandb run."""
TRACK_EXTRA = "pip install 'corral[track]'"
_ID = re.compile(r"[a-z0-9]{1,64}")


class Tracker(Protocol):
    """Receives each metrics row of a run (keys as in ``metrics.csv``)."""

    def add(self, row: Mapping[str, float]) -> None:
        """Record ``row`` at step ``row["env_steps"]``."""

    def close(self) -> None:
        """Write out what is pending and let go of the files."""


class TensorBoardTracker:
    """Scalars in ``run_dir/tb``, one per column of each row, in TensorBoard's events."""

    def __init__(self, writer: Any) -> None:
        self.writer = writer

    @classmethod
    def open(cls, run_dir: str | Path) -> TensorBoardTracker | None:
        """The tracker writing to ``run_dir/tb``; ``None`` where tensorboard is not installed."""
        try:
            from tensorboard.summary import Writer

            from corral.training.event_file import RunEventFile
        except ModuleNotFoundError:
            return None
        return cls(Writer(RunEventFile(run_files.make_subdir(run_dir, TENSORBOARD))))

    def add(self, row: Mapping[str, float]) -> None:
        step = int(row["env_steps"])
        for key, value in row.items():
            if key != "env_steps":
                self.writer.add_scalar(key, value, step)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


def import_wandb() -> types.ModuleType:
    """The ``wandb`` module; a :class:`MissingDependencyError` naming the extra without it."""
    try:
        import wandb
    except ModuleNotFoundError as err:
        raise MissingDependencyError(
            f"logger=wandb needs wandb, which is not installed: {TRACK_EXTRA}"
        ) from err
    return wandb


def wandb_mode(setting: str | None) -> str:
    """The mode a wandb run starts in: ``setting`` (``wandb_mode``), else ``WANDB_MODE``
    from the environment, else ``offline`` (a run never waits for the network unless asked)."""
    return setting or os.environ.get("WANDB_MODE") or "offline"


class WandbTracker:
    """A wandb run receiving the run's config once and each metrics row, its files in
    ``run_dir/wandb``, its id in ``run_dir/wandb_id.txt`` (continued when the run resumes)."""

    def __init__(
        self,
        run_dir: str | Path,
        config: Mapping[str, Any],
        *,
        project: str = "corral",
        mode: str | None = None,
    ) -> None:
        wandb = import_wandb()
        run_dir = Path(run_dir)
        resumed = read_wandb_id(run_dir)
        self.id = resumed or secrets.token_hex(4)
        if resumed and wandb_mode(mode) == "offline":
            warnings.warn(
                f"wandb cannot resume an offline run: this session's rows go to a new "
                f"offline-run-* directory of the id {resumed} in {run_dir / WANDB_DIR}, which "
                "wandb sync does not join to the first (sync each with an --id of its own, or "
                "resume with wandb_mode=online)",
                stacklevel=2,
            )
        run_files.make_subdir(run_dir, WANDB_DIR)
        run_files.write_text(run_dir, WANDB_ID, self.id + "\n")
        self.run = wandb.init(
            project=project,
            id=self.id,
            name=run_dir.name,
            resume="allow",
            dir=str(run_dir),
            mode=wandb_mode(mode),
            reinit="create_new",
            settings=wandb.Settings(silent=True, console="off"),
        )
        # the config once, as config.yaml has it; a resumed run may change its schedule
        self.run.config.update(dict(config), allow_val_change=True)
        self.run.define_metric("env_steps")
        self.run.define_metric("*", step_metric="env_steps")

    def add(self, row: Mapping[str, float]) -> None:
        self.run.log(dict(row))

    def close(self) -> None:
        self.run.finish()


def read_wandb_id(run_dir: str | Path) -> str | None:
    """The id of the run's wandb run kept in ``run_dir/wandb_id.txt`` (``None`` where there
    is none); anything but a short lower-case id there is refused, naming the file."""
    path = Path(run_dir) / WANDB_ID
    if not path.is_file():
        return None
    text = path.read_text(encoding="utf-8", errors="replace").strip()
    if not _ID.fullmatch(text):
        raise ConfigError(
            f"{path} holds {text[:40]!r}, not a wandb run id (1 to 64 lower-case letters and "
            "digits); remove it to start a new wandb run"
        )
    return text
