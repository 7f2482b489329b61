"""A run's metrics: rows in ``metrics.csv``, handed to its trackers (TensorBoard, wandb).

Every row has the columns of :data:`COLUMNS` (empty where a row has no such
value, e.g. ``eval_return`` between evaluations) followed by the other
columns in the order they first appeared: the algorithm's own metrics
(losses...) and the parts ``<name>/<part>`` of a column (``eval_return/predator``,
see :mod:`corral.training.scoring`), each placed after the other parts of its
``<name>`` that came before it. In TensorBoard the parts of a name share a section.
Each row then goes to the run's trackers (:mod:`corral.training.trackers`).
"""

from __future__ import annotations

import csv
import math
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from corral.errors import CheckpointError
from corral.training.run_files import open_file
from corral.training.trackers import TensorBoardTracker, Tracker

COLUMNS = (
    "env_steps",
    "wall_time",
    "steps_per_s",
    "train_return",
    "train_episodes",
    "eval_return",
    "eval_return_std",
    "eval_cut",
)
"""The columns every ``metrics.csv`` starts with."""

Row = dict[str, float]

METRICS = "metrics.csv"
MAX_COLUMN = 256


class MetricsLog:
    """Appends rows to ``run_dir/metrics.csv`` and hands each to the trackers: TensorBoard's
    (events in ``run_dir/tb``, where ``tensorboard`` and it is installed) and ``trackers``."""

    def __init__(
        self,
        run_dir: str | Path,
        rows: Iterable[Row] = (),
        tensorboard: bool = True,
        trackers: Sequence[Tracker] = (),
    ):
        self.run_dir = Path(run_dir)
        self.path = self.run_dir / METRICS
        self.rows: list[Row] = [dict(r) for r in rows]
        self.columns = list(COLUMNS)
        for row in self.rows:
            self._add_columns(row)
        self._rewrite()
        board = TensorBoardTracker.open(self.run_dir) if tensorboard else None
        self.trackers: list[Tracker] = [*([board] if board is not None else []), *trackers]

    @property
    def tensorboard(self) -> bool:
        """Whether rows also go to TensorBoard."""
        return any(isinstance(t, TensorBoardTracker) for t in self.trackers)

    def add_tracker(self, tracker: Tracker) -> None:
        """Hand the rows added from now on to ``tracker`` too (closed with this log)."""
        self.trackers.append(tracker)

    def add(self, row: Mapping[str, float]) -> None:
        """Append ``row`` (``env_steps`` is required) to the CSV, then hand it to each tracker."""
        row = {k: float(v) for k, v in row.items() if v is not None and not _is_nan(v)}
        self.rows.append(row)
        if self._add_columns(row):
            self._rewrite()
        else:
            with open_file(self.run_dir, METRICS, "a") as file:
                csv.DictWriter(file, self.columns, lineterminator="\n").writerow(_cells(row))
        for tracker in self.trackers:
            tracker.add(row)

    def close(self) -> None:
        """Close every tracker (each once, all of them even where one raises)."""
        trackers, self.trackers = self.trackers, []
        _close_all(trackers)

    def _add_columns(self, row: Row) -> bool:
        new = [k for k in row if k not in self.columns]
        for key in new:
            name = key.partition("/")[0]
            kin = [
                i
                for i, c in enumerate(self.columns)
                if i >= len(COLUMNS) and c.partition("/")[0] == name
            ]
            self.columns.insert(kin[-1] + 1 if kin else len(self.columns), key)
        return bool(new)

    def _rewrite(self) -> None:
        with open_file(self.run_dir, METRICS) as file:
            writer = csv.DictWriter(file, self.columns, lineterminator="\n")
            writer.writeheader()
            writer.writerows(_cells(r) for r in self.rows)


def read_metrics(path: str | Path) -> list[Row]:
    """The rows of a ``metrics.csv`` (or of ``RUN/metrics.csv``), empty cells left out."""
    path = Path(path)
    if path.is_dir():
        path = path / "metrics.csv"
    with open(path, newline="") as file:
        return [
            {k: float(v) for k, v in row.items() if v not in ("", None)}
            for row in csv.DictReader(file)
        ]


def checked_rows(rows: Any, source: str) -> list[Row]:
    """The metrics rows that a checkpoint read from ``source`` holds, refused with a
    :class:`~corral.errors.CheckpointError` naming ``source`` unless they are rows as a run
    writes them: a list of dicts of column names (:func:`is_column`) to numbers (int or
    float; a loss may be infinite, never NaN), each with ``env_steps``."""
    if type(rows) is not list:
        raise CheckpointError(f"{source}: its metrics are a {type(rows).__name__}, not a list")
    for i, row in enumerate(rows):
        if type(row) is not dict or "env_steps" not in row:
            raise CheckpointError(f"{source}: metrics row {i} is not a dict with env_steps")
        for key, value in row.items():
            if not is_column(key):
                raise CheckpointError(
                    f"{source}: metrics row {i} has the key {_short(key)}, which is no column "
                    "name (printable text starting with a letter, digit or _)"
                )
            if type(value) not in (int, float) or math.isnan(value):
                raise CheckpointError(
                    f"{source}: metrics row {i} has {key} = {_short(value)}, not a number"
                )
    return rows


def is_column(name: Any) -> bool:
    """Whether ``name`` can be a column of ``metrics.csv``: printable text of at most
    :data:`MAX_COLUMN` characters starting with a letter, digit or ``_``."""
    return (
        type(name) is str
        and 0 < len(name) <= MAX_COLUMN
        and name.isprintable()
        and (name[0].isalnum() or name[0] == "_")
    )


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _cells(row: Row) -> dict[str, Any]:
    return {k: (int(v) if k in ("env_steps", "train_episodes") else v) for k, v in row.items()}


def _is_nan(value: Any) -> bool:
    return isinstance(value, float) and math.isnan(value)


def _close_all(trackers: Sequence[Tracker]) -> None:
    if not trackers:
        return
    try:
        trackers[0].close()
    finally:
        _close_all(trackers[1:])
