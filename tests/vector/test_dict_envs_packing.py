"""What packed dict envs keep between calls: end flags and masks cleared only after they were
set, an episode cut where it stood when agents joined in the failed step, and the
``same_alive`` promise of a step."""

from __future__ import annotations

import numpy as np
import pytest
from gymnasium import spaces

import corral
from corral.errors import EnvError, EnvRestartWarning
from corral.vector import VectorEnv
from corral.vector.dict_envs import DictEnvs


class ScriptEnv(corral.MultiAgentEnv):
    """Agents ``agent_0`` (a) and ``agent_1`` (b), with three discrete actions and
    observations ``[t, 0]``; b joins at step ``join_at`` (else it plays from the reset)
    and terminates at step ``end_b_at``; at step ``mask_at`` a's info holds an action mask
    forbidding action 1; at step ``bad_at`` a's observation has the wrong shape; at step
    ``raise_at`` the step raises. Steps are counted from the reset (1 is the first)."""

    possible_agents = ["agent_0", "agent_1"]

    def __init__(self) -> None:
        self.join_at = self.end_b_at = self.mask_at = self.bad_at = self.raise_at = 0
        self.agents: list[str] = []
        self.t = 0

    def observation_space(self, agent: str) -> spaces.Box:
        return spaces.Box(-np.inf, np.inf, (2,), np.float32)

    def action_space(self, agent: str) -> spaces.Discrete:
        return spaces.Discrete(3)

    def reset(self, seed=None, options=None):
        self.t = 0
        self.agents = ["agent_0"] if self.join_at else ["agent_0", "agent_1"]
        return {a: self._obs() for a in self.agents}, {a: {} for a in self.agents}

    def step(self, actions):
        self.t += 1
        if self.t == self.raise_at:
            raise RuntimeError("the env broke")
        before = list(self.agents)
        if self.t == self.join_at:
            self.agents = ["agent_0", "agent_1"]
        ended = ["agent_1"] if self.t == self.end_b_at and "agent_1" in before else []
        self.agents = [a for a in self.agents if a not in ended]
        obs = {a: self._obs() for a in self.agents}
        if self.t == self.bad_at:
            obs["agent_0"] = np.zeros(5, np.float32)
        infos: dict = {a: {} for a in self.agents}
        if self.t == self.mask_at:
            infos["agent_0"]["action_mask"] = np.array([1, 0, 1], np.int8)
        for a in ended:
            infos[a] = {"final_obs": self._obs()}
        rewards = {a: 1.0 for a in before}
        terms = {a: a in ended for a in before}
        return obs, rewards, terms, dict.fromkeys(before, False), infos

    def _obs(self) -> np.ndarray:
        return np.array([self.t, 0.0], np.float32)


def _venv(num_envs: int = 1, **attrs) -> VectorEnv:
    venv = VectorEnv([ScriptEnv] * num_envs, copy=False, on_env_error="restart")
    for name, value in attrs.items():
        venv.set_attr(name, [value] * num_envs)
    return venv


ZEROS = {"agent": np.zeros((1, 2), np.int64)}


def test_end_flags_and_masks_hold_for_one_step() -> None:
    venv = _venv(end_b_at=2, mask_at=1)
    venv.reset(seed=0)
    batch = venv.step(ZEROS)
    assert batch.action_mask["agent"][0].tolist() == [[True, False, True], [True, True, True]]
    assert batch.terminated["agent"][0].tolist() == [False, False]
    batch = venv.step(ZEROS)
    assert batch.action_mask["agent"][0].tolist() == [[True, True, True]] * 2
    assert batch.terminated["agent"][0].tolist() == [False, True]
    batch = venv.step(ZEROS)
    assert batch.terminated["agent"][0].tolist() == [False, False]
    assert batch.alive["agent"][0].tolist() == [True, False]
    venv.close()


def test_a_failed_env_s_truncation_holds_for_one_step() -> None:
    venv = _venv(raise_at=1)
    venv.reset(seed=0)
    with pytest.warns(EnvRestartWarning):
        batch = venv.step(ZEROS)
    assert batch.truncated["agent"][0].tolist() == [True, True]
    assert batch.done.tolist() == [True]
    venv.set_attr("raise_at", [0])  # the rebuilt env was given raise_at=1 again
    batch = venv.step(ZEROS)  # the rebuilt env's first step
    assert batch.truncated["agent"][0].tolist() == [False, False]
    assert batch.done.tolist() == [False]
    venv.close()


def test_agents_that_joined_in_a_step_with_a_bad_value_were_not_in_the_cut_episode() -> None:
    # Env 1's step 1 lets b join and returns a bad observation: the step did not happen,
    # so its episode is cut as it stood before it, with a alone.
    venv = VectorEnv([ScriptEnv] * 2, copy=False)
    venv.set_attr("join_at", [1, 1])
    venv.set_attr("bad_at", [0, 1])
    batch = venv.reset(seed=0)
    assert batch.alive["agent"].tolist() == [[True, False]] * 2
    with pytest.raises(EnvError, match="env 1: observation of agent 'agent_0'") as info:
        venv.step({"agent": np.zeros((2, 2), np.int64)})
    batch = info.value.batch
    assert batch.truncated["agent"].tolist() == [[False, False], [True, False]]
    assert batch.done.tolist() == [False, True]
    # env 0's b joined; env 1 rebuilt, given join_at=1 again: a alone from its reset
    assert batch.alive["agent"].tolist() == [[True, True], [True, False]]
    assert batch.episode_length.tolist() == [0, 0]  # no episode ended; the cut one never stepped
    venv.close()


def test_a_step_says_whether_every_alive_agent_stayed_alive() -> None:
    envs = DictEnvs([ScriptEnv, ScriptEnv])
    envs.envs[1].end_b_at = 2
    envs.envs[0].join_at = 3
    assert not envs.reset(seed=[0, 1]).same_alive  # a reset promises nothing
    actions = {"agent": np.zeros((2, 2), np.int64)}
    assert envs.step(actions).same_alive  # step 1: nothing changed
    assert not envs.step(actions).same_alive  # step 2: env 1's b terminated
    assert not envs.step(actions).same_alive  # step 3: env 0's b joined
    assert envs.step(actions).same_alive
    envs.envs[0].raise_at = 5
    assert not envs.step(actions).same_alive  # step 5: env 0 failed and was cut
    envs.close()
