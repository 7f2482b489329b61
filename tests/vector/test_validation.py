"""Bad values an env returns, and bad actions, raise errors naming the env, agent and field.

``ValueEnv`` returns one chosen bad value at step 2 of its episodes (or at reset).
It runs as env 3 of four: with ``subproc`` and ``ray`` that is the second env of
the second worker, so a worker's first env (2) must not be blamed for it.
``NativeValues``, a natively batched env, does the same to copy 3 of its arrays.
"""

from __future__ import annotations

import functools
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import cloudpickle
import numpy as np
import pytest
from gymnasium import spaces
from support.marks import needs_torch

import corral
from corral.errors import EnvError, InvalidActionError
from corral.returned_values import (
    debug_mode,
    exactly_as,
    finite_problem,
    is_flag_array,
    nonfinite_cells,
    nonflag_flags,
    overflow_flags,
    store_exactly,
)
from corral.vector import VectorEnv
from corral.vector.sources import NativeSource

cloudpickle.register_pickle_by_value(sys.modules[__name__])  # workers cannot import tests/

NUM_ENVS, BAD_ENV = 4, 3
OPTIONS = {
    "sync": {},
    "subproc": {"envs_per_worker": 2},
    "ray": {"envs_per_worker": 2, "num_cpus_per_worker": 0.25},  # four at once fit 2 CPUs
}
BACKENDS = list(OPTIONS)
UNBOUNDED = spaces.Box(-np.inf, np.inf, (3,), np.float32)


def _obs_shape(obs, rewards, terms, truncs, infos) -> None:
    obs["agent_1"] = np.zeros(4, np.float32)


def _obs_scalar(obs, rewards, terms, truncs, infos) -> None:
    obs["agent_1"] = 0.5


def _obs_nan(obs, rewards, terms, truncs, infos) -> None:
    obs["agent_1"][1] = np.nan


def _obs_overflow(obs, rewards, terms, truncs, infos) -> None:
    obs["agent_1"] = np.array([0.0, 1e300, 0.0])  # float64: inf once stored as float32


def _reward_text(obs, rewards, terms, truncs, infos) -> None:
    rewards["agent_1"] = "1.5"


def _reward_nan(obs, rewards, terms, truncs, infos) -> None:
    rewards["agent_1"] = float("nan")


def _unknown_agent(obs, rewards, terms, truncs, infos) -> None:
    rewards["ghost"] = 0.0


def _final_obs_inf(obs, rewards, terms, truncs, infos) -> None:
    infos["agent_0"]["final_obs"][0] = np.inf


def _termination_text(obs, rewards, terms, truncs, infos) -> None:
    terms["agent_1"] = "no"


def _info_not_a_dict(obs, rewards, terms, truncs, infos) -> None:
    infos["agent_0"] = ["not", "a", "dict"]  # agent_0 ends: its final_obs is read


def _leaves_without_ending(obs, rewards, terms, truncs, infos) -> None:
    terms["agent_0"] = False  # agent_0 leaves env.agents all the same


FAULTS: dict[str, Callable[..., None]] = {
    "obs_shape": _obs_shape,
    "obs_scalar": _obs_scalar,
    "obs_nan": _obs_nan,
    "obs_overflow": _obs_overflow,
    "reward_text": _reward_text,
    "reward_nan": _reward_nan,
    "unknown_agent": _unknown_agent,
    "final_obs_inf": _final_obs_inf,
    "termination_text": _termination_text,
    "info_not_a_dict": _info_not_a_dict,
    "leaves_without_ending": _leaves_without_ending,
}


class ValueEnv(corral.MultiAgentEnv):
    """``agent_0`` and ``agent_1`` with unbounded Box observations, actions and state.

    ``agent_0`` terminates at step 2 (with a ``final_obs``), ``agent_1`` at step 3.
    At step 2 the env applies ``FAULTS[bad]`` to what it returns, or with
    ``bad="rewards_not_a_dict"`` returns a list of rewards; ``"obs_scalar_at_reset"``
    and ``"state_nan"`` break ``reset`` and ``state``.
    """

    possible_agents = ["agent_0", "agent_1"]
    state_space = spaces.Box(-np.inf, np.inf, (2,), np.float32)

    def __init__(self) -> None:
        self.bad: str | None = None
        self.agents: list[str] = []
        self.t = 0

    def observation_space(self, agent: str) -> spaces.Box:
        return UNBOUNDED

    def action_space(self, agent: str) -> spaces.Box:
        return spaces.Box(-np.inf, np.inf, (2,), np.float32)

    def state(self) -> np.ndarray:
        state = np.array([self.t, 0.0], np.float32)
        if self.bad == "state_nan" and self.t == 2:
            state[1] = np.nan
        return state

    def reset(self, seed=None, options=None):
        self.agents, self.t = list(self.possible_agents), 0
        obs = {a: self._obs() for a in self.agents}
        if self.bad == "obs_scalar_at_reset":
            obs["agent_1"] = 0.5
        return obs, {a: {} for a in self.agents}

    def step(self, actions):
        self.t += 1
        ending = [a for a in self.agents if self.t >= {"agent_0": 2, "agent_1": 3}[a]]
        alive = self.agents
        self.agents = [a for a in alive if a not in ending]
        obs = {a: self._obs() for a in self.agents}
        rewards = {a: 1.0 for a in alive}
        terms = {a: a in ending for a in alive}
        truncs = {a: False for a in alive}
        infos = {a: {"final_obs": self._obs()} if a in ending else {} for a in alive}
        if self.t == 2 and self.bad in FAULTS:
            FAULTS[self.bad](obs, rewards, terms, truncs, infos)
        if self.t == 2 and self.bad == "ends_but_stays":  # agent_0 terminated, kept
            self.agents, obs = list(alive), {a: self._obs() for a in alive}
        if self.t == 2 and self.bad == "rewards_not_a_dict":
            return obs, list(rewards.values()), terms, truncs, infos
        return obs, rewards, terms, truncs, infos

    def _obs(self) -> np.ndarray:
        return np.full(3, self.t, np.float32)


_STARTED_RAY: list = []  # the Ray this module started, shut down at its end


def _start_ray() -> None:
    ray = pytest.importorskip("ray")
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    if not ray.is_initialized():
        ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
        _STARTED_RAY.append(ray)


def _vector_env(backend: str, **kwargs) -> VectorEnv:
    if backend == "ray":
        _start_ray()
    return VectorEnv([ValueEnv] * NUM_ENVS, backend, state=True, **kwargs, **OPTIONS[backend])


@pytest.fixture(scope="module")
def venvs() -> Iterator[Callable[..., VectorEnv]]:
    """``venvs(backend, check_finite)``: one vector env of ValueEnvs per pair, kept for the
    module (starting Ray actors costs seconds); ``check_finite=None`` leaves it unset."""
    made: dict[tuple[str, bool | None], VectorEnv] = {}

    def get(backend: str, check_finite: bool | None = None) -> VectorEnv:
        if (backend, check_finite) not in made:
            options = {} if check_finite is None else {"check_finite": check_finite}
            made[backend, check_finite] = _vector_env(backend, **options)
        return made[backend, check_finite]

    yield get
    for venv in made.values():
        venv.close()
    while _STARTED_RAY:
        _STARTED_RAY.pop().shutdown()


def _play(venv: VectorEnv, bad: str | None, actions: np.ndarray | None = None):
    """Give env ``BAD_ENV`` the fault ``bad``, reset and take three steps; the last batch."""
    venv.set_attr("bad", [bad if i == BAD_ENV else None for i in range(venv.num_envs)])
    batch = venv.reset(seed=0)
    for _ in range(3):
        zeros = np.zeros((venv.num_envs, 2, 2), np.float32)
        batch = venv.step({"agent": zeros if actions is None else actions})
    return batch


def _error(venv: VectorEnv, bad: str) -> str:
    """The message of the EnvError that env ``BAD_ENV``'s fault ``bad`` raises."""
    with pytest.raises(EnvError) as info:
        _play(venv, bad)
    assert info.value.env_index == BAD_ENV, str(info.value)
    message = str(info.value)
    assert message.startswith(f"env {BAD_ENV}: "), message
    return message


# -- every backend ------------------------------------------------------------------------


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(
    ("bad", "expected"),
    [
        (
            "obs_shape",
            "observation of agent 'agent_1': expected shape (3,), got array of shape (4,)",
        ),
        ("obs_scalar", "observation of agent 'agent_1': expected shape (3,), got float 0.5"),
        ("reward_text", "reward of agent 'agent_1': expected a real number, got str '1.5'"),
        ("unknown_agent", "rewards names agent 'ghost', which is not one of possible_agents"),
        (
            "leaves_without_ending",
            "agent 'agent_0' left env.agents in this step, but neither its terminations nor "
            "its truncations is True",
        ),
        (
            "ends_but_stays",
            "agent 'agent_0' ended in this step (terminations or truncations True) but is "
            "still in env.agents",
        ),
    ],
)
def test_bad_values_name_the_env_agent_and_field(venvs, backend, bad, expected) -> None:
    message = _error(venvs(backend), bad)
    assert expected in message


@pytest.mark.parametrize("backend", BACKENDS)
def test_nan_raises_with_check_finite_and_passes_without(venvs, backend) -> None:
    checked = venvs(backend, check_finite=True)
    assert "observation of agent 'agent_1': expected finite values, got nan at index (1,)" in (
        _error(checked, "obs_nan")
    )
    assert "reward of agent 'agent_1': expected a finite number, got nan" in (
        _error(checked, "reward_nan")
    )
    unchecked = venvs(backend, check_finite=False)
    unchecked.set_attr("bad", [None, None, None, "obs_nan"])
    unchecked.reset(seed=0)
    zeros = {"agent": np.zeros((NUM_ENVS, 2, 2), np.float32)}
    unchecked.step(zeros)
    batch = unchecked.step(zeros)  # step 2
    assert np.isnan(batch.obs["agent"][BAD_ENV, 1, 1])
    assert not np.isnan(batch.obs["agent"][:BAD_ENV]).any()


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("check_finite", [False, True])
def test_float32_overflow_in_obs_raises(venvs, backend, check_finite) -> None:
    message = _error(venvs(backend, check_finite=check_finite), "obs_overflow")
    assert "observation of agent 'agent_1': expected values that float32 holds" in message
    assert "got 1e+300 at index (1,), which overflows float32" in message


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(
    ("bad", "check_finite"),
    [
        ("obs_shape", False),
        ("obs_nan", True),
        ("reward_nan", True),
        ("final_obs_inf", True),
        ("unknown_agent", False),  # raised while its good rewards were being gathered
    ],
)
def test_a_bad_value_cuts_the_episode_where_it_stood_before_the_step(
    venvs, backend, bad, check_finite
) -> None:
    # Step 2 of env 3 returns one bad value (agent_0 also terminates there): that step did
    # not happen for any agent: no reward, no end of its own, the observations of step 1.
    venv = venvs(backend, check_finite=check_finite)
    venv.set_attr("bad", [bad if i == BAD_ENV else None for i in range(NUM_ENVS)])
    venv.reset(seed=0)
    zeros = {"agent": np.zeros((NUM_ENVS, 2, 2), np.float32)}
    venv.step(zeros)
    with pytest.raises(EnvError) as info:
        venv.step(zeros)
    batch = info.value.batch
    assert batch.done.tolist() == [False, False, False, True]
    assert batch.truncated["agent"][BAD_ENV].tolist() == [True, True]
    assert batch.terminated["agent"][BAD_ENV].tolist() == [False, False]
    assert batch.reward["agent"][BAD_ENV].tolist() == [0.0, 0.0]
    np.testing.assert_array_equal(batch.final_obs["agent"][BAD_ENV], np.ones((2, 3)))
    np.testing.assert_array_equal(batch.final_state[BAD_ENV], [1.0, 0.0])
    assert batch.episode_length[BAD_ENV] == 1
    assert batch.episode_return["agent"][BAD_ENV].tolist() == [1.0, 1.0]
    np.testing.assert_array_equal(batch.obs["agent"][BAD_ENV], np.zeros((2, 3)))  # restarted
    healthy = batch.terminated["agent"][:BAD_ENV]  # agent_0 of the others ends as it should
    assert healthy.tolist() == [[True, False]] * BAD_ENV


@pytest.mark.parametrize("backend", BACKENDS)
def test_action_that_overflows_an_unbounded_box_is_rejected(venvs, backend) -> None:
    venv = venvs(backend)
    actions = np.zeros((NUM_ENVS, 2, 2))  # float64, wider than the float32 space
    actions[BAD_ENV, 1, 0] = 1e300
    with pytest.raises(InvalidActionError) as info:
        _play(venv, None, actions)
    message = str(info.value)
    assert f"group 'agent', env {BAD_ENV}, agent 'agent_1'" in message
    assert "expected values that float32 holds" in message
    actions[BAD_ENV, 1, 0] = 3e38  # within float32: accepted
    _play(venv, None, actions)


@pytest.mark.parametrize("backend", BACKENDS)
def test_corral_debug_turns_check_finite_on(backend, monkeypatch) -> None:
    monkeypatch.setenv("CORRAL_DEBUG", "1")
    venv = _vector_env(backend)
    try:
        assert venv.check_finite
        assert "observation of agent 'agent_1': expected finite values" in _error(venv, "obs_nan")
    finally:
        venv.close()
    monkeypatch.setenv("CORRAL_DEBUG", "0")
    venv = _vector_env("sync")
    assert not venv.check_finite
    venv.close()


# -- the runner is the same on every backend: the other fields, in-process -----------------


@pytest.mark.parametrize(
    ("bad", "expected"),
    [
        ("obs_scalar_at_reset", "observation of agent 'agent_1': expected shape (3,)"),
        ("final_obs_inf", "final_obs of agent 'agent_0': expected finite values, got inf"),
        ("state_nan", "state: expected finite values, got nan at index (1,)"),
        ("termination_text", "termination of agent 'agent_1': expected a bool, got str 'no'"),
        ("info_not_a_dict", "info of agent 'agent_0': expected a dict, got list"),
        ("rewards_not_a_dict", "step() must return 5 dicts (obs, rewards, terminations,"),
    ],
)
def test_every_field_is_named(venvs, bad, expected) -> None:
    assert expected in _error(venvs("sync", check_finite=True), bad)


@pytest.mark.parametrize(
    ("reward", "got"),
    [(None, "NoneType None"), (np.ones(2), "array of shape (2,)"), (1 + 2j, "complex")],
)
def test_rewards_that_are_not_real_numbers_raise_without_check_finite(reward, got) -> None:
    class Rewarding(ValueEnv):
        def step(self, actions):
            obs, rewards, terms, truncs, infos = super().step(actions)
            rewards["agent_1"] = reward
            return obs, rewards, terms, truncs, infos

    venv = VectorEnv([Rewarding], check_finite=False)
    venv.reset(seed=0)
    with pytest.raises(EnvError, match=r"env 0: reward of agent 'agent_1': expected a real") as e:
        venv.step({"agent": np.zeros((1, 2, 2), np.float32)})
    assert got in str(e.value)
    venv.close()


@pytest.mark.parametrize("part", ["rewards", "terminations"])
def test_a_step_that_returns_none_for_a_dict_names_it(part) -> None:
    class Missing(ValueEnv):
        def step(self, actions):
            returned = dict(zip(["obs", "rewards", "terminations", "truncations", "infos"],
                                super().step(actions), strict=True))  # fmt: skip
            returned[part] = None
            return tuple(returned.values())

    venv = VectorEnv([Missing])
    venv.reset(seed=0)
    with pytest.raises(EnvError) as info:
        venv.step({"agent": np.zeros((1, 2, 2), np.float32)})
    assert "step() must return 5 dicts (obs, rewards, terminations, truncations, infos)" in (
        str(info.value)
    )
    assert f"but {part} is NoneType None" in str(info.value)
    venv.close()


def test_numpy_scalars_and_one_element_arrays_are_rewards() -> None:
    class Rewarding(ValueEnv):
        def step(self, actions):
            obs, rewards, terms, truncs, infos = super().step(actions)
            rewards.update(agent_0=np.float32(0.5), agent_1=np.array([2]))
            return obs, rewards, terms, truncs, infos

    venv = VectorEnv([Rewarding], check_finite=True)
    venv.reset(seed=0)
    batch = venv.step({"agent": np.zeros((1, 2, 2), np.float32)})
    assert batch.reward["agent"].tolist() == [[0.5, 2.0]]
    venv.close()


@pytest.mark.parametrize(
    ("flags", "ended"),
    [
        ({"agent_0": np.False_, "agent_1": 0}, []),
        ({"agent_0": np.bool_(True), "agent_1": False}, ["agent_0"]),
        ({"agent_0": 0, "agent_1": np.array([1])}, ["agent_1"]),
        ({"agent_0": 1, "agent_1": np.True_}, ["agent_0", "agent_1"]),
    ],
)
def test_numpy_bools_zero_one_and_one_element_arrays_are_end_flags(flags, ended) -> None:
    class Ending(ValueEnv):
        def step(self, actions):
            obs, rewards, _, truncs, infos = super().step(actions)
            self.agents = [a for a in self.possible_agents if a not in ended]
            obs = {a: v for a, v in obs.items() if a not in ended}
            return obs, rewards, dict(flags), truncs, infos

    venv = VectorEnv([Ending] * 2)
    venv.reset(seed=0)
    batch = venv.step({"agent": np.zeros((2, 2, 2), np.float32)})
    expected = [a in ended for a in ValueEnv.possible_agents]
    assert batch.terminated["agent"].tolist() == [expected] * 2
    done = all(expected)  # then both restart: every agent alive again
    assert batch.done.tolist() == [done] * 2
    assert batch.alive["agent"].tolist() == [[done or not e for e in expected]] * 2
    venv.close()


class DictObsEnv(ValueEnv):
    """Dict observations; with ``bad`` set, every ``pos`` of step 2 is a scalar."""

    def observation_space(self, agent: str) -> spaces.Dict:
        return spaces.Dict({"pos": UNBOUNDED, "id": spaces.Discrete(2)})

    def _obs(self) -> dict:
        pos = 0.5 if self.t == 2 and self.bad else np.zeros(3, np.float32)
        return {"pos": pos, "id": 1}


def test_the_part_of_a_dict_observation_is_named() -> None:
    venv = VectorEnv([DictObsEnv] * 2)
    venv.set_attr("bad", [None, "pos"])
    venv.reset(seed=0)
    zeros = {"agent": np.zeros((2, 2, 2), np.float32)}
    venv.step(zeros)
    with pytest.raises(EnvError) as info:
        venv.step(zeros)
    assert info.value.env_index == 1
    # agent_0's final_obs is recorded before agent_1's observation
    assert "final_obs['pos'] of agent 'agent_0': expected shape (3,), got float 0.5" in str(
        info.value
    )
    venv.close()


class MaskedEnv(corral.MultiAgentEnv):
    """One agent with four discrete actions and a mask of the wrong length."""

    possible_agents = ["p"]

    def observation_space(self, agent: str) -> spaces.Discrete:
        return spaces.Discrete(3)

    def action_space(self, agent: str) -> spaces.Discrete:
        return spaces.Discrete(4)

    def reset(self, seed=None, options=None):
        self.agents = ["p"]
        return {"p": 0}, {"p": {"action_mask": np.ones(1, np.int8)}}


class ByteObsEnv(ValueEnv):
    """``uint8`` observations; with ``bad`` set, step 2's are int64 holding 300."""

    def observation_space(self, agent: str) -> spaces.Box:
        return spaces.Box(0, 255, (3,), np.uint8)

    def _obs(self) -> np.ndarray:
        value = 300 if self.t == 2 and self.bad else self.t
        return np.array([value, 0, 0])  # int64


@pytest.mark.parametrize("check_finite", [False, True])
def test_an_integer_that_its_dtype_cannot_hold_is_not_wrapped_around(check_finite) -> None:
    venv = VectorEnv([ByteObsEnv] * 2, check_finite=check_finite)
    venv.set_attr("bad", [None, "300"])
    venv.reset(seed=0)
    zeros = {"agent": np.zeros((2, 2, 2), np.float32)}
    assert venv.step(zeros).obs["agent"][:, :, 0].tolist() == [[1, 1], [1, 1]]
    with pytest.raises(EnvError) as info:
        venv.step(zeros)  # 300 as uint8 would be 44
    assert str(info.value).startswith(
        "env 1: final_obs of agent 'agent_0': expected values that uint8 holds (in [0, 255]), "
        "got 300 at index (0,), which overflows uint8"
    )
    venv.close()


def test_action_mask_of_the_wrong_shape_is_not_broadcast() -> None:
    with pytest.raises(EnvError) as info:
        VectorEnv([MaskedEnv]).reset(seed=0)
    assert "action_mask of agent 'p': expected shape (4,), got array of shape (1,)" in str(
        info.value
    )


# -- a natively batched env ------------------------------------------------------------------


class NativeValues(corral.BatchedEnv):
    """``num_envs`` copies of two agents (group ``agent``) with unbounded float32 Box
    observations, discrete actions and a ``uint8`` state; every agent ends at step 3.

    At step 2, ``NATIVE_FAULTS[bad]`` breaks what the env returns for copy ``BAD_ENV``
    (the arrays of the copies ``offset`` on: the env may be a worker's shard).
    """

    possible_agents = ["agent_0", "agent_1"]
    state_space = spaces.Box(0, 255, (2,), np.uint8)

    def __init__(self, num_envs: int, offset: int = 0, bad: str | None = None) -> None:
        self.num_envs, self.offset, self.bad = num_envs, offset, bad
        self.t = np.zeros(num_envs, np.int64)

    def observation_space(self, agent: str) -> spaces.Box:
        return UNBOUNDED

    def action_space(self, agent: str) -> spaces.Discrete:
        return spaces.Discrete(2)

    def reset(self, seed=None, where=None, options=None) -> corral.BatchedStep:
        self.t[slice(None) if where is None else where] = 0
        return self._result(None)

    def step(self, actions) -> corral.BatchedStep:
        self.t += 1
        ended = np.repeat(self.t[:, None] >= 3, 2, axis=1)
        step = {"reward": {"agent": np.ones((self.num_envs, 2))}}
        step.update(terminated={"agent": ended}, truncated={"agent": np.zeros_like(ended)})
        out = self._result(step)
        copy = BAD_ENV - self.offset
        if 0 <= copy < self.num_envs and self.t[copy] == 2 and self.bad is not None:
            NATIVE_FAULTS[self.bad](out, copy)
        return out

    def _result(self, step: dict | None) -> corral.BatchedStep:
        alive = np.repeat(self.t[:, None] < 3, 2, axis=1)
        obs = np.repeat(self.t.astype(np.float32)[:, None, None], 2, axis=1).repeat(3, axis=2)
        state = np.zeros((self.num_envs, 2), np.uint8)
        state[:, 0] = self.t
        return corral.BatchedStep(
            obs={"agent": obs}, alive={"agent": alive}, acting={"agent": alive.copy()},
            state=state, **(step or {}),
        )  # fmt: skip


def _widened(out: corral.BatchedStep, copy: int, name: str, dtype: type, value: float) -> None:
    """Field ``name`` of ``out`` as ``dtype``, holding ``value`` in copy ``copy``."""
    array = getattr(out, name)
    wide = (array["agent"] if name == "obs" else array).astype(dtype)
    wide[copy, 1] = value
    setattr(out, name, {"agent": wide} if name == "obs" else wide)


def _obs_in_torch(out: corral.BatchedStep, copy: int) -> None:
    """The observations as a float64 torch tensor (of a numpy env), 1e300 in copy ``copy``."""
    _widened(out, copy, "obs", np.float64, 1e300)
    out.obs["agent"] = _torch().from_numpy(out.obs["agent"])


NATIVE_FAULTS: dict[str, Callable[[corral.BatchedStep, int], None]] = {
    "obs_scalar": lambda out, copy: out.obs.update(agent=np.float32(0.5)),
    "obs_of_one_agent": lambda out, copy: out.obs.update(agent=out.obs["agent"][:, :1]),
    "reward_of_one_agent": lambda out, copy: out.reward.update(agent=out.reward["agent"][:, :1]),
    "reward_text": lambda out, copy: out.reward.update(
        agent=np.full(out.reward["agent"].shape, "x")
    ),
    "no_obs_of_the_group": lambda out, copy: out.obs.clear(),
    "obs_overflow": lambda out, copy: _widened(out, copy, "obs", np.float64, 1e300),
    "obs_overflow_in_torch": _obs_in_torch,
    "obs_inf_in_float64": lambda out, copy: _widened(out, copy, "obs", np.float64, np.inf),
    "state_wraps": lambda out, copy: _widened(out, copy, "state", np.int64, 300),
    "obs_nan": lambda out, copy: out.obs["agent"].__setitem__((copy, 1, 2), np.nan),
    "reward_nan": lambda out, copy: out.reward["agent"].__setitem__((copy, 0), np.nan),
    "reward_none": lambda out, copy: setattr(out, "reward", None),
}


def _torch() -> Any:
    return pytest.importorskip("torch")


@dataclass(frozen=True)
class NativeValuesSource(NativeSource):
    """A source of :class:`NativeValues` whose shards know their first copy."""

    bad: str | None = None
    offset: int = 0

    def part(self, envs: range) -> NativeValuesSource:
        return NativeValuesSource(self.make, len(envs), self.state, self.bad, envs.start)

    def build(self, offset: int = 0) -> NativeValues:
        return self.make(self.num_envs, self.offset, self.bad)


def _native_play(backend: str, bad: str, check_finite: bool = False) -> corral.vector.Batch:
    """Two steps of ``NativeValues`` with the fault ``bad`` (four copies, two a worker)."""
    if backend == "ray":
        _start_ray()
    source = NativeValuesSource(NativeValues, NUM_ENVS, bad=bad)
    options = OPTIONS[backend]
    with VectorEnv(source, backend, state=True, check_finite=check_finite, **options) as venv:
        venv.reset(seed=0)
        actions = {"agent": np.zeros((NUM_ENVS, 2), np.int64)}
        venv.step(actions)
        return venv.step(actions)


def _native_error(backend: str, bad: str, check_finite: bool = False) -> EnvError:
    """The EnvError of ``NativeValues`` with the fault ``bad``."""
    with pytest.raises(EnvError) as info:
        _native_play(backend, bad, check_finite)
    return info.value


WHOLE_ARRAY = "([copies, agents of the group, ...] for its {n} copies; nothing is broadcast), got "


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_native_env_s_array_of_the_wrong_shape_is_not_broadcast(backend) -> None:
    """A whole array is wrong: the env (a worker's shard of copies 2-3) is named by its
    first copy, the field and group by name."""
    first, n = (0, NUM_ENVS) if backend == "sync" else (2, 2)
    err = _native_error(backend, "obs_scalar")
    assert err.env_index == first
    assert str(err) == (
        f"env {first}: obs['agent']: expected an array of shape ({n}, 2, 3) "
        + WHOLE_ARRAY.format(n=n)
        + "an array of shape () and dtype float32"
        + f"; every copy of the env (envs {first}-{first + n - 1}) restarts"
    )
    assert err.restarted


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_native_env_s_value_that_its_dtype_cannot_hold_names_the_copy_and_agent(
    backend,
) -> None:
    err = _native_error(backend, "obs_overflow")
    assert err.env_index == BAD_ENV
    first = 0 if backend == "sync" else 2  # the env (shard) holding the copy restarts
    assert str(err) == (
        f"env {BAD_ENV}: obs['agent'] of agent 'agent_1': expected values that float32 holds "
        "(in [-3.40282e+38, 3.40282e+38]), got 1e+300 at index (0,), which overflows float32"
        f"; every copy of the env (envs {first}-3) restarts"
    )
    assert err.restarted


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_torch_tensor_from_a_numpy_env_is_held_to_the_dtype(backend) -> None:
    """A float64 tensor holding 1e300 for a float32 field of a numpy env: the overflow is
    found as in a numpy array (it was stored as inf)."""
    err = _native_error(backend, "obs_overflow_in_torch")
    assert err.env_index == BAD_ENV
    assert (
        "obs['agent'] of agent 'agent_1': expected values that float32 holds "
        "(in [-3.40282e+38, 3.40282e+38]), got 1e+300 at index (0,), which overflows float32"
    ) in str(err)


class TorchNativeValues(NativeValues):
    """:class:`NativeValues` on torch (CPU); at step 2 copy ``BAD_ENV``'s observation is a
    float64 numpy array holding 1e300."""

    def __init__(self, num_envs: int, offset: int = 0, bad: str | None = None) -> None:
        super().__init__(num_envs, offset, bad)
        self.place = corral.Place("torch")  # built here: inside corral.device_path(), on its path

    def _result(self, step: dict | None) -> corral.BatchedStep:
        out = super()._result(step)
        torch = _torch()
        for name in ("obs", "alive", "acting", "reward", "terminated", "truncated"):
            value = getattr(out, name)
            if value is not None:
                setattr(out, name, {g: torch.from_numpy(v) for g, v in value.items()})
        out.state = torch.from_numpy(out.state)
        return out

    def step(self, actions) -> corral.BatchedStep:
        out = super().step(actions)
        copy = BAD_ENV - self.offset
        if 0 <= copy < self.num_envs and self.t[copy] == 2:
            wide = out.obs["agent"].numpy().astype(np.float64)
            wide[copy, 1] = 1e300
            out.obs["agent"] = wide
        return out


def test_a_numpy_array_from_a_torch_env_is_held_to_the_dtype(as_on_a_gpu) -> None:
    """On torch as on a device (the arrays are tensors, not numpy views of them)."""
    source = NativeValuesSource(TorchNativeValues, NUM_ENVS)
    with VectorEnv(source, "sync", state=True, array="torch") as venv:
        venv.reset(seed=0)
        actions = {"agent": _torch().zeros((NUM_ENVS, 2), dtype=_torch().int64)}
        venv.step(actions)
        with pytest.raises(EnvError) as info:
            venv.step(actions)
    assert info.value.env_index == BAD_ENV
    assert "got 1e+300 at index (0,), which overflows float32" in str(info.value)


@pytest.mark.parametrize("check_finite", [True, False])
def test_a_native_env_s_inf_in_a_wider_float_is_not_finite_and_no_overflow(check_finite) -> None:
    # inf stored as float32 stays inf: only check_finite refuses it, as it refuses the
    # same inf in a float32 array, with the same message
    if check_finite:
        err = _native_error("sync", "obs_inf_in_float64", check_finite=True)
        assert str(err).startswith(
            f"env {BAD_ENV}: observation of agent 'agent_1': expected finite values, got NaN or inf"
        )
        return
    batch = _native_play("sync", "obs_inf_in_float64", check_finite=False)
    assert batch.obs["agent"].dtype == np.float32
    assert np.isinf(batch.obs["agent"][BAD_ENV, 1]).all()


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_native_env_s_nan_raises_with_check_finite_and_passes_without(backend) -> None:
    err = _native_error(backend, "obs_nan", check_finite=True)
    assert err.env_index == BAD_ENV
    assert str(err).startswith(
        f"env {BAD_ENV}: observation of agent 'agent_1': expected finite values"
    )
    err = _native_error(backend, "reward_nan", check_finite=True)
    assert str(err).startswith(f"env {BAD_ENV}: reward of agent 'agent_0': expected finite")
    batch = _native_play(backend, "obs_nan", check_finite=False)
    assert np.isnan(batch.obs["agent"][BAD_ENV, 1, 2])
    assert np.isnan(batch.obs["agent"]).sum() == 1


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_native_step_without_rewards_names_the_field_the_agents_and_the_env(backend) -> None:
    first, n = (0, NUM_ENVS) if backend == "sync" else (2, 2)  # the env (shard) of copy 3
    err = _native_error(backend, "reward_none")
    assert err.env_index == first
    assert str(err) == (
        f"env {first}: reward: expected a dict with an array for group 'agent' (agents "
        "'agent_0', 'agent_1'), got NoneType None"
        f"; every copy of the env (envs {first}-{first + n - 1}) restarts"
    )
    assert err.restarted


@pytest.mark.parametrize(
    ("bad", "expected"),
    [
        (
            "obs_of_one_agent",
            "obs['agent']: expected an array of shape (4, 2, 3) "
            + WHOLE_ARRAY.format(n=4)
            + "an array of shape (4, 1, 3) and dtype float32",
        ),
        (
            "reward_of_one_agent",
            "reward['agent']: expected an array of shape (4, 2) "
            + WHOLE_ARRAY.format(n=4)
            + "an array of shape (4, 1) and dtype float64",
        ),
        (
            "reward_text",
            "reward['agent']: expected an array of numbers, got an array of shape (4, 2) and "
            "dtype <U1",
        ),
        (
            "no_obs_of_the_group",
            "obs: expected a dict with an array for group 'agent' (agents 'agent_0', "
            "'agent_1'), got dict",
        ),
        (
            "state_wraps",
            f"env {BAD_ENV}: state: expected values that uint8 holds (in [0, 255]), got 300 at "
            "index (1,), which overflows uint8",
        ),
    ],
)
def test_every_array_of_a_native_env_is_checked(bad, expected) -> None:
    assert expected in str(_native_error("sync", bad))


class NativeContract(corral.BatchedEnv):
    """``num_envs`` copies of two agents whose episode ends in step ``2 + i`` in copy ``i``
    (out of phase, so that a reset selects some copies while others run), in numpy or
    torch on the CPU; ``bad`` breaks one rule of the protocol in step 2 (or ``reset``)."""

    possible_agents = ["agent_0", "agent_1"]

    def __init__(self, num_envs: int, array: str = "numpy", bad: str | None = None) -> None:
        self.num_envs, self.bad, self.place = num_envs, bad, corral.Place(array)
        self.t = np.zeros(num_envs, np.int64)
        self.length = 2 + np.arange(num_envs)

    def observation_space(self, agent: str) -> spaces.Box:
        return UNBOUNDED

    def action_space(self, agent: str) -> spaces.Discrete:
        return spaces.Discrete(2)

    def reset(self, seed=None, where=None, options=None) -> corral.BatchedStep:
        where = None if where is None else np.asarray(corral.arrays.to_numpy(where))
        self.t[slice(None) if where is None or self.bad == "reset_ignores_where" else where] = 0
        return self._result(None)

    def step(self, actions) -> corral.BatchedStep:
        alive = self.t < self.length
        self.t += alive
        ended = np.repeat((alive & (self.t == self.length))[:, None], 2, axis=1)
        step = {"reward": np.ones((self.num_envs, 2)), "terminated": ended}
        step["truncated"] = np.zeros_like(ended)
        out = self._result(step)
        if self.bad == "same_alive" or (self.bad == "same_alive_at_2" and self.t[0] == 2):
            out.same_alive = True
        return out

    def _result(self, step: dict | None) -> corral.BatchedStep:
        alive = np.repeat((self.t < self.length)[:, None], 2, axis=1)
        obs = np.repeat(self.t.astype(np.float32)[:, None, None], 2, axis=1).repeat(3, axis=2)
        fields = {"obs": obs, "alive": alive, "acting": alive.copy(), **(step or {})}
        if step and self.bad == "leaves_without_ending":
            fields["terminated"] = np.zeros_like(alive)
        if step and self.bad == "ends_but_stays_alive":
            fields["alive"] = alive | fields["terminated"]
        if self.bad == "alive_half":
            fields["alive"] = alive * 0.5 + 0.5 * (self.t[:, None] == 0)
        place = self.place
        return corral.BatchedStep(**{k: {"agent": place.asarray(v)} for k, v in fields.items()})


def _contract_error(backend: str, array: str, bad: str, **settings) -> EnvError:
    """The EnvError of :class:`NativeContract` with the fault ``bad``, in six steps."""
    if backend == "ray":
        _start_ray()
    make = functools.partial(NativeContract, array=array, bad=bad)
    source = NativeSource(make, NUM_ENVS)
    with VectorEnv(source, backend, array=array, **settings, **OPTIONS[backend]) as venv:
        venv.reset(seed=0)
        with pytest.raises(EnvError) as info:
            for _ in range(6):
                venv.step({"agent": np.zeros((NUM_ENVS, 2), np.int64)})
    return info.value


ARRAYS = ["numpy", pytest.param("torch", marks=needs_torch)]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("array", ARRAYS)
@pytest.mark.parametrize(
    ("bad", "copy", "expected"),
    [
        (
            "leaves_without_ending",
            0,
            "agent 'agent_0' (group 'agent') was alive when the step began and is not alive "
            "after it, but neither terminated nor truncated is set",
        ),
        (
            "ends_but_stays_alive",
            0,
            "agent 'agent_0' (group 'agent') ended (terminated or truncated) but is still alive",
        ),
        (
            "alive_half",
            0,
            "alive['agent'] of agent 'agent_0': expected a bool (True or False, or 0 or 1), "
            "got 0.5",
        ),
        (
            "same_alive_at_2",
            0,
            "the step said same_alive=True, but the alive of agent 'agent_0' (group 'agent') "
            "changed from True to False",
        ),
        (
            "reset_ignores_where",
            1,
            "reset(where=...) did not select the copy, whose episode was running, but changed "
            "obs['agent'] of agent 'agent_0'",
        ),
    ],
)
def test_a_native_env_that_breaks_the_protocol_is_named_with_the_copy_and_agent(
    backend, array, bad, copy, expected
) -> None:
    """Each broke silently: episodes without an end flag, a false same_alive (the episode
    was seen a step late), a float alive read as True, a reset that restarts running copies."""
    err = _contract_error(backend, array, bad)
    assert err.env_index == copy, str(err)
    assert str(err).startswith(f"env {copy}: {expected}"), str(err)
    assert err.restarted


@needs_torch
@pytest.mark.parametrize("bad", ["leaves_without_ending", "reset_ignores_where"])
def test_on_a_device_the_protocol_is_checked_with_check_finite(as_on_a_gpu, bad) -> None:
    # a device step reads nothing back (tests/vector/test_device_steps.py); check_finite reads
    # (as_on_a_gpu: the device path, on the CPU)
    err = _contract_error("sync", "torch", bad, check_finite=True)
    # on a device every step calls reset(where=done), none selected at first: copy 0 shows it
    assert err.env_index == 0, str(err)
    says = "neither terminated nor truncated" if bad == "leaves_without_ending" else "ignore where"
    assert says in str(err)


# -- the pieces ------------------------------------------------------------------------------


def test_finite_problem_names_nan_inf_and_overflow() -> None:
    assert finite_problem(np.zeros(3, np.float32), np.float32) is None
    assert finite_problem(np.array([0, np.inf]), np.float32) == (
        "finite values, got inf at index (1,)"
    )
    assert "got 1e+300, which overflows float32" in finite_problem(1e300, np.float32)
    assert finite_problem(1e300, np.float64) is None
    assert "overflows int8" in finite_problem([3, 300], np.int8)


@pytest.mark.parametrize(
    ("values", "dtype"),
    [
        (np.array([1.0, 1e300]), np.float32),  # inf
        (np.array([1, 300]), np.uint8),  # 44
        (np.array([1, -1]), np.uint32),  # 4294967295
        (np.array([1.0, np.nan]), np.int64),
        (np.array([1.0, 1e20]), np.int32),
    ],
)
def test_store_exactly_refuses_to_change_a_number(values, dtype) -> None:
    target = np.zeros(2, dtype)
    with pytest.raises(OverflowError):
        store_exactly(target, slice(None), values)
    assert target.tolist() == [0, 0]  # nothing of them stored
    store_exactly(target, slice(None), values[:1])  # what the dtype holds is stored
    assert target.tolist() == [1, 1]
    wide = np.zeros(2)
    store_exactly(wide, slice(None), np.array([np.inf, 2], np.float32))  # widening: as numpy
    assert wide.tolist() == [np.inf, 2]


@pytest.mark.parametrize(
    ("value", "on"), [("1", True), ("true", True), ("YES", True), ("0", False), ("", False)]
)
def test_debug_mode_reads_corral_debug(monkeypatch, value, on) -> None:
    monkeypatch.setenv("CORRAL_DEBUG", value)
    assert debug_mode() is on


def test_python_dev_mode_is_debug_mode() -> None:
    code = "from corral.returned_values import debug_mode; print(debug_mode())"
    env = {k: v for k, v in os.environ.items() if k != "CORRAL_DEBUG"}
    out = subprocess.run(
        [sys.executable, "-X", "dev", "-c", code], capture_output=True, text=True, env=env
    )
    assert out.stdout.strip() == "True", out.stderr


@pytest.mark.parametrize(
    ("values", "dtype"),
    [
        (np.array([1.0, 1e300, -1e300, np.nan]), np.float32),
        (np.array([1.5, 300.0, -1.0, np.nan]), np.uint8),
        (np.array([np.nan, 2.0]), np.int32),
        (np.array([3, 300, -129, 127], np.int64), np.int8),
        (np.array([0, 255], np.int64), np.uint8),
    ],
)
def test_overflow_flags_mark_what_store_exactly_refuses_on_numpy_and_torch(values, dtype):
    # the vector layer's check of a natively batched env's arrays (ReturnedArrays) and the
    # dict envs' store (store_exactly) judge each number alike, numpy or torch
    rows = np.zeros(len(values), dtype)
    refused = []
    for v in values:
        try:
            exactly_as(np.array([v], values.dtype), rows.dtype)
            refused.append(False)
        except OverflowError:
            refused.append(True)
    flags = overflow_flags(values, rows)
    got = np.zeros(len(values), bool) if flags is None else flags
    np.testing.assert_array_equal(got, refused)
    torch = pytest.importorskip("torch")
    on_torch = overflow_flags(torch.as_tensor(values), torch.as_tensor(rows))
    np.testing.assert_array_equal(
        np.zeros(len(values), bool) if on_torch is None else on_torch.numpy(), refused
    )


def test_nonfinite_cells_and_nonflag_flags_name_the_first_cell_per_copy():
    value = np.zeros((3, 2, 2))
    value[0, 1, 0] = np.nan
    value[2, 0, 1] = np.inf
    value[2, 1, 1] = np.nan
    assert nonfinite_cells(value) == {0: 1, 2: 0}
    assert nonfinite_cells(value, np.array([False, True, True])) == {2: 0}
    assert nonfinite_cells(np.zeros((3, 2), np.int64)) == {}
    np.testing.assert_array_equal(nonflag_flags(np.array([0, 1, 0.5, 2])), [0, 0, 1, 1])
    assert is_flag_array(np.zeros(2, bool)) and not is_flag_array(np.zeros(2, np.uint8))


def test_an_agent_asked_to_act_with_no_legal_action_is_named_as_the_env_s_fault() -> None:
    """An env whose acting agent's mask forbids everything (Nim with no sticks) made every
    action "illegal": the error blamed the action and did not say the mask was empty."""
    from corral.envs.mdp import MatrixGame

    class NothingLegal(MatrixGame):
        def reset(self, seed=None, options=None):
            obs, infos = super().reset(seed=seed, options=options)
            for agent in infos:
                infos[agent] = {"action_mask": np.zeros(self.action_space(agent).n, np.int8)}
            return obs, infos

    payoffs = np.zeros((2, 2, 2))
    with corral.VectorEnv([lambda: NothingLegal([payoffs[0], payoffs[1]])] * 2, seed=0) as venv:
        batch = venv.reset(seed=0)
        actions = {g: np.zeros(a.shape, np.int64) for g, a in batch.acting.items()}
        with pytest.raises(InvalidActionError, match=r"env 0, agent .* forbids every action"):
            venv.step(actions)
