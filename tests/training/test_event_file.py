"""A run's TensorBoard events (corral.training.event_file) read back by TensorBoard as what
TensorBoard's own writer gives for the same rows."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("tensorboard")

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.summary import Writer
from tensorboard.util import tensor_util

from corral.errors import ConfigError
from corral.training.event_file import RunEventFile, event_file_name
from corral.training.trackers import TensorBoardTracker

ROWS = [
    {"env_steps": 0, "eval_return": -42.5, "eval_return/agent_0": -14.25},
    {"env_steps": 1600, "train_return": -26.9, "agent/policy_loss": -0.005, "eval_return": 3e38},
    {"env_steps": 3200, "train_return": float("nan"), "agent/entropy": 1.6},
]


def read(directory: Path) -> dict[str, Any]:
    """Every tag's (step, value) pairs and summary metadata as TensorBoard reads them."""
    events = EventAccumulator(str(directory))
    events.Reload()

    def values(tag: str) -> list[tuple[int, float]]:
        return [
            (e.step, tensor_util.make_ndarray(e.tensor_proto).item()) for e in events.Tensors(tag)
        ]

    return {tag: (values(tag), events.SummaryMetadata(tag)) for tag in events.Tags()["tensors"]}


def write(writer: Writer) -> None:
    tracker = TensorBoardTracker(writer)
    for row in ROWS:
        tracker.add(row)
    tracker.close()


def test_tensorboard_reads_the_rows_as_its_own_writer_wrote_them(tmp_path: Path) -> None:
    ours, theirs = tmp_path / "ours", tmp_path / "theirs"
    ours.mkdir()
    write(Writer(RunEventFile(ours)))
    write(Writer(str(theirs)))
    got, expected = read(ours), read(theirs)
    assert set(got) == {key for row in ROWS for key in row} - {"env_steps"}
    assert repr(got) == repr(expected)  # repr: NaN equals NaN
    assert got["eval_return"][0] == [(0, -42.5), (1600, pytest.approx(3e38, rel=1e-7))]
    assert got["eval_return"][1].plugin_data.plugin_name == "scalars"


def test_each_event_file_is_new(tmp_path: Path) -> None:
    first, second = RunEventFile(tmp_path), RunEventFile(tmp_path)
    first.close()
    second.close()
    names = sorted(p.name for p in tmp_path.iterdir())
    assert len(names) == 2 and all(n.startswith("events.out.tfevents.") for n in names)
    assert event_file_name() not in names  # a serial number per process


def test_a_directory_that_is_not_there_is_one_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"cannot write .*missing"):
        RunEventFile(tmp_path / "missing")
