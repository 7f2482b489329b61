"""The benchmark scripts' measuring functions still run on this tree, for a tiny budget.

Nothing here judges a time: the numbers are printed by the scripts and kept in
benchmarks/README.md. These tests only catch a script that no longer runs.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from types import ModuleType

import pytest

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


def script(name: str, monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    # On sys.path, so that processes started with "spawn" can import it too.
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    return importlib.import_module(name)


def test_layer_overhead_splits_a_step_into_env_and_layer_time(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    layer_overhead = script("layer_overhead", monkeypatch)
    for copy in (False, True):
        times = layer_overhead.measure_layer("corral/rps", 4, copy, 0.05)
        assert 0 < times["env"] < times["timed_total"]
        assert times["layer"] == pytest.approx(times["total"] - times["env"])


def test_the_timing_proxy_passes_for_the_env_it_times(monkeypatch: pytest.MonkeyPatch) -> None:
    import corral

    layer_overhead = script("layer_overhead", monkeypatch)
    clock = layer_overhead.Clock()
    env = corral.make("corral/rps")
    timed = layer_overhead.timed_env_class()(env, clock)
    assert corral.adapt(timed) is timed
    timed.check_actions = False  # what the vector layer does to a corral env
    assert env.check_actions is False
    assert timed.possible_agents == env.possible_agents
    assert timed.state_space == env.state_space
    timed.reset(seed=0)
    assert clock.seconds > 0
    assert timed.agents == env.agents


def test_the_ceiling_runs_two_processes_together(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("mpe2")
    vector_throughput = script("vector_throughput", monkeypatch)
    assert vector_throughput.bench_ceiling(2, 0.05) > 0
