"""MAPPO and IPPO learning from time-major rollouts against the per-agent row path.

The row path (:mod:`oracles.rows`: ``TransitionAssembler`` rows, row-wise GAE,
``MAPPOLearner.ppo`` on the rows) is the oracle: with one minibatch per epoch
the order of rows does not matter, so the same seeds must give the same
networks after several updates, up to float32 rounding.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from oracles.rows import RowCollector  # noqa: E402

import corral  # noqa: E402
from corral.algos.mappo import IPPO, MAPPO  # noqa: E402
from corral.training import Runner, load_config  # noqa: E402
from corral.training.collector import Collector  # noqa: E402
from corral.training.self_play import self_play  # noqa: E402

CASES = [
    ("corral/rps", {}),  # turn-based: the first mover's reward
    ("corral/rps4", {}),  # idle agents
    ("corral/tag", {}),  # dying agents
    ("mpe2/simple_spread_v3", {}),  # native MPE, truncation at max_cycles
    ("mpe2/simple_spread_v3", {"bootstrap_truncated": True}),
]


def trained(collect: type, algo_cls: type, env_id: str, updates: int = 3, **settings) -> dict:
    """The networks after ``updates`` updates of rollouts of 10 vector steps of 4 envs."""
    venv = corral.make_vec(env_id, 4, "sync", seed=0, state=algo_cls.uses_state)
    config = algo_cls.Config(rollout_steps=10, epochs=2, minibatches=1, seed=0, **settings)
    algo = algo_cls(venv, config)
    players = self_play(venv, algo) if config.self_play else {}
    collector = collect(venv, algo, seed=0, **players)
    while algo.updates < updates:
        collector.run(venv.num_envs)
    venv.close()
    return {
        f"{g}/{name}": value.detach().double().clone()
        for g, nets in algo.policy.nets.items()
        for name, value in nets.state_dict().items()
    }


def max_difference(a: dict, b: dict) -> float:
    assert a.keys() == b.keys()
    return max(float((a[k] - b[k]).abs().max()) for k in a)


@pytest.mark.parametrize("algo_cls", [MAPPO, IPPO], ids=["mappo", "ippo"])
@pytest.mark.parametrize(("env_id", "settings"), CASES, ids=[f"{i}{s}" for i, s in CASES])
def test_rollouts_learn_what_rows_learn(algo_cls, env_id, settings):
    rows = trained(RowCollector, algo_cls, env_id, **settings)
    rollouts = trained(Collector, algo_cls, env_id, **settings)
    initial = trained(Collector, algo_cls, env_id, updates=0, **settings)
    assert max_difference(rows, initial) > 1e-3  # the updates moved the networks
    assert max_difference(rows, rollouts) < 1e-5


def test_self_play_learns_only_the_learners_decisions():
    settings = {"self_play": True, "snapshot_interval": 1}
    env_id = "pettingzoo/classic/tictactoe_v3"
    rows = trained(RowCollector, MAPPO, env_id, **settings)
    rollouts = trained(Collector, MAPPO, env_id, **settings)
    assert max_difference(rows, rollouts) < 1e-5


def test_bootstrapping_truncated_decisions_changes_what_is_learned():
    # the bootstrap case above is not the plain one: truncations happen in its window
    plain = trained(Collector, MAPPO, "mpe2/simple_spread_v3")
    boot = trained(Collector, MAPPO, "mpe2/simple_spread_v3", bootstrap_truncated=True)
    assert max_difference(plain, boot) > 1e-4


def test_the_runner_learns_mappo_from_rollouts(tmp_path):
    settings = {"num_envs": 4, "total_steps": 160, "eval_every": 0, "rollout_steps": 10}
    config = load_config("mappo", "corral/rps", {**settings, "run_dir": str(tmp_path / "run")})
    with Runner(config, progress=False) as runner:
        assert isinstance(runner.collector, Collector)
        runner.train()
        assert runner.algo.updates == 4
