"""The policy map: several learners, fixed and scripted policies in one run (``policies``)."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("yaml")

import yaml

import corral
from corral import cli
from corral.algos.dqn import DQN
from corral.algos.mappo import IPPO, MAPPO
from corral.algos.policy import Policy
from corral.errors import ConfigError
from corral.training import checkpoint as ckpt
from corral.training import load_config, load_run
from corral.training.collector import Collector
from corral.training.config import replace_run
from corral.training.metrics import read_metrics
from corral.training.policy_map import (
    MAIN,
    FixedPlayer,
    Seating,
    parse_policies,
    policy_map,
)
from corral.training.runner import LATEST, build_players, evaluate_policy

TAG = "mpe2/simple_tag_v3"
GROUPS = {"adversary": ("adversary_0", "adversary_1", "adversary_2"), "agent": ("agent_0",)}
QUICK = {
    "num_envs": 4,
    "rollout_steps": 16,
    "epochs": 1,
    "eval_every": 128,
    "eval_episodes": 2,
    "log_every": 64,
    "device": "cpu",
    "tensorboard": False,
    "env_kwargs": {"max_cycles": 16},
}


class Still(Policy):
    """A scripted policy: every agent of its groups plays ``action``."""

    def __init__(self, action: int = 0, groups: tuple[str, ...] = ("agent",)) -> None:
        super().__init__({g: () for g in groups})
        self.action = action
        self.calls = 0

    def act(self, batch: Any, *, explore: bool = True, decisions: Any = None) -> Any:
        self.calls += 1
        return {g: np.full(batch.acting[g].shape, self.action) for g in self.groups}, {}


def first_legal(obs: np.ndarray, mask: Any, rng: np.random.Generator) -> np.ndarray:
    """A :data:`FixedPolicy`: each agent's first legal action."""
    return np.asarray(mask).argmax(-1)


def still(obs: np.ndarray, mask: Any, rng: np.random.Generator) -> np.ndarray:
    """A :data:`FixedPolicy`: action 0 for every agent of the group."""
    return np.zeros(obs.shape[:2], dtype=np.int64)


def test_policies_parse_from_text() -> None:
    text = "adversary=mappo, agent=fixed:random,agent_0=fixed:tests.x:y"
    assert parse_policies(text) == {
        "adversary": "mappo",
        "agent": "fixed:random",
        "agent_0": "fixed:tests.x:y",
    }
    for bad, said in (
        ("adversary", "'adversary' is not KEY=VALUE"),
        ("adversary=", "'adversary=' is not KEY=VALUE"),
        ("=mappo", "'=mappo' is not KEY=VALUE"),
        ("a=mappo,a=ippo", "'a' is given twice"),
    ):
        with pytest.raises(ConfigError, match=said):
            parse_policies(bad)


def test_an_agent_s_own_key_wins_over_its_group_s_and_the_rest_is_main() -> None:
    pmap = policy_map(GROUPS, ["adversary", "adversary_1"])
    assert pmap.agents == {
        "adversary_0": "adversary",
        "adversary_1": "adversary_1",
        "adversary_2": "adversary",
        "agent_0": MAIN,
    }
    assert pmap.slots("adversary") == {"adversary": pytest.approx(np.array([1, 0, 1], bool))}
    assert not pmap.whole_groups("adversary") and pmap.whole_groups(MAIN)
    with pytest.raises(ConfigError, match="'prey' is neither a group nor an agent of this env"):
        policy_map(GROUPS, ["prey"])
    with pytest.raises(ConfigError, match="'main' is the policy id"):
        policy_map(GROUPS, ["main"])


def _venv(num_envs: int = 3) -> Any:
    return corral.make_vec(TAG, num_envs, seed=0, env_kwargs={"max_cycles": 8})


def _recording(venv: Any) -> list[dict[str, np.ndarray]]:
    """Record the actions ``venv.step`` receives."""
    seen: list[dict[str, np.ndarray]] = []
    step = venv.step

    def recorded(actions: dict[str, Any]) -> Any:
        seen.append({g: np.array(a, copy=True) for g, a in actions.items()})
        return step(actions)

    venv.step = recorded
    return seen


def test_a_scripted_policy_plays_its_group_beside_a_learner() -> None:
    venv = _venv()
    try:
        learner = MAPPO(venv, MAPPO.Config(rollout_steps=4), learn_groups=["adversary"])
        scripted = Still(action=3)
        slots = {"agent": np.ones(1, dtype=bool)}
        collector = Collector(venv, {MAIN: learner}, {"agent": FixedPlayer(scripted, slots)})
        seen = _recording(venv)
        collector.run(6 * venv.num_envs, learn=False)
    finally:
        venv.close()
    assert scripted.calls == 6
    assert all((step["agent"] == 3).all() for step in seen)
    # the learner's own actions reach its group: not all the scripted one
    assert any((step["adversary"] != 3).any() for step in seen)


def test_fixed_policies_of_single_agents_share_a_group() -> None:
    venv = _venv()
    try:
        players = {
            f"adversary_{j}": FixedPlayer(Still(j, ("adversary",)), {"adversary": np.eye(3)[j]})
            for j in range(3)
        }
        players["agent"] = FixedPlayer(still, {"agent": np.ones(1, dtype=bool)})
        seen = _recording(venv)
        Collector(venv, {}, players).run(4 * venv.num_envs, learn=False)
    finally:
        venv.close()
    for step in seen:
        assert (step["adversary"] == np.arange(3)).all()
        assert (step["agent"] == 0).all()


def test_an_agent_played_twice_or_by_nobody_is_refused() -> None:
    venv = _venv()
    try:
        learner = MAPPO(venv, MAPPO.Config(), learn_groups=["adversary"])
        with pytest.raises(ValueError, match=r"agents \['agent_0'\] have neither"):
            Collector(venv, {MAIN: learner})
        slots = {"adversary": np.ones(3, dtype=bool)}
        twice = {"adversary": FixedPlayer(still, slots), "agent": still}
        with pytest.raises(ValueError, match="'adversary_0' is played by both"):
            Collector(venv, {}, {**twice, "again": FixedPlayer(still, slots)})
        # a learner's agents played by a fixed policy instead: to evaluate, never to learn
        collector = Collector(venv, {MAIN: learner}, twice)
        collector.run(venv.num_envs, learn=False)
        with pytest.raises(ValueError, match=r"agents \['adversary_0 \(main and adversary\)'"):
            collector.run(venv.num_envs)
    finally:
        venv.close()


def _train(tmp_path: Path, name: str, **overrides: Any) -> Any:
    settings = {**QUICK, "run_dir": str(tmp_path / name), **overrides}
    return corral.train("mappo", env=TAG, progress=False, **settings)


def test_two_learners_of_two_algorithms_train_checkpoint_resume_and_evaluate(
    tmp_path: Path,
) -> None:
    policies = {"adversary": "mappo", "agent": "ippo"}
    results = _train(tmp_path, "two", total_steps=256, policies=policies)
    rows = read_metrics(results.run_dir / "metrics.csv")
    learned = [r for r in rows if "adversary/policy_loss" in r]
    assert learned and all("agent/policy_loss" in r for r in learned)
    saved = ckpt.load(results.run_dir / LATEST)
    assert sorted(saved["learners"]) == ["adversary", "agent"]
    written = yaml.safe_load((results.run_dir / "config.yaml").read_text())
    assert written["run"]["policies"] == policies

    config, learners, _ = load_run(results.run_dir, "latest")
    assert isinstance(learners, dict) and sorted(learners) == ["adversary", "agent"]
    assert type(learners["adversary"]) is MAPPO and type(learners["agent"]) is IPPO
    assert list(learners["adversary"].groups) == ["adversary"]
    assert learners["agent"].updates == learners["adversary"].updates == 4

    resumed = corral.train("mappo", resume=results.run_dir, progress=False, total_steps=320)
    assert resumed.env_steps == 320
    config, learners, _ = load_run(results.run_dir, "latest")
    assert learners["agent"].updates == 5
    assert "eval_return/agent" in evaluate_policy(config, learners, 2).columns()


def test_a_fixed_random_group_plays_as_learn_groups_with_opponent_random(tmp_path: Path) -> None:
    """``policies={"agent": "fixed:random"}`` is today's ``learn_groups=["adversary"]``."""
    mapped = _train(tmp_path, "mapped", total_steps=192, policies={"agent": "fixed:random"})
    learned = _train(tmp_path, "learned", total_steps=192, learn_groups=["adversary"])

    def learning(rows: list[dict[str, float]]) -> list[dict[str, float]]:
        return [{k: v for k, v in r.items() if k not in ("wall_time", "steps_per_s")} for r in rows]

    assert learning(mapped.metrics) == learning(learned.metrics)
    assert "agent/policy_loss" not in mapped.metrics[-1]


def test_a_user_s_policy_object_plays_in_corral_train(tmp_path: Path) -> None:
    scripted = Still(action=0)
    results = _train(tmp_path, "object", total_steps=64, policies={"agent": scripted})
    assert scripted.calls > 64 // QUICK["num_envs"]  # training and evaluations
    written = yaml.safe_load((results.run_dir / "config.yaml").read_text())
    assert written["run"]["policies"] == {"agent": "object:Still"}
    with pytest.raises(ConfigError, match=r"'agent' was played by a Python object \(Still\)"):
        load_run(results.run_dir)


def _cli(capsys: pytest.CaptureFixture[str], tmp_path: Path, policies: str, *extra: str) -> Any:
    code = cli.main(
        [
            "train",
            "mappo",
            "--env",
            TAG,
            "--policies",
            policies,
            "--total-steps",
            "64",
            "--run-dir",
            str(tmp_path / "cli"),
            "--no-progress",
            "--set",
            "num_envs=4",
            "rollout_steps=16",
            "eval_every=64",
            "eval_episodes=1",
            "env_kwargs.max_cycles=16",
            "device=cpu",
            *extra,
        ]
    )
    return code, capsys.readouterr()


@pytest.mark.parametrize(
    ("policies", "said"),
    [
        ("adversary=mapo,agent=ippo", "policies: adversary=mapo: unknown algorithm 'mapo'"),
        ("prey=mappo", "policies: 'prey' is neither a group nor an agent of this env"),
        ("agent=fixed:randm", "policies: agent=fixed:randm: a fixed policy is fixed:random"),
        ("adversary_0=ippo", "policies: 'adversary_0' would learn part of the group 'adversary'"),
        ("agent", "policies: 'agent' is not KEY=VALUE"),
        ("adversary=fixed:random,agent=fixed:random", "policies: no policy learns"),
    ],
)
def test_a_bad_policies_string_is_one_line_naming_it(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, policies: str, said: str
) -> None:
    code, (_out, err) = _cli(capsys, tmp_path, policies)
    assert code == 2
    assert err.startswith(f"corral: error: {said}") and err.count("\n") == 1, err
    assert not (tmp_path / "cli").exists()


def test_a_fixed_module_attr_policy_from_the_command_line(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    code, (_out, err) = _cli(capsys, tmp_path, f"agent=fixed:{__name__}:still")
    assert code == 0, err
    # eval reads the run's config.yaml: the policy's module is imported only when allowed
    code = cli.main(["eval", str(tmp_path / "cli"), "--episodes", "1"])
    assert code == 2 and f"--allow-import fixed:{__name__}:still" in capsys.readouterr().err
    allowed = ["--allow-import", f"fixed:{__name__}:still"]
    assert cli.main(["eval", str(tmp_path / "cli"), "--episodes", "1", *allowed]) == 0


@pytest.mark.parametrize(
    ("setting", "said"),
    [
        ({"policies": {"player_1": "fixed:random"}}, "policies {'player_1': 'fixed:random'}"),
        ({"learn_groups": ["player_1"]}, "learn_groups ['player_1']"),  # named as given
    ],
)
def test_self_play_takes_no_policies(tmp_path: Path, setting: dict, said: str) -> None:
    config = load_config(
        "dqn",
        "pettingzoo/classic/tictactoe_v3",
        {"self_play": True, "group_map": "agent", **setting},
    )
    venv = corral.make_vec(config.run.env, 2, group_map="agent")
    try:
        with pytest.raises(ConfigError, match=r"self_play .* takes no policies") as info:
            build_players(config, venv)
    finally:
        venv.close()
    assert f"(got {said})" in str(info.value)


def test_eval_plays_a_group_by_another_run_s_policy(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """``corral eval RUN --policies "agent=OTHER:agent"``: cross-play. Played by its own run's
    policy the group scores as in a plain evaluation; by another run's, otherwise."""
    one = _train(tmp_path, "one", total_steps=256).run_dir
    two = _train(tmp_path, "two", total_steps=256, seed=1, policies={"agent": "ippo"}).run_dir

    def evaluated(*extra: str) -> str:
        code = cli.main(["eval", str(one), "--episodes", "3", "--seed", "5", *extra])
        out, err = capsys.readouterr()
        assert code == 0, err
        # each group's and agent's mean return (eval_return is the learned agents' alone)
        return out.splitlines()[1].partition("by group and agent:")[2]

    plain = evaluated()
    assert evaluated("--policies", f"agent={one}:agent") == plain
    assert evaluated("--policies", f"agent={two}:agent") != plain
    code = cli.main(["eval", str(one), "--policies", f"agent={two}:prey"])
    err = capsys.readouterr().err
    assert code == 2 and f"the run {two} has no policy or group 'prey'" in err, err
    code = cli.main(["eval", str(one), "--policies", f"agent={two}:main"])
    err = capsys.readouterr().err
    assert code == 2 and "that policy plays {'adversary': " in err, err
    # what eval cannot play is refused, not evaluated as the run's own learner
    for value, said in [
        (f"{two}x:agent", f"{two}x is not a run directory (it holds no config.yaml)"),
        ("ippo", "corral eval plays the run's own learners; it gives agents to fixed:random"),
        ("two:agent", "'two:agent' is none of these"),
    ]:
        code = cli.main(["eval", str(one), "--policies", f"agent={value}"])
        out, err = capsys.readouterr()
        assert code == 2 and out == "" and err.count("\n") == 1 and said in err, err


def test_eval_return_counts_the_learned_agents_that_no_fixed_policy_took(tmp_path: Path) -> None:
    run_dir = _train(tmp_path, "one", total_steps=256).run_dir
    config, algo, _ = load_run(run_dir)
    taken = {**config.run.policies, "adversary_0": "fixed:random"}
    config.run = replace_run(config.run, policies=taken)
    row = evaluate_policy(config, algo, 6, seed=5).columns()
    left = [row[f"eval_return/{a}"] for a in ("adversary_1", "adversary_2", "agent_0")]
    assert row["eval_return"] == pytest.approx(np.mean(left), rel=1e-9)
    assert row["eval_return"] != pytest.approx(
        np.mean([*left, row["eval_return/adversary_0"]]), rel=1e-9
    )


TICTACTOE = "pettingzoo/classic/tictactoe_v3"


def seats(agent: str, episode: int) -> str:
    """Tic-tac-toe's learner moves first in even episodes, second in odd ones."""
    return "learner" if agent == f"player_{episode % 2 + 1}" else "opponent"


def test_a_policy_map_function_swaps_the_learner_s_seat_every_episode() -> None:
    venv = corral.make_vec(TICTACTOE, 4, seed=0)
    try:
        config = load_config("dqn", TICTACTOE, {"train_freq": 32, "learning_starts": 10_000})
        learner = DQN(venv, config.algo_config)
        seating = Seating(venv.groups, seats, ["learner", "opponent"], venv.num_envs)
        opponent = FixedPlayer(first_legal, {"player": np.ones(2, dtype=bool)})
        collector = Collector(venv, {"learner": learner}, {"opponent": opponent}, seating=seating)
        seen: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
        act = learner.policy.act

        def watched(batch: Any, **kwargs: Any) -> Any:
            mask = batch.action_mask["player"].copy()
            seen.append((seating.episode.copy(), batch.acting["player"].copy(), mask))
            return act(batch, **kwargs)

        learner.policy.act = watched  # type: ignore[method-assign]
        rollouts = []
        learn = learner.learn
        learner.learn = lambda r: rollouts.append(r) or learn(r)  # type: ignore[method-assign]
        recorded = _recording(venv)
        collector.run(40 * venv.num_envs)
    finally:
        venv.close()
    episodes = np.stack([episode for episode, _, _ in seen])
    # each env numbers its episodes from its index, one more at each episode it begins
    assert (episodes[0] == np.arange(4)).all() and (episodes[-1] >= np.arange(4) + 3).all()
    steps = np.diff(episodes, axis=0)
    assert set(np.unique(steps)) == {0, 1}
    # per step the opponent (its first legal action) plays the seat the learner does not,
    # `1 - episode % 2`: checked on what the envs received
    for (episode, acting, mask), actions in zip(seen, recorded, strict=True):
        envs, seat = np.arange(4), 1 - episode % 2
        moved = acting[envs, seat]
        expected = mask[envs, seat].argmax(-1)
        np.testing.assert_array_equal(actions["player"][envs, seat][moved], expected[moved])
    # the learner learns from its own seat's decisions only
    mine = np.concatenate([r["player"].extras["learner"] for r in rollouts])
    seat = np.concatenate([episodes[i : i + 8] for i in range(0, 8 * len(rollouts), 8)]) % 2
    assert (mine == (seat[..., None] == np.arange(2))).all()


def test_corral_train_with_a_policy_map_function(tmp_path: Path) -> None:
    """``policy_map`` as ``module:attr`` from the command line, or a function in Python."""
    common = {
        "total_steps": 256,
        "num_envs": 4,
        "train_freq": 32,
        "learning_starts": 64,
        "eval_every": 128,
        "eval_episodes": 2,
        "device": "cpu",
        "tensorboard": False,
        "progress": False,
    }
    policies = {"learner": "dqn", "opponent": "fixed:random"}
    run = corral.train(
        "dqn", env=TICTACTOE, policies=policies, policy_map=seats, run_dir=str(tmp_path / "fn"),
        **common,
    )  # fmt: skip
    assert run.env_steps == 256 and "learner/loss/player" in run.metrics[-1]
    written = yaml.safe_load((run.run_dir / "config.yaml").read_text())
    assert written["run"]["policy_map"] == "object:seats"
    named = corral.train(
        "dqn", env=TICTACTOE, policies=policies, policy_map=f"{__name__}:seats",
        run_dir=str(tmp_path / "named"), **common,
    )  # fmt: skip
    assert [r["eval_return"] for r in named.metrics if "eval_return" in r] == [
        r["eval_return"] for r in run.metrics if "eval_return" in r
    ]
    with pytest.raises(ConfigError, match="learns whole groups at every step"):
        corral.train(
            "dqn", env=TICTACTOE, policy_map=seats, run_dir=str(tmp_path / "bad"),
            policies={"learner": "maddpg", "opponent": "fixed:random"}, **common,
        )  # fmt: skip


@pytest.mark.slow
@pytest.mark.skipif(os.environ.get("CI") == "true", reason="slow learning run")
def test_two_learners_both_improve_against_a_random_other_group(tmp_path: Path) -> None:
    """Trained together (adversary MAPPO, agent IPPO), each group beats its untrained self
    when played against a uniformly random other group."""
    results = _train(
        tmp_path,
        "learn",
        total_steps=60_000,
        num_envs=16,
        rollout_steps=128,
        epochs=5,
        eval_every=60_000,
        log_every=10_000,
        env_kwargs={"max_cycles": 25},
        policies={"adversary": "mappo", "agent": "ippo"},
    )
    _config, trained, _ = load_run(results.run_dir)
    untrained_venv = corral.make_vec(TAG, 2, seed=0)
    scores = {}
    for group, other in (("adversary", "agent"), ("agent", "adversary")):
        versus = load_config(
            "mappo", TAG, {"policies": {group: trained[group].name, other: "fixed:random"}}
        )
        fresh = type(trained[group])(untrained_venv, learn_groups=[group])
        for name, learner in (("trained", trained[group]), ("untrained", fresh)):
            result = evaluate_policy(versus, {group: learner}, 40, seed=7)
            scores[group, name] = result.columns()[f"eval_return/{group}"]
    untrained_venv.close()
    assert scores["adversary", "trained"] > scores["adversary", "untrained"] + 2.0, scores
    assert scores["agent", "trained"] > scores["agent", "untrained"] + 2.0, scores


def test_a_resumed_run_says_where_another_run_s_policy_changed_meanwhile(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The agent is played by another run's best.pt; resumed after that run's best.pt is
    gone (as when it is replaced), the run plays its checkpoint.pt, and says so."""
    other = _train(tmp_path, "other", total_steps=256).run_dir
    played = f"{other}:agent"
    main = _train(tmp_path, "main", total_steps=128, policies={"agent": played}).run_dir
    best = ckpt.load(other / "best.pt")["env_steps"]
    assert ckpt.load(main / LATEST)["other_runs"] == {"agent": f"best.pt of {best} env steps"}
    with caplog.at_level("WARNING", logger="corral"):
        corral.train("mappo", progress=False, resume=main, total_steps=192)
    assert "another checkpoint meanwhile" not in caplog.text  # the same best.pt
    (other / "best.pt").unlink()
    with caplog.at_level("WARNING", logger="corral"):
        corral.train("mappo", progress=False, resume=main, total_steps=256)
    said = (
        f"policies: agent={played}: that run saved another checkpoint meanwhile: this run "
        f"played its best.pt of {best} env steps, and plays its checkpoint.pt of 256 env steps"
    )
    assert said in caplog.text


def test_another_run_s_policy_from_other_env_kwargs_is_refused_naming_the_spaces(
    tmp_path: Path,
) -> None:
    """A policy trained with other env_kwargs (corral/memory with 3 cues, not 2) has other
    spaces: refused with one error, as a cross-play partner and as the eval opponent."""
    common: dict[str, Any] = {
        "num_envs": 2,
        "total_steps": 64,
        "eval_every": 0,
        "eval_episodes": 2,
        "learning_starts": 16,
        "progress": False,
        "tensorboard": False,
        "device": "cpu",
    }
    runs = {}
    for cues in (2, 3):
        kwargs = {"num_cues": cues}
        run_dir = str(tmp_path / f"cues{cues}")
        runs[cues] = corral.train(
            "dqn", env="corral/memory", env_kwargs=kwargs, run_dir=run_dir, **common
        ).run_dir
    config, algo, _ = load_run(runs[2])
    said = "group 'agent' has the observation space Box(0.0, 1.0, (4,), float32)"
    with pytest.raises(ConfigError, match=re.escape(said)):
        evaluate_policy(config, algo, 2, opponent=str(runs[3]))
    config.run = replace_run(config.run, policies={"agent": f"{runs[3]}:agent"})
    with pytest.raises(ConfigError, match=re.escape(said)):
        evaluate_policy(config, algo, 2)


def test_two_learners_of_a_zero_sum_game_train_selecting_on_one_learner_s_column(
    tmp_path: Path,
) -> None:
    """Every evaluation of a two-player zero-sum game played the reference opponent, which
    plays one learner: two learners playing each other (MAPPO against IPPO) were refused even
    with select_by on a return column. auto has no column that suits both: refused, naming
    the columns that do."""
    settings = {
        "group_map": "agent", "policies": {"player_1": "ippo"}, "total_steps": 128,
        "num_envs": 4, "eval_every": 64, "eval_episodes": 4, "rollout_steps": 16,
        "device": "cpu", "tensorboard": False, "progress": False,
    }  # fmt: skip
    run = corral.train(
        "mappo", env="corral/rps", run_dir=str(tmp_path / "r"), select_by="eval_return/player_0",
        **settings,
    )  # fmt: skip
    rows = read_metrics(tmp_path / "r")
    assert run.env_steps == 128 and "eval_return/player_0" in rows[-1]
    assert not any(k.startswith("eval_vs_opponent") for r in rows for k in r)
    with pytest.raises(ConfigError, match=r"select_by=auto in a two-player zero-sum game of 2"):
        corral.train("mappo", env="corral/rps", run_dir=str(tmp_path / "auto"), **settings)
    assert not (tmp_path / "auto").exists()
