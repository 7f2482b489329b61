"""A run's metrics: rows in ``metrics.csv`` and, when installed, TensorBoard scalars.

Every row has the columns of :data:`COLUMNS` (empty where a row has no such
value, e.g. ``eval_return`` between evaluations) followed by the other
columns in the order they first appeared: the algorithm's own metrics
(losses...) and the parts ``<name>/<part>`` of a column (``eval_return/predator``,
see :mod:`corral.training.scoring`), each placed after the other parts of its
``<name>`` that came before it. In TensorBoard the parts of a name share a section.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

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


class MetricsLog:
    """Appends rows to ``run_dir/metrics.csv`` (and TensorBoard events in ``run_dir/tb``)."""

    def __init__(self, run_dir: str | Path, rows: Iterable[Row] = (), tensorboard: bool = True):
        self.path = Path(run_dir) / "metrics.csv"
        self.rows: list[Row] = [dict(r) for r in rows]
        self.columns = list(COLUMNS)
        for row in self.rows:
            self._add_columns(row)
        self._rewrite()
        self._writer = _tensorboard_writer(Path(run_dir) / "tb") if tensorboard else None

    @property
    def tensorboard(self) -> bool:
        """Whether rows also go to TensorBoard."""
        return self._writer is not None

    def add(self, row: Mapping[str, float]) -> None:
        """Append ``row`` (``env_steps`` is required) to the CSV and TensorBoard."""
        row = {k: float(v) for k, v in row.items() if v is not None and not _is_nan(v)}
        self.rows.append(row)
        if self._add_columns(row):
            self._rewrite()
        else:
            with open(self.path, "a", newline="") as file:
                csv.DictWriter(file, self.columns, lineterminator="\n").writerow(_cells(row))
        if self._writer is not None:
            step = int(row["env_steps"])
            for key, value in row.items():
                if key != "env_steps":
                    self._writer.add_scalar(key, value, step)
            self._writer.flush()

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None

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
        with open(self.path, "w", newline="") as file:
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


def _cells(row: Row) -> dict[str, Any]:
    return {k: (int(v) if k in ("env_steps", "train_episodes") else v) for k, v in row.items()}


def _is_nan(value: Any) -> bool:
    return isinstance(value, float) and math.isnan(value)


def _tensorboard_writer(path: Path) -> Any:
    try:
        from tensorboard.summary import Writer
    except ModuleNotFoundError:
        return None
    return Writer(str(path))
