"""docs/ray.md's "When a rollout worker is lost" says the numbers the code has: the defaults
of sample_timeout, start_timeout and runner_restarts, the losses in a row that stop a run,
and the metrics columns that count them."""

from __future__ import annotations

import dataclasses
import re

import pytest
from support.paths import ROOT

pytest.importorskip("torch", reason="the worker set's module imports the learners (torch)")

from corral.training.collector import Progress
from corral.training.config import RunConfig
from corral.vector.backend import DEFAULT_START_TIMEOUT
from corral.workers.worker_set import MAX_LOSSES_IN_ROW

SECTION = "### When a rollout worker is lost"


def section() -> str:
    text = (ROOT / "docs" / "ray.md").read_text()
    start = text.index(SECTION)
    end = text.find("\n#", start + len(SECTION))
    return " ".join(text[start:end].split())


def test_the_fault_section_says_the_settings_defaults_and_the_losses_that_stop_a_run() -> None:
    text = section()
    defaults = {f.name: f.default for f in dataclasses.fields(RunConfig)}
    said = dict(re.findall(r"`(\w+)` (?:seconds )?\(default `?(\w+)", text))
    assert said["sample_timeout"] == f"{defaults['sample_timeout']:g}"
    assert said["runner_restarts"] == str(defaults["runner_restarts"]).lower()
    assert said["start_timeout"] == f"{DEFAULT_START_TIMEOUT:g}"
    assert f"lost {MAX_LOSSES_IN_ROW} times in a row" in text
    counted = {f.name for f in dataclasses.fields(Progress)}
    for column in ("runner_restarts", "rollouts_lost", "rollouts_dropped"):
        assert f"`{column}`" in text and column in counted
