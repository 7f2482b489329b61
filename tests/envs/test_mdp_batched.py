"""Natively batched mdp/... envs: exact, step by step, to E dict envs packed by hand."""

from __future__ import annotations

import contextlib
import doctest
import pickle
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from support.marks import needs_cuda

import corral
import corral.envs.mdp_batched
from corral.arrays import to_numpy
from corral.batched_env import BatchedStep
from corral.envs.mdp import penalty_game
from corral.envs.mdp_batched import BatchedMatrixGame, BatchedTabularMDP, batch

MDP_IDS = corral.registered_ids("mdp")


PLACES = [
    pytest.param(("numpy", "cpu"), id="numpy"),
    pytest.param(("torch", "cpu"), id="torch-cpu"),
    pytest.param(("torch", "cpu", "as on a GPU"), id="torch-cpu-device-path"),  # draws on it
    pytest.param(
        ("torch", "cuda"),
        id="torch-cuda",
        marks=needs_cuda,
    ),
]


@pytest.fixture(params=PLACES)
def place(request: pytest.FixtureRequest) -> Iterator[tuple[str, str]]:
    array, device = request.param[:2]
    if array == "torch":
        pytest.importorskip("torch")
    as_on_a_gpu = request.param[2:] == ("as on a GPU",)  # the device path: draws from CopyStreams
    with corral.device_path() if as_on_a_gpu else contextlib.nullcontext():
        yield array, device


class Packed:
    """E dict envs packed by the rules a batched env must match (the oracle)."""

    def __init__(self, env_id: str, num_envs: int, **kwargs: Any) -> None:
        self.envs = [corral.make(env_id, **kwargs) for _ in range(num_envs)]
        env = self.envs[0]
        self.groups = corral.group_agents(
            env.possible_agents, env.observation_space, env.action_space
        )
        self.last_obs = [
            {a: np.zeros(env.observation_space(a).shape, np.float32) for a in env.possible_agents}
            for _ in self.envs
        ]
        self.acting = [set() for _ in self.envs]
        self.masks: list[dict[str, np.ndarray]] = [{} for _ in self.envs]

    def reset(self, seeds: list[int | None], where: np.ndarray) -> None:
        for i in np.flatnonzero(where):
            env = self.envs[i]
            obs, infos = env.reset(seed=seeds[i])
            self.last_obs[i] = {
                a: np.zeros(env.observation_space(a).shape, np.float32) for a in env.possible_agents
            }
            self._record(i, obs, infos)

    def step(self, actions: dict[str, np.ndarray]) -> dict[str, dict[str, np.ndarray]]:
        fields = ("reward", "terminated", "truncated")
        out = {
            f: {g: np.zeros((len(self.envs), len(a))) for g, a in self.groups.items()}
            for f in fields
        }
        for i, env in enumerate(self.envs):
            if not env.agents:
                continue
            act = {a: actions[g][i, j] for g, ags in self.groups.items() for j, a in enumerate(ags)}
            obs, rewards, terminated, truncated, infos = env.step(
                {a: act[a] for a in self.acting[i]}
            )
            for g, ags in self.groups.items():
                for j, a in enumerate(ags):
                    out["reward"][g][i, j] = rewards.get(a, 0.0)
                    out["terminated"][g][i, j] = terminated.get(a, False)
                    out["truncated"][g][i, j] = truncated.get(a, False)
                    if "final_obs" in infos.get(a, {}):
                        self.last_obs[i][a] = infos[a]["final_obs"]
            self._record(i, obs, infos)
        return out

    def _record(self, i: int, obs: dict[str, Any], infos: dict[str, Any]) -> None:
        self.last_obs[i].update(obs)
        self.acting[i] = set(obs)
        self.masks[i] = {a: infos[a]["action_mask"] for a in obs if "action_mask" in infos[a]}

    def expected(self) -> dict[str, Any]:
        """obs, alive, acting, action_mask per group and state, as the batched env returns them."""
        per_group: dict[str, dict[str, np.ndarray]] = {}
        for g, agents in self.groups.items():
            rows = [
                [
                    (
                        self.last_obs[i][a],
                        a in env.agents,
                        a in self.acting[i],
                        self.masks[i].get(a, np.ones(env.action_space(a).n)).astype(bool)
                        if a in self.acting[i]
                        else np.ones(env.action_space(a).n, bool),
                    )
                    for a in agents
                ]
                for i, env in enumerate(self.envs)
            ]
            for k, name in enumerate(("obs", "alive", "acting", "action_mask")):
                per_group.setdefault(name, {})[g] = np.array([[r[k] for r in row] for row in rows])
        per_group["state"] = np.array([env.state() for env in self.envs])
        return per_group


def _check(
    got: BatchedStep, want: dict[str, Any], step: dict[str, Any] | None, place: tuple[str, str]
) -> None:
    """Every field of ``got`` equals ``want`` (and ``step``'s rewards and ends), with the dtype
    of the dict env's packing, in ``place``'s namespace and on its device."""
    array_kind, device = place
    pairs = [
        (f"{f}[{g}]", getattr(got, f)[g], w)
        for f in ("obs", "alive", "acting", "action_mask")
        for g, w in want[f].items()
    ]
    pairs.append(("state", got.state, want["state"]))
    if step is None:
        assert got.reward is None and got.terminated is None and got.truncated is None
    else:
        for f, dtype in (("reward", np.float64), ("terminated", np.bool_), ("truncated", np.bool_)):
            pairs += [
                (f"{f}[{g}]", getattr(got, f)[g], w.astype(dtype)) for g, w in step[f].items()
            ]
    for name, array, expected in pairs:
        assert isinstance(array, np.ndarray) == (array_kind == "numpy"), name
        if array_kind == "torch":
            assert array.device.type == device, name
        value = to_numpy(array)
        assert value.dtype == expected.dtype, (name, value.dtype, expected.dtype)
        np.testing.assert_array_equal(value, expected, err_msg=name)


@pytest.mark.parametrize("env_id", MDP_IDS)
def test_exact_to_packed_dict_envs(env_id: str, place: tuple[str, str]) -> None:
    """Seeded and unseeded resets, autoreset, finished copies left waiting, partial reseeds
    mid-episode: every field, every step, over hundreds of episodes."""
    array, device = place
    num_envs, steps = 6, 240
    packed = Packed(env_id, num_envs)
    env = corral.spec(env_id).make_batched(num_envs, array=array, device=device)
    rng = np.random.default_rng(7)
    put = env.place.from_host

    seeds = [100 + i for i in range(num_envs)]
    packed.reset(seeds, np.ones(num_envs, bool))
    _check(env.reset(seed=100), packed.expected(), None, place)
    episodes = 0
    for t in range(steps):
        actions = {
            g: rng.integers(0, env.action_space(agents[0]).n, (num_envs, len(agents)))
            for g, agents in env.groups.items()
        }
        out = env.step({g: put(a) for g, a in actions.items()})
        ends = packed.step(actions)
        _check(out, packed.expected(), ends, place)
        if t % 7 == 6:
            continue  # finished copies wait a step: they must not be stepped again
        done = ~np.array([bool(e.agents) for e in packed.envs])
        if t % 37 == 36:  # restart some copies mid-episode, reseeding a few of them
            done |= rng.random(num_envs) < 0.5
            seeds = [int(s) if rng.random() < 0.5 else None for s in rng.integers(0, 99, num_envs)]
        else:
            seeds = [None] * num_envs
        if done.any():
            episodes += int(done.sum())
            packed.reset(seeds, done)
            out = env.reset(seed=seeds, where=put(done))
            want = packed.expected()
            for field in ("obs", "alive", "acting", "action_mask"):  # rows of other copies unread
                for g in want[field]:
                    want[field][g] = want[field][g][done]
                    getattr(out, field)[g] = getattr(out, field)[g][put(done)]
            want["state"] = want["state"][done]
            out.state = out.state[put(done)]
            _check(out, want, None, place)
    assert episodes >= 200


def test_registry_builds_the_batched_env() -> None:
    env = corral.spec("mdp/climbing").make_batched(8)
    assert isinstance(env, BatchedMatrixGame) and env.num_envs == 8
    assert set(MDP_IDS) <= set(corral.batched_ids())
    assert isinstance(corral.spec("mdp/two_round_nmdp").make_batched(2), BatchedTabularMDP)
    assert pickle.loads(pickle.dumps(corral.spec("mdp/penalty").batched)) is not None


@pytest.mark.parametrize("env_id", MDP_IDS)
def test_same_description_as_the_dict_env(env_id: str) -> None:
    dict_env = corral.make(env_id)
    env = corral.spec(env_id).make_batched(3)
    assert env.possible_agents == dict_env.possible_agents
    for agent in dict_env.possible_agents:
        assert env.observation_space(agent) == dict_env.observation_space(agent)
        assert env.action_space(agent) == dict_env.action_space(agent)
    groups = corral.group_agents(
        dict_env.possible_agents, dict_env.observation_space, dict_env.action_space
    )
    assert env.groups == {g: tuple(a) for g, a in groups.items()}
    assert env.state_space == dict_env.state_space
    assert env.metadata == {**dict_env.metadata, "render_modes": []}  # only the dict env draws
    assert env.max_episode_steps == dict_env.max_episode_steps
    assert env.optimal_return == dict_env.optimal_return


def test_kwargs_reach_the_batched_env() -> None:
    env = corral.spec("mdp/penalty").make_batched(2, k=-7.0)
    env.reset(seed=0)
    out = env.step({"player": np.array([[0, 2], [2, 0]])})
    assert out.reward["player"].tolist() == [[-7.0, -7.0], [-7.0, -7.0]]
    assert env.optimal_return == penalty_game(k=-7.0).optimal_return
    with pytest.raises(ValueError, match="penalty k must be <= 0"):
        corral.spec("mdp/penalty").make_batched(2, k=1.0)


def test_reset_where_leaves_other_copies_running() -> None:
    env = corral.spec("mdp/two_round_dmdp").make_batched(3)
    env.reset(seed=0)
    env.step({"agent": np.array([[0], [1], [0]])})  # copies 0 and 2 in state 1, copy 1 in 2
    out = env.reset(where=np.array([False, True, False]))
    assert out.state.argmax(axis=1).tolist() == [1, 0, 1]
    out = env.step({"agent": np.array([[0], [0], [1]])})
    assert out.reward["agent"][:, 0].tolist() == [3.0, 0.0, 0.0]
    assert out.alive["agent"][:, 0].tolist() == [False, True, False]
    # a finished copy that is not reset stays finished: it is not stepped again
    out = env.step({"agent": np.array([[0], [0], [0]])})
    assert out.reward["agent"][:, 0].tolist() == [0.0, 3.0, 0.0]
    assert out.terminated["agent"][:, 0].tolist() == [False, True, False]


def test_matrix_game_reset_where_and_finished_copies() -> None:
    env = corral.spec("mdp/climbing").make_batched(2)
    env.reset(seed=0)
    env.step({"player": np.zeros((2, 2), np.int64)})
    out = env.reset(where=np.array([True, False]))
    assert out.alive["player"].tolist() == [[True, True], [False, False]]
    out = env.step({"player": np.zeros((2, 2), np.int64)})
    assert out.reward["player"].tolist() == [[11.0, 11.0], [0.0, 0.0]]
    assert out.terminated["player"].tolist() == [[True, True], [False, False]]


def test_bad_calls_raise_clear_errors() -> None:
    env = corral.spec("mdp/one_round_nmdp").make_batched(3)
    with pytest.raises(RuntimeError, match="before reset"):
        env.step({"agent": np.zeros((3, 1), np.int64)})
    with pytest.raises(ValueError, match=r"shape \(3,\)"):
        env.reset(where=np.ones(4, bool))
    with pytest.raises(ValueError, match="2 seeds for 3 copies"):
        env.reset(seed=[1, 2])
    with pytest.raises(TypeError, match="TabularMDP or a MatrixGame"):
        batch(object(), 2)  # type: ignore[arg-type]


def test_imports_stay_lazy() -> None:
    """Listing the ids imports no batched module; a numpy batched env imports no torch."""
    code = (
        "import sys, corral; corral.batched_ids(); "
        "assert 'corral.envs.mdp_batched' not in sys.modules; "
        "corral.spec('mdp/climbing').make_batched(4).reset(seed=0); "
        "assert 'corral.envs.mdp_batched' in sys.modules and 'torch' not in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_doctests_pass() -> None:
    result = doctest.testmod(corral.envs.mdp_batched, optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0 and result.failed == 0
