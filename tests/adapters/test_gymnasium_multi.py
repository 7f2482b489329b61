"""Gymnasium envs of several agents (EPyMARL's LBF and RWARE): one agent per Tuple entry,
step for step the raw env's results, time limits as truncations, the vector backends,
refusals of other Tuple envs."""

from __future__ import annotations

import importlib.util
import pickle
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

import gymnasium
import numpy as np
import pytest
from gymnasium import spaces
from gymnasium.wrappers import OrderEnforcing

import corral
from corral.adapters import grid_frames
from corral.adapters.gymnasium_multi import MultiAgentGymnasiumAdapter
from corral.errors import MissingDependencyError, UnsupportedEnvError

PACKAGES = {"lbf": "lbforaging", "rware": "rware"}

# Gymnasium's passive checker, on a user's gymnasium.make(...), expects one float reward.
LIST_REWARD_WARNING = "ignore:.*The reward returned by `step\\(\\)` must be a float"


def raw_env(source: str, name: str, **kwargs: Any) -> gymnasium.Env:
    """The env as EPyMARL's users build it (the checker off: it expects one agent)."""
    pytest.importorskip(PACKAGES[source])
    return gymnasium.make(name, disable_env_checker=True, **kwargs)


def lbf_out_of_time(raw: gymnasium.Env) -> bool:
    """Whether LBF, done, stopped at its step limit: food is left (read from its state)."""
    lbf = raw.unwrapped
    food_left = int(lbf.field.sum())
    assert food_left == 0 or lbf.current_step == lbf._max_episode_steps
    return food_left > 0


def rware_out_of_time(raw: gymnasium.Env) -> bool:
    """RWARE, done, stopped at its step limit (its only end in these cases)."""
    warehouse = raw.unwrapped
    assert warehouse._cur_steps == warehouse.max_steps
    return True


# Whether the raw env's done was a time limit, by source.
OUT_OF_TIME = {"lbf": lbf_out_of_time, "rware": rware_out_of_time}

# (source, Gymnasium id, keyword arguments, whether random play earns rewards in 600 steps,
# the ends seen)
CASES = [
    ("lbf", "Foraging-8x8-2p-3f-v3", {}, True, {"terminated", "truncated"}),
    # small field: loads are frequent and eating all food ends episodes before the limit
    ("lbf", "Foraging-5x5-3p-1f-v3", {}, True, {"terminated", "truncated"}),
    # Gymnasium's TimeLimit truncates before LBF's own limit of 50 steps
    ("lbf", "Foraging-8x8-2p-2f-coop-v3", {"max_episode_steps": 20}, False, {"truncated"}),
    ("rware", "rware-tiny-2ag-v2", {"max_steps": 60}, False, {"truncated"}),
    # a tiny warehouse where random robots deliver (rewards to either agent)
    (
        "rware",
        "rware-tiny-2ag-v2",
        {"layout": "xx\ngg", "request_queue_size": 1, "max_steps": 50},
        True,
        {"truncated"},
    ),
]


@pytest.mark.parametrize(("source", "name", "kwargs", "rewarded", "ends"), CASES)
def test_matches_the_raw_env_step_for_step(
    source: str, name: str, kwargs: dict[str, Any], rewarded: bool, ends: set[str]
) -> None:
    raw = raw_env(source, name, **kwargs)
    env = corral.make(f"{source}/{name}", **kwargs)
    n = len(raw.action_space)
    agents = [f"agent_{i}" for i in range(n)]
    assert env.possible_agents == agents
    for i, agent in enumerate(agents):
        assert env.observation_space(agent) == raw.observation_space[i]
        assert env.action_space(agent) == raw.action_space[i]
    rng = np.random.default_rng(7)
    episodes, rewards_seen, ends_seen = 0, 0, set()
    obs, infos = env.reset(seed=100)
    raw_obs, raw_info = raw.reset(seed=100)
    for _ in range(600):
        for i, agent in enumerate(agents):
            np.testing.assert_array_equal(obs[agent], raw_obs[i])
            assert infos[agent] == raw_info
        action = rng.integers(0, raw.action_space[0].n, size=n)
        obs, rewards, terms, truncs, infos = env.step(dict(zip(agents, action, strict=True)))
        raw_obs, raw_rewards, raw_term, raw_trunc, raw_info = raw.step(tuple(action))
        assert rewards == {agent: float(raw_rewards[i]) for i, agent in enumerate(agents)}
        # the env's done at its own step limit is a truncation
        out_of_time = raw_term and OUT_OF_TIME[source](raw)
        assert terms == dict.fromkeys(agents, raw_term and not out_of_time)
        assert truncs == dict.fromkeys(agents, raw_trunc or out_of_time)
        rewards_seen += any(raw_rewards)
        if raw_term or raw_trunc:
            assert obs == {} and env.agents == []
            for i, agent in enumerate(agents):
                np.testing.assert_array_equal(infos[agent].pop("final_obs"), raw_obs[i])
                assert infos[agent] == raw_info
            ends_seen.add("truncated" if truncs["agent_0"] else "terminated")
            episodes += 1
            obs, infos = env.reset(seed=100 + episodes)
            raw_obs, raw_info = raw.reset(seed=100 + episodes)
        else:
            assert env.agents == agents
    assert episodes >= 3 and ends_seen == ends
    if rewarded:
        assert rewards_seen  # rewards other than 0 were compared
    if "max_episode_steps" in kwargs:
        assert env.max_episode_steps == kwargs["max_episode_steps"]


@pytest.mark.filterwarnings(LIST_REWARD_WARNING)
@pytest.mark.parametrize(
    ("package", "name"), [("lbforaging", "Foraging-8x8-2p-3f-v3"), ("rware", "rware-tiny-2ag-v2")]
)
def test_adapt_plays_the_gymnasium_env_as_its_agents(package: str, name: str) -> None:
    pytest.importorskip(package)
    env = corral.adapt(gymnasium.make(name))  # the user's env, Gymnasium's checker on
    assert env.possible_agents == ["agent_0", "agent_1"] and env.simultaneous
    obs, _ = env.reset(seed=0)
    for i, agent in enumerate(env.possible_agents):
        env.action_space(agent).seed(i)
    steps = 0
    while env.agents:
        assert sorted(obs) == env.agents == env.possible_agents
        obs, rewards, terms, truncs, _ = env.step({a: env.action_space(a).sample() for a in obs})
        steps += 1
        assert all(type(r) is float for r in rewards.values())
    assert steps == {"lbforaging": 50, "rware": 500}[package]  # each env's own step limit
    assert all(truncs.values()) and not any(terms.values())  # a time limit, not an end
    assert env.n_agents == 2  # the source env's attributes pass through
    env.close()


@pytest.mark.parametrize(
    "env_id",
    ["lbf/Foraging-8x8-2p-3f-v3", "lbf/Foraging-2s-8x8-3p-2f-coop-v3", "rware/rware-tiny-4ag-v2"],
)
def test_passes_the_checker(env_id: str) -> None:
    pytest.importorskip(PACKAGES[env_id.split("/")[0]])
    report = corral.check_env(env_id, raise_on_error=False)
    assert report.ok and report.complete, str(report)


@pytest.mark.filterwarnings(LIST_REWARD_WARNING)
def test_the_checker_passes_an_adapted_env_and_an_unlisted_id() -> None:
    pytest.importorskip("lbforaging")
    assert corral.check_env(corral.adapt(gymnasium.make("Foraging-6x6-4p-2f-v3"))).ok
    assert "lbf/Foraging-6x6-4p-2f-v3" not in corral.registered_ids()
    assert corral.check_env("lbf/Foraging-6x6-4p-2f-v3").ok  # built through the namespace


@pytest.mark.parametrize(("source", "name"), [(s, n) for s, n, *_ in CASES[:1] + CASES[3:4]])
def test_vector_backends_step_it_as_the_env_does(source: str, name: str) -> None:
    pytest.importorskip(PACKAGES[source])
    kwargs = {"max_steps": 30} if source == "rware" else {}
    env_id = f"{source}/{name}"
    batches = {}
    for backend in ("sync", "subproc"):
        venv = corral.make_vec(env_id, 2, backend=backend, seed=0, env_kwargs=kwargs)
        rng = np.random.default_rng(1)
        batch = venv.reset()
        seen = [batch]
        for _ in range(60):  # past the end of an episode (50 steps, or 30)
            actions = rng.integers(0, 5, size=(2, 2))
            seen.append(venv.step({"agent": actions}))
        venv.close()
        batches[backend] = seen
    single = corral.make(env_id, **kwargs)
    obs, _ = single.reset(seed=0)
    first = batches["sync"][0].obs["agent"][0]
    np.testing.assert_array_equal(first, np.stack([obs["agent_0"], obs["agent_1"]]))
    assert any(b.done.any() for b in batches["sync"])
    # the subprocess workers' adapters have the time-limit rule (LBF: 50 steps; RWARE: 30)
    assert any(b.truncated["agent"].any() for b in batches["subproc"])
    for sync, subproc in zip(batches["sync"], batches["subproc"], strict=True):
        for field in ("obs", "reward", "terminated", "truncated"):
            np.testing.assert_array_equal(
                getattr(sync, field)["agent"], getattr(subproc, field)["agent"]
            )
        np.testing.assert_array_equal(sync.done, subproc.done)


# -- time limits: the envs' own step limit is a truncation --------------------------------

LBF_SMALL = "Foraging-5x5-2p-1f-v3"
LOAD, NONE = 5, 0  # LBF's actions


def one_food_beside_agent_0(env: gymnasium.Env) -> None:
    """Sets LBF's state: one food of level 1 east of agent_0, which agent_0 can load alone."""
    lbf = env.unwrapped
    lbf.field[:] = 0
    lbf.field[0, 1] = lbf._food_spawned = 1
    for player, position in zip(lbf.players, [(0, 0), (4, 4)], strict=True):
        player.position, player.level = position, 1
    lbf._gen_valid_moves()


@pytest.mark.parametrize(
    ("steps_before", "eat", "kwargs", "ends"),
    [
        (0, True, {}, (True, False)),
        (49, True, {}, (True, False)),  # the last food eaten at the step limit: the task is done
        (49, True, {"max_episode_steps": 50}, (True, True)),  # and Gymnasium's TimeLimit cuts
        (49, False, {}, (False, True)),
        (49, False, {"max_episode_steps": 50}, (False, True)),  # LBF's done and TimeLimit's cut
    ],
    ids=[
        "eaten",
        "eaten-at-the-limit",
        "eaten-at-the-limit-and-TimeLimit",
        "out-of-time",
        "out-of-time-and-TimeLimit",
    ],
)
def test_an_lbf_episode_is_terminated_when_the_food_is_gone_else_truncated(
    steps_before: int, eat: bool, kwargs: dict[str, Any], ends: tuple[bool, bool]
) -> None:
    raw = raw_env("lbf", LBF_SMALL, **kwargs)
    env = corral.make(f"lbf/{LBF_SMALL}", **kwargs)
    agents = env.possible_agents
    env.reset(seed=0)
    raw.reset(seed=0)
    for _ in range(steps_before):  # nobody loads: no food is eaten
        env.step(dict.fromkeys(agents, NONE))
        raw.step((NONE, NONE))
    assert env.agents == agents
    one_food_beside_agent_0(env)
    one_food_beside_agent_0(raw)
    action = (LOAD if eat else NONE, NONE)
    obs, rewards, terms, truncs, infos = env.step(dict(zip(agents, action, strict=True)))
    raw_obs, raw_rewards, raw_term, raw_trunc, _ = raw.step(action)
    assert raw_term and raw_trunc == ("max_episode_steps" in kwargs)  # LBF: done either way
    assert raw.unwrapped.field.any() != eat
    assert (terms, truncs) == tuple(dict.fromkeys(agents, flag) for flag in ends)
    assert obs == {} and env.agents == []
    for i, agent in enumerate(agents):
        np.testing.assert_array_equal(infos[agent]["final_obs"], raw_obs[i])
    assert rewards == {"agent_0": float(eat), "agent_1": 0.0}
    assert rewards == {agent: float(raw_rewards[i]) for i, agent in enumerate(agents)}


@pytest.mark.parametrize(
    "kwargs",
    [{"max_steps": 5}, {"max_steps": None, "max_inactivity_steps": 3}],
    ids=["max_steps", "max_inactivity_steps"],
)
def test_an_rware_episode_ends_truncated(kwargs: dict[str, Any]) -> None:
    raw = raw_env("rware", "rware-tiny-2ag-v2", **kwargs)
    env = corral.make("rware/rware-tiny-2ag-v2", **kwargs)
    agents = env.possible_agents
    env.reset(seed=0)
    raw.reset(seed=0)
    steps = 0
    while env.agents:  # the robots stand still: nothing is delivered
        _, _, terms, truncs, infos = env.step(dict.fromkeys(agents, 0))
        raw_obs, _, raw_term, raw_trunc, _ = raw.step((0, 0))
        steps += 1
    assert steps == (kwargs["max_steps"] or kwargs["max_inactivity_steps"])
    assert raw_term and not raw_trunc  # RWARE calls it done
    assert terms == dict.fromkeys(agents, False) and truncs == dict.fromkeys(agents, True)
    for i, agent in enumerate(agents):
        np.testing.assert_array_equal(infos[agent]["final_obs"], raw_obs[i])
    restored = pickle.loads(pickle.dumps(env))  # the rule is a module-level function
    assert restored.time_limit_reached is env.time_limit_reached is not None
    # RWARE keeps its limit in max_steps (no TimeLimit wrapper): the adapter reads it there
    assert env.max_episode_steps == restored.max_episode_steps == kwargs["max_steps"]


def test_rware_s_step_limit_is_the_adapter_s_and_the_checker_holds_episodes_to_it() -> None:
    pytest.importorskip("rware")
    env = corral.make("rware/rware-tiny-2ag-v2")
    assert env.max_episode_steps == 500 == env.unwrapped.max_steps
    with corral.make_vec("rware/rware-tiny-2ag-v2", 2, env_kwargs={"max_steps": 7}) as venv:
        assert venv.max_episode_steps == 7
    corral.check_env(corral.make("rware/rware-tiny-2ag-v2", max_steps=7), episodes=2)


def test_lbf_s_step_limit_is_the_adapter_s_and_max_episode_steps_sets_it() -> None:
    """LBF keeps its limit (50) in its constructor's ``max_episode_steps``, which
    ``gymnasium.make``'s argument of that name shadows: a longer limit was reported but the
    episode still ended at 50; the adapter reported no limit at all by default."""
    pytest.importorskip("lbforaging")
    name = "lbf/Foraging-8x8-2p-2f-coop-v3"
    assert corral.make(name).max_episode_steps == 50
    for limit in (20, 80):  # shorter and longer than LBF's own
        env = corral.make(name, max_episode_steps=limit)
        assert env.max_episode_steps == limit
        env.reset(seed=0)
        steps = 0
        while env.agents:  # nobody moves or loads: food is left, the episode runs out of time
            _, _, terms, truncs, _ = env.step(dict.fromkeys(env.possible_agents, 0))
            steps += 1
        assert steps == limit and truncs["agent_0"] and not terms["agent_0"]
    corral.check_env(corral.make(name, max_episode_steps=80), episodes=1)


def test_a_time_limit_past_rware_s_own_is_refused_naming_the_setting_that_sets_it() -> None:
    pytest.importorskip("rware")
    with pytest.raises(UnsupportedEnvError, match=r"own limit of 500 steps.*max_steps=800"):
        corral.make("rware/rware-tiny-2ag-v2", max_episode_steps=800)
    assert corral.make("rware/rware-tiny-2ag-v2", max_episode_steps=30).max_episode_steps == 30


def test_adapt_gets_the_rule_before_any_corral_make() -> None:
    pytest.importorskip("lbforaging")
    probe = (
        "import corral, gymnasium, lbforaging\n"
        "env = corral.adapt(gymnasium.make('Foraging-5x5-2p-1f-v3', disable_env_checker=True))\n"
        "env.reset(seed=0)\n"
        "for _ in range(50): *_, terms, truncs, _ = env.step({'agent_0': 0, 'agent_1': 0})\n"
        "print(env.agents, terms, truncs)"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=60
    )
    expected = "[] {'agent_0': False, 'agent_1': False} {'agent_0': True, 'agent_1': True}"
    assert out.stdout.strip() == expected


@pytest.mark.parametrize("out_of_time", [True, False])
def test_a_rule_given_to_the_adapter_says_which_ends_are_time_limits(out_of_time: bool) -> None:
    raw = TupleEnv(dones=[False, True])
    asked = []

    def time_limit_reached(env: gymnasium.Env) -> bool:
        asked.append(env)
        return out_of_time

    env = MultiAgentGymnasiumAdapter(OrderEnforcing(raw), time_limit_reached=time_limit_reached)
    env.reset()
    env.step({"agent_0": 0, "agent_1": 0})
    assert asked == []  # asked only after a step that ends the episode
    obs, _, terms, truncs, infos = env.step({"agent_0": 1, "agent_1": 0})
    assert asked == [raw]  # the unwrapped env
    assert terms == dict.fromkeys(env.possible_agents, not out_of_time)
    assert truncs == dict.fromkeys(env.possible_agents, out_of_time)
    assert obs == {} and infos["agent_0"]["final_obs"] == 2


def test_make_through_the_gym_namespace_picks_the_multi_agent_adapter() -> None:
    pytest.importorskip("lbforaging")
    env = corral.make("gym/lbforaging:Foraging-5x5-2p-1f-v3", disable_env_checker=True)
    assert env.possible_agents == ["agent_0", "agent_1"]
    env.reset(seed=0)
    _, rewards, *_ = env.step({"agent_0": 0, "agent_1": 0})
    assert rewards == {"agent_0": 0.0, "agent_1": 0.0}


def test_missing_package_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    for source, package in PACKAGES.items():
        monkeypatch.setitem(sys.modules, package, None)  # as if not installed
        with pytest.raises(MissingDependencyError, match=rf"pip install 'corral\[{source}\]'"):
            corral.make(f"{source}/anything-v0")


@pytest.mark.parametrize(
    ("env_id", "suggested"),
    [
        ("lbf/Foraging-8x8-2p-3f-v9", "lbf/Foraging-8x8-2p-3f-v3"),
        ("rware/rware-tiny-2ag-v9", "rware/rware-tiny-2ag-v2"),
    ],
)
def test_a_misspelt_id_is_unknown_with_the_closest_ids(env_id: str, suggested: str) -> None:
    pytest.importorskip(PACKAGES[env_id.split("/")[0]])
    with pytest.raises(corral.UnknownEnvError, match=f"Did you mean {suggested}"):
        corral.make(env_id)


# -- envs that declare several agents but break the convention ----------------------------


class TupleEnv(gymnasium.Env):
    """Two agents with Tuple spaces; ``n_agents``, the rewards and the end flags as given."""

    def __init__(
        self,
        n_agents: Any = 2,
        spaces_of: int = 2,
        reward: Any = (1.0, 2.0),
        dones: list[Any] | None = None,
    ) -> None:
        if n_agents is not None:
            self.n_agents = n_agents
        self.observation_space = spaces.Tuple([spaces.Discrete(3)] * spaces_of)
        self.action_space = spaces.Tuple([spaces.Discrete(2)] * spaces_of)
        self.reward = reward
        self.dones = list(dones or [True])

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> Any:
        return (0,) * len(self.action_space), {"seen": True}

    def step(self, action: Any) -> Any:
        observation = tuple(int(a) + 1 for a in action)
        return observation, self.reward, self.dones.pop(0), False, {"step": 1}


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        (TupleEnv(n_agents=None), "has no n_agents"),
        (TupleEnv(n_agents=3), "observation_space has 2 entries for n_agents=3"),
        (TupleEnv(n_agents=1.5), "n_agents is 1.5, not a positive int"),
    ],
    ids=["no-n_agents", "lengths-disagree", "n_agents-not-int"],
)
def test_a_tuple_env_off_the_convention_is_refused(env: gymnasium.Env, expected: str) -> None:
    with pytest.raises(UnsupportedEnvError) as err:
        corral.adapt(env)
    message = str(err.value)
    assert "TupleEnv does not follow the multi-agent Gymnasium convention" in message
    assert expected in message and "GymnasiumEnvAdapter(env)" in message


def test_n_agents_without_tuple_spaces_is_refused() -> None:
    env = gymnasium.make("CartPole-v1").unwrapped
    env.n_agents = 2
    with pytest.raises(UnsupportedEnvError, match=r"'CartPole-v1'.*observation_space is Box"):
        corral.adapt(env)


def test_a_single_agent_tuple_env_can_still_be_wrapped_as_one_agent() -> None:
    from corral.adapters.gymnasium import GymnasiumEnvAdapter

    env = GymnasiumEnvAdapter(TupleEnv(n_agents=None, reward=0.5))
    env.reset(seed=0)
    _, rewards, terms, *_ = env.step({"agent_0": (1, 0)})
    assert rewards == {"agent_0": 0.5} and terms == {"agent_0": True}


def test_rewards_that_are_not_one_per_agent_are_refused() -> None:
    env = corral.adapt(TupleEnv(reward=3.0))
    env.reset()
    with pytest.raises(UnsupportedEnvError, match="step 0: expected rewards for each of its 2"):
        env.step({"agent_0": 0, "agent_1": 1})


def test_a_list_of_dones_ends_the_episode_when_all_are_true() -> None:
    env = corral.adapt(TupleEnv(dones=[[True, False], [True, True]]))
    obs, infos = env.reset(seed=0)
    assert obs == {"agent_0": 0, "agent_1": 0} and infos["agent_1"] == {"seen": True}
    obs, rewards, terms, truncs, infos = env.step({"agent_0": 1, "agent_1": 0})
    assert obs == {"agent_0": 2, "agent_1": 1} and env.agents == ["agent_0", "agent_1"]
    assert rewards == {"agent_0": 1.0, "agent_1": 2.0}
    assert terms == truncs == {"agent_0": False, "agent_1": False}
    obs, _, terms, truncs, infos = env.step({"agent_0": 0, "agent_1": 1})
    assert obs == {} and env.agents == [] and terms == {"agent_0": True, "agent_1": True}
    assert truncs == {"agent_0": False, "agent_1": False}  # no time-limit rule for this env
    assert infos == {"agent_0": {"step": 1, "final_obs": 1}, "agent_1": {"step": 1, "final_obs": 2}}


def test_invalid_actions_raise_and_leave_the_env_usable() -> None:
    env = corral.adapt(TupleEnv(dones=[False, False]))
    env.reset()
    for bad in ({"agent_0": 0}, {"agent_0": 0, "agent_1": 2}, {"agent_0": 0, "agent_1": 1, "x": 0}):
        with pytest.raises(corral.InvalidActionError):
            env.step(bad)
    obs, *_ = env.step({"agent_0": 1, "agent_1": 1})
    assert obs == {"agent_0": 2, "agent_1": 2}


def test_trains_mappo_from_the_cli(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """MAPPO on LBF from the CLI, and a GIF of it recorded without a display (corral draws
    the frames)."""
    pytest.importorskip("lbforaging")
    pytest.importorskip("torch")
    pytest.importorskip("yaml")
    from corral import cli

    argv = ["train", "mappo", "--env", "lbf/Foraging-8x8-2p-3f-v3", "--total-steps", "2000"]
    argv += ["--run-dir", str(tmp_path / "run"), "--no-progress", "--set", "num_envs=2"]
    code = cli.main([*argv, "eval_episodes=4", "device=cpu", "tensorboard=false"])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert f"run {tmp_path / 'run'}: 2000 env steps" in out
    if importlib.util.find_spec("imageio") is None and importlib.util.find_spec("PIL") is None:
        return
    gif = tmp_path / "episode.gif"
    code = cli.main(["eval", str(tmp_path / "run"), "--episodes", "2", "--gif", str(gif)])
    out, err = capsys.readouterr()
    assert code == 0 and "no GIF written" not in err, err
    assert gif.read_bytes()[:6] == b"GIF89a"


def _centre(row: int, col: int) -> tuple[int, int]:
    return int((row + 0.5) * grid_frames.CELL), int((col + 0.5) * grid_frames.CELL)


def test_lbf_renders_frames_of_its_state_without_a_display() -> None:
    """LBF has no rgb_array mode and draws with pyglet: corral draws its frames (headless
    here), food and agents where the state has them, a pip per level."""
    pytest.importorskip("lbforaging")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "render_mode not in the possible render_modes"
        env = corral.make("lbf/Foraging-8x8-2p-3f-v3", render_mode="rgb_array")
    assert "rgb_array" in env.metadata["render_modes"]
    env.reset(seed=3)
    rng = np.random.default_rng(0)
    for _ in range(4):
        lbf = env.unwrapped
        frame = env.render()
        assert frame.shape == (8 * 24, 8 * 24, 3) and frame.dtype == np.uint8
        players = {
            tuple(int(x) for x in p.position): (i, int(p.level)) for i, p in enumerate(lbf.players)
        }
        for row, col in zip(*np.nonzero(lbf.field), strict=True):
            level = int(lbf.field[row, col])
            assert tuple(frame[_centre(row, col)]) == grid_frames.FOOD
            pips = [
                tuple(frame[tuple(int(v) for v in grid_frames.pip_centre(row, col, k))])
                for k in range(level + 1)
            ]
            assert pips == [grid_frames.PIP] * level + [grid_frames.FOOD]
        for (row, col), (i, level) in players.items():
            y, x = _centre(row, col)
            assert tuple(frame[y - 2, x]) == grid_frames.AGENTS[i]
            pips = [
                tuple(frame[tuple(int(v) for v in grid_frames.pip_centre(row, col, k))])
                for k in range(level)
            ]
            assert pips == [grid_frames.PIP] * level
        empty = [
            (r, c)
            for r in range(8)
            for c in range(8)
            if not lbf.field[r, c] and (r, c) not in players
        ]
        assert all(tuple(frame[_centre(r, c)]) == grid_frames.FLOOR for r, c in empty)
        env.step({a: int(rng.integers(6)) for a in env.agents})


@pytest.mark.parametrize("backend", ["sync", "subproc"])
def test_rware_renders_frames_of_its_state_without_a_display(backend: str) -> None:
    """RWARE's own rgb_array frames need a display (pyglet): corral draws them, through the
    vector env too: goals, shelves (requested ones apart), agents loaded or not."""
    pytest.importorskip("rware")
    env = corral.make("rware/rware-tiny-2ag-v2", render_mode="rgb_array")
    env.reset(seed=1)
    rng = np.random.default_rng(0)
    drawn_loaded = False
    for _ in range(12):
        warehouse = env.unwrapped
        frame = env.render()
        rows, cols = warehouse.grid_size
        assert frame.shape == (rows * 24, cols * 24, 3) and frame.dtype == np.uint8
        robots = {(int(a.y), int(a.x)): a for a in warehouse.agents}
        for (row, col), agent in robots.items():
            loaded = agent.carrying_shelf is not None
            colour = grid_frames.LOADED if loaded else grid_frames.ROBOT
            assert tuple(frame[_centre(row, col)]) == colour
            drawn_loaded |= loaded
        requested = {id(s) for s in warehouse.request_queue}
        for shelf in warehouse.shelfs:
            corner = int(shelf.y) * 24 + 4, int(shelf.x) * 24 + 4
            expected = grid_frames.REQUESTED if id(shelf) in requested else grid_frames.SHELF
            assert tuple(frame[corner]) == expected
        for x, y in warehouse.goals:
            if (y, x) not in robots:
                assert tuple(frame[_centre(y, x)]) == grid_frames.GOAL
        # forward mostly, and toggle load now and then, so that agents pick shelves up
        env.step({a: int(rng.choice(5, p=[0.05, 0.6, 0.1, 0.1, 0.15])) for a in env.agents})
    assert drawn_loaded  # an agent carried a shelf in one of the frames
    drawn = {"render_mode": "rgb_array"}
    with corral.make_vec("rware/rware-tiny-2ag-v2", 2, backend=backend, env_kwargs=drawn) as venv:
        venv.reset(seed=1)
        frames = venv.render()
    env.reset(seed=1)
    np.testing.assert_array_equal(frames[0], env.render())
    assert frames[0].shape == frames[1].shape and not np.array_equal(frames[0], frames[1])


@pytest.mark.filterwarnings("ignore:.*Box high's precision lowered")
def test_lbf_grid_observations_are_refused_saying_why_where_lbforaging_cannot_build_them() -> None:
    pytest.importorskip("lbforaging")
    try:
        raw_env("lbf", "Foraging-8x8-2p-3f-v3", grid_observation=True)
    except ValueError:
        with pytest.raises(UnsupportedEnvError, match="with grid_observation=True: lbforaging"):
            corral.make("lbf/Foraging-8x8-2p-3f-v3", grid_observation=True)
    else:  # a fixed lbforaging: its grid observations are played as they are
        env = corral.make("lbf/Foraging-8x8-2p-3f-v3", grid_observation=True)
        obs, _ = env.reset(seed=0)
        assert all(env.observation_space(a).contains(o) for a, o in obs.items())
    with pytest.raises(TypeError):  # another argument's error stays as it was
        corral.make("lbf/Foraging-8x8-2p-3f-v3", no_such_argument=1)
