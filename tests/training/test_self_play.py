"""``--self-play`` as a policy map: the learner's seat per episode, the snapshot pool in the
other seats, snapshots every ``snapshot_interval``, and the pool in checkpoints."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from support.runs import Killed, kill_after_checkpoint, without_time  # noqa: E402

from corral.algos.selfplay import SnapshotPool  # noqa: E402
from corral.training import Runner, load_config  # noqa: E402
from corral.training import checkpoint as ckpt  # noqa: E402
from corral.training.policy_map import MAIN  # noqa: E402
from corral.training.runner import LATEST, evaluate_policy  # noqa: E402
from corral.training.self_play import OPPONENT, SeatSwap  # noqa: E402

TICTACTOE = "pettingzoo/classic/tictactoe_v3"


def self_play_config(
    tmp_path: Path, name: str, algo: str = "mappo", env: str = "corral/rps", **settings: Any
) -> Any:
    base = {
        "self_play": True,
        "num_envs": 4,
        "total_steps": 160,
        "eval_every": 80,
        "eval_episodes": 4,
        "log_every": 16,
        "device": "cpu",
        "run_dir": str(tmp_path / name),
    }
    if algo == "mappo":
        base |= {"rollout_steps": 4, "epochs": 1, "snapshot_interval": 2, "pool_size": 3}
    return load_config(algo, env, {**base, **settings})


def test_self_play_seats_the_learner_by_episode_and_the_pool_elsewhere(tmp_path: Path) -> None:
    pytest.importorskip("pettingzoo")
    config = self_play_config(tmp_path, "ttt", env=TICTACTOE, total_steps=4 * 4 * 12)
    with Runner(config, progress=False) as runner:
        collector = runner.collector
        pool = collector.fixed[OPPONENT].policy
        assert isinstance(pool, SnapshotPool) and pool.learner is runner.algo
        seating = collector.seating
        assert seating.by.seats == ("player_1", "player_2")
        steps = []
        pool_act, actions_of = pool.act, collector.actions

        def pool_acting(batch: Any, **kwargs: Any) -> Any:
            actions, extras = pool_act(batch, **kwargs)
            steps[-1]["pool"] = actions["player"].copy()
            return actions, extras

        def acting(batch: Any, explore: bool) -> Any:
            steps.append({})
            actions, extras = actions_of(batch, explore)
            steps[-1].update(
                episode=seating.episode.copy(),
                learner=seating.owned[MAIN]["player"].copy(),
                actions=actions["player"].copy(),
                acting=batch.acting["player"].copy(),
            )
            return actions, extras

        pool.act, collector.actions = pool_acting, acting
        versions = []
        learn = runner.algo.learn

        def learning(rollouts: Any) -> Any:
            metrics = learn(rollouts)
            versions.append([m["version"] for m in pool.members])  # before this update's
            return metrics

        runner.algo.learn = learning
        results = runner.train()
    training = [s for s in steps if "learner" in s]
    for step in training:  # episode k: the learner in seat k mod 2, the pool in the other
        seat = step["episode"] % 2
        assert (step["learner"] == (np.arange(2) == seat[:, None])).all()
        theirs = ~step["learner"] & step["acting"]
        assert (step["actions"][theirs] == step["pool"][theirs]).all()
    episodes = np.concatenate([s["episode"] for s in training])
    assert len(set(episodes % 2)) == 2 and episodes.max() > 8
    per_env = [{int(k) for k in s} for s in zip(*[s["episode"] for s in training], strict=True)]
    assert all(len(begun) > 1 for begun in per_env)  # every env played several episodes
    # a snapshot joins every snapshot_interval (2) updates, the newest pool_size (3) kept
    assert versions[-1] == [6, 8, 10] and versions[4] == [2, 4]
    assert versions == sorted(versions, key=len)
    rows = [r for r in results.metrics if "selfplay/pool" in r]
    assert rows[-1]["selfplay/pool"] == 3 and "selfplay/return" in rows[-1]
    assert rows[-1]["selfplay/return"] == rows[-1]["train_return"]


def test_evaluations_of_a_self_play_run_play_the_learner_in_every_seat(tmp_path: Path) -> None:
    config = self_play_config(tmp_path, "eval", total_steps=32)
    with Runner(config, progress=False) as runner:
        runner.train()
        pool = runner.collector.fixed[OPPONENT].policy
        called = []
        pool.act = lambda *args, **kwargs: called.append(1)
        result = evaluate_policy(config, runner.learners, 4)
    assert called == [] and {"eval_return", "eval_vs_opponent"} <= set(result.columns())


def test_a_self_play_run_killed_and_resumed_equals_an_uninterrupted_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """rps games last two steps and rollouts four: no episode is in flight at a checkpoint."""
    settings = {"checkpoint_every": 48, "random_opponent_prob": 0.3}
    with Runner(self_play_config(tmp_path, "whole", **settings), progress=False) as runner:
        whole = runner.train()
        members = [m["version"] for m in runner.collector.fixed[OPPONENT].policy.members]
    with monkeypatch.context() as patch:
        kill_after_checkpoint(patch, 96)
        with (
            pytest.raises(Killed),
            Runner(self_play_config(tmp_path, "killed", **settings), progress=False) as runner,
        ):
            runner.train()
    saved = ckpt.load(tmp_path / "killed" / LATEST)
    episodes = saved["seating"]["episode"]  # each env's, from its index
    assert saved["env_steps"] == 96 and all(k > e for e, k in enumerate(episodes))
    state = saved["players"][OPPONENT]
    assert [m["version"] for m in state["members"]] == [2, 4, 6] and state["clock"] == 6
    with Runner.resume(tmp_path / "killed", progress=False) as runner:
        pool = runner.collector.fixed[OPPONENT].policy
        assert [m["version"] for m in pool.members] == [2, 4, 6]
        assert pool.rng.bit_generator.state == state["rng"]
        resumed = runner.train()
        assert [m["version"] for m in pool.members] == members
    assert without_time(resumed.metrics) == without_time(whole.metrics)


def test_a_checkpoint_without_the_pool_is_refused_naming_it(tmp_path: Path) -> None:
    from corral.errors import CheckpointError

    with Runner(self_play_config(tmp_path, "r", total_steps=32), progress=False) as runner:
        runner.train()
    saved = ckpt.load(tmp_path / "r" / LATEST)
    del saved["players"]
    ckpt.save(tmp_path / "r" / LATEST, saved)
    with pytest.raises(CheckpointError, match="lacks the entry 'players'"):
        Runner.resume(tmp_path / "r", progress=False, total_steps=64)


def test_the_seat_swap_sends_one_seat_per_episode_to_the_learner() -> None:
    swap = SeatSwap(["a", "b", "c"])
    assert [[swap(agent, k) for agent in "abc"] for k in range(4)] == [
        [MAIN, OPPONENT, OPPONENT],
        [OPPONENT, MAIN, OPPONENT],
        [OPPONENT, OPPONENT, MAIN],
        [MAIN, OPPONENT, OPPONENT],
    ]
    with pytest.raises(ValueError, match="at least two seats"):
        SeatSwap(["a"])


def test_an_env_restarted_mid_game_starts_a_new_seating(
    tmp_path: Path, isolated_registry: None
) -> None:
    """A game cut by its env's restart ends there: the restarted env's next game is a new
    episode of the seating (the learner moves seat), and the learner's seat holds within
    every game, as without faults."""
    pytest.importorskip("pettingzoo")
    import corral

    steps_taken = [0]

    def flaky_tictactoe() -> Any:
        env = corral.make(TICTACTOE)
        step = env.step

        def flaky_step(actions: dict) -> Any:
            steps_taken[0] += 1
            if steps_taken[0] % 23 == 0:
                raise RuntimeError("the simulator lost its connection")
            return step(actions)

        env.step = flaky_step
        return env

    corral.register("test/flaky_tictactoe", flaky_tictactoe)
    config = self_play_config(
        tmp_path, "flaky", env="test/flaky_tictactoe", total_steps=4 * 4 * 12,
        on_env_error="restart",
    )  # fmt: skip
    with (
        pytest.warns(UserWarning, match="lost its connection"),
        Runner(config, progress=False) as runner,
    ):
        collector, seating = runner.collector, runner.collector.seating
        steps, actions_of = [], collector.actions

        def acting(batch: Any, explore: bool) -> Any:
            actions, extras = actions_of(batch, explore)
            steps.append(
                {
                    "episode": seating.episode.copy(),
                    "learner": seating.owned[MAIN]["player"].copy(),
                    "cut": batch.done & batch.episode_cut,
                    "decision": batch.decision["player"].copy(),
                }
            )
            return actions, extras

        collector.actions = acting
        results = runner.train()
    restarts = sum(r.get("env_restarts", 0) for r in results.metrics)
    assert restarts >= 4
    cut = 0
    for before, after in itertools.pairwise(steps):
        seat = after["episode"] % 2  # the learner in seat k mod 2 of episode k, cut or not
        assert (after["learner"] == (np.arange(2) == seat[:, None])).all()
        restarted = after["cut"]
        assert (after["episode"][restarted] == before["episode"][restarted] + 1).all()
        assert (after["decision"][restarted] == 0).all()  # a new game, from its first move
        cut += int(restarted.sum())
    assert restarts - 1 <= cut <= restarts  # the last step's restart has no next acting


def test_selecting_by_one_seat_needs_a_game_in_every_seat_per_evaluation(tmp_path: Path) -> None:
    from corral.training import ConfigError

    seat = {"select_by": "eval_vs_opponent/player_1", "self_play": True, "device": "cpu"}
    one_game = {**seat, "eval_episodes": 1, "run_dir": str(tmp_path / "one")}
    with pytest.raises(ConfigError, match=r"eval_episodes \(or --episodes\) must be at least 2"):
        Runner(load_config("dqn", "corral/rps", one_game), progress=False)
    assert not (tmp_path / "one").exists()
    two = {**seat, "eval_episodes": 2, "total_steps": 64, "learning_starts": 16}
    config = load_config("dqn", "corral/rps", {**two, "run_dir": str(tmp_path / "two")})
    with Runner(config, progress=False) as runner:
        runner.train()
        assert evaluate_policy(config, runner.learners[MAIN], 2).columns()  # both seats play
        with pytest.raises(ConfigError, match="must be at least 2, got 1"):
            evaluate_policy(config, runner.learners[MAIN], 1)
