"""SuperSuit's wrappers and vector envs on corral.to_pettingzoo exports (mpe2 and corral/tag)."""

from __future__ import annotations

import importlib
from typing import Any

import numpy as np
import pytest

import corral

pytest.importorskip("pettingzoo")
pytest.importorskip("mpe2")
ss = pytest.importorskip("supersuit")

NUM_VEC_ENVS = 2


def vectorise(env: Any) -> Any:
    """SuperSuit's route to a Gymnasium vector env: one slot per agent, then copies."""
    venv = ss.pettingzoo_env_to_vec_env_v1(env)
    return ss.concat_vec_envs_v1(venv, NUM_VEC_ENVS, num_cpus=0, base_class="gymnasium")


def padded(env: Any) -> Any:
    """Different spaces padded to one, and agents that died fed zeros (black death)."""
    return ss.black_death_v3(ss.pad_action_space_v0(ss.pad_observations_v0(env)))


def test_simple_spread_vectorised_keeps_the_final_observations() -> None:
    max_cycles = 5
    venv = vectorise(corral.to_pettingzoo("mpe2/simple_spread_v3", max_cycles=max_cycles))
    n = NUM_VEC_ENVS * 3
    assert venv.num_envs == n and venv.observation_space.shape == (18,)
    obs, infos = venv.reset(seed=0)
    assert obs.shape == (n, 18) and len(infos) == n
    rng = np.random.default_rng(0)
    for episode in range(2):
        for step in range(max_cycles):
            obs, rewards, terms, truncs, infos = venv.step(rng.integers(5, size=n))
            assert obs.shape == (n, 18) and rewards.shape == (n,)
            last = step == max_cycles - 1
            assert truncs.tolist() == [last] * n and not terms.any()
        # SuperSuit finds each agent's last observation in obs and hands it on in infos;
        # obs already holds the first observation of the next episode.
        finals = np.stack([info["terminal_observation"] for info in infos])
        assert finals.shape == (n, 18) and not np.array_equal(finals, obs), episode


def test_padded_mpe2_simple_tag_runs_and_resets() -> None:
    max_cycles = 4
    export = corral.to_pettingzoo("mpe2/simple_tag_v3", max_cycles=max_cycles)
    raw = importlib.import_module("mpe2.simple_tag_v3").parallel_env()
    sizes = {raw.observation_space(a).shape[0] for a in raw.possible_agents}
    assert sizes == {14, 16}  # the adversaries' and the good agent's observations differ
    venv = vectorise(padded(export))
    n = NUM_VEC_ENVS * 4
    assert venv.observation_space.shape == (16,)
    obs, _ = venv.reset(seed=0)
    assert obs.shape == (n, 16)
    # the three adversaries' observations are padded with zeros to the good agent's size
    assert np.all(obs.reshape(NUM_VEC_ENVS, 4, 16)[:, :3, 14:] == 0)
    rng = np.random.default_rng(0)
    done_at = []
    for step in range(3 * (max_cycles + 1)):
        obs, rewards, terms, truncs, _ = venv.step(rng.integers(5, size=n))
        assert obs.shape == (n, 16) and rewards.shape == (n,)
        if (terms | truncs).all():
            done_at.append(step)
    # Black death reports the end one step after the last one (SuperSuit's own behaviour:
    # it waits for a step with no agent left), then every copy resets.
    assert done_at == [max_cycles, 2 * max_cycles + 1, 3 * max_cycles + 2]


def test_padded_corral_tag_feeds_zeros_to_caught_prey() -> None:
    max_cycles = 12
    export = corral.to_pettingzoo("corral/tag", size=4, walls=[], max_cycles=max_cycles)
    venv = vectorise(padded(export))
    n_agents = 4  # two predators, two prey
    n = NUM_VEC_ENVS * n_agents
    assert venv.observation_space.shape == (10,)  # predators see 8 values, prey 10
    assert venv.action_space.n == 9  # predators' 5 moves padded to the prey's 9
    obs, infos = venv.reset(seed=3)
    rng = np.random.default_rng(3)
    caught: set[int] = set()  # the vector slots of the prey caught in their copy's episode
    catches = resets = 0
    for _ in range(3 * (max_cycles + 1)):
        # Legal random actions: each live agent's mask is in its info (a predator's extra
        # actions mean "stay"); black death drops the action of a caught prey.
        actions = [
            int(rng.choice(np.flatnonzero(info["action_mask"]))) if "action_mask" in info else 0
            for info in infos
        ]
        obs, rewards, terms, truncs, infos = venv.step(np.array(actions))
        assert obs.shape == (n, 10)
        ended = (terms | truncs).reshape(NUM_VEC_ENVS, n_agents)
        assert np.all(ended.all(axis=1) == ended.any(axis=1))  # a copy ends for all its agents
        for copy in np.flatnonzero(ended.all(axis=1)):
            resets += 1
            slots = range(copy * n_agents, (copy + 1) * n_agents)
            caught -= set(slots)
            assert all(np.any(obs[slot] != 0) for slot in slots)  # every agent is back
        for slot in range(n):
            if ended.all(axis=1)[slot // n_agents]:
                continue
            if slot in caught:
                assert np.all(obs[slot] == 0) and rewards[slot] == 0.0
            elif rewards[slot] == -1.0:  # a prey caught in this step sees its last observation
                assert slot % n_agents >= 2 and np.any(obs[slot] != 0)
                caught.add(slot)
                catches += 1
    assert catches > 0 and resets >= 3
