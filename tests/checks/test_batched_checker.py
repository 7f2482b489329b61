"""The checker of batched envs: a correct env passes, and each broken env fails with its rule.

``Squad`` is a small correct batched env with two groups, an agent that dies, a turn-taking
agent, masks, a state, and episodes of two lengths; ``SquadDict`` is the dict env it
implements. Each broken env below is a subclass that breaks one rule at a known step, so the
tests can assert the message names the rule, the call, the copy and the agent.
"""

from __future__ import annotations

import importlib.util
import re
import sys
from collections.abc import Mapping
from typing import Any

import numpy as np
import pytest
from gymnasium import spaces
from support.paths import ROOT

import corral
from corral import cli
from corral.batched_env import BatchedEnv, BatchedStep, CopyGenerators, copy_seeds, selected
from corral.checks import MAX_REPEATS, BatchedCheckReport, check_batched_env, check_env
from corral.checks.batched_checker import _stack
from corral.env import MultiAgentEnv, validate_actions
from corral.errors import CheckIncompleteWarning, EnvContractError
from corral.vector.layout import array_tree

P, Q = ["p_0", "p_1", "p_2"], ["q_0"]
OBS_P = spaces.Box(0, 1, (2,), np.float32)
OBS_Q = spaces.Discrete(7)
ACT_P = spaces.Discrete(3)
ACT_Q = spaces.Box(-1, 1, (1,), np.float32)
STATE = spaces.Box(0, 10, (1,), np.float32)


def episode_length(offset: float) -> int:
    return 4 if offset < 0.5 else 6


class SquadDict(MultiAgentEnv):
    """Scouts ``p_0..2`` act at every step (action 2 is illegal at odd steps) and earn half
    their action; ``p_2`` terminates in the episode's step 2. The radio ``q_0`` acts at even
    steps and earns its action. All that live are truncated after 4 steps if the offset drawn
    at reset is below 0.5, else after 6. A scout sees ``[offset, t / 10]``, the radio ``t``."""

    possible_agents = P + Q
    state_space = STATE
    max_episode_steps = 6

    def __init__(self) -> None:
        self.agents = []
        self._rng: np.random.Generator | None = None

    def observation_space(self, agent: str) -> spaces.Space:
        return OBS_P if agent in P else OBS_Q

    def action_space(self, agent: str) -> spaces.Space:
        return ACT_P if agent in P else ACT_Q

    def state(self) -> np.ndarray:
        return np.array([self._t], np.float32)

    def reset(self, seed: int | None = None, options: dict | None = None) -> tuple[dict, dict]:
        if seed is not None or self._rng is None:
            self._rng = np.random.default_rng(seed)
        self._offset = self._rng.random(dtype=np.float32)
        self._t = 0
        self.agents = P + Q
        return self._observe({})

    def step(self, actions: Mapping[str, Any]) -> tuple[dict, dict, dict, dict, dict]:
        acting = self._acting()
        validate_actions(actions, acting, self.action_space, self._masks(acting), self._t)
        alive = list(self.agents)
        rewards = {a: 0.5 * int(actions[a]) if a in P else 0.0 for a in alive}
        if "q_0" in actions:
            rewards["q_0"] = float(actions["q_0"][0])
        self._t += 1
        over = self._t == episode_length(self._offset)
        terms = {a: a == "p_2" and self._t == 3 for a in alive}
        truncs = {a: over and not terms[a] for a in alive}
        ended = [a for a in alive if terms[a] or truncs[a]]
        infos = {a: {"final_obs": self._obs(a)} for a in ended}
        self.agents = [a for a in alive if a not in ended]
        obs, infos = self._observe(infos)
        return obs, rewards, terms, truncs, infos

    def _acting(self) -> list[str]:
        return [a for a in self.agents if a in P or self._t % 2 == 0]

    def _obs(self, agent: str) -> Any:
        if agent in P:
            return np.array([self._offset, self._t / 10], np.float32)
        return self._t

    def _masks(self, acting: list[str]) -> dict[str, np.ndarray]:
        legal = np.array([1, 1, self._t % 2 == 0], np.int8)
        return {a: legal for a in acting if a in P}

    def _observe(self, infos: dict) -> tuple[dict, dict]:
        acting = self._acting()
        for agent in acting:
            infos[agent] = {}
        for agent, mask in self._masks(acting).items():
            infos[agent]["action_mask"] = mask
        return {a: self._obs(a) for a in acting}, infos


class Squad(BatchedEnv):
    """``num_envs`` copies of :class:`SquadDict`, in numpy."""

    possible_agents = P + Q
    state_space = STATE
    max_episode_steps = 6

    def __init__(self, num_envs: int = 4) -> None:
        E = self.num_envs = num_envs
        self._generators = CopyGenerators(num_envs)
        self.t = np.zeros(E, np.int64)
        self.offset = np.zeros(E, np.float32)
        self.alive_p, self.alive_q = np.zeros((E, 3), bool), np.zeros((E, 1), bool)
        self.obs_p, self.obs_q = np.zeros((E, 3, 2), np.float32), np.zeros((E, 1), np.int64)
        self.steps_since_seed = 0

    def observation_space(self, agent: str) -> spaces.Space:
        return OBS_P if agent in P else OBS_Q

    def action_space(self, agent: str) -> spaces.Space:
        return ACT_P if agent in P else ACT_Q

    def reset(self, seed=None, where=None, options=None) -> BatchedStep:
        if isinstance(seed, int):
            self.steps_since_seed = 0
        copies = selected(where, self.num_envs)
        generators = self._generators.at_reset(copy_seeds(seed, self.num_envs), copies)
        for i, rng in zip(copies, generators, strict=True):
            self.offset[i] = rng.random(dtype=np.float32)
        self.t[copies] = 0
        self.alive_p[copies] = True
        self.alive_q[copies] = True
        chosen = np.zeros(self.num_envs, bool)
        chosen[copies] = True
        return self.observe(chosen[:, None], chosen[:, None])

    def step(self, actions: dict[str, Any]) -> BatchedStep:
        a_p, a_q = np.asarray(actions["p"]), np.asarray(actions["q"])
        running = self.alive_p.any(1) | self.alive_q.any(1)
        radio = self.acting_q()
        reward_p = np.where(self.alive_p, 0.5 * a_p, 0.0)
        reward_q = np.where(radio, a_q[:, :, 0].astype(np.float64), 0.0)
        self.t = self.t + running
        over = running & (self.t == np.where(self.offset < 0.5, 4, 6))
        term_p = np.zeros_like(self.alive_p)
        term_p[:, 2] = self.alive_p[:, 2] & (self.t == 3)
        trunc_p = self.alive_p & ~term_p & over[:, None]
        trunc_q = self.alive_q & over[:, None]
        self.alive_p = self.alive_p & ~(term_p | trunc_p)
        self.alive_q = self.alive_q & ~trunc_q
        batch = self.observe(term_p | trunc_p, trunc_q)
        batch.reward = {"p": reward_p, "q": reward_q}
        batch.terminated = {"p": term_p, "q": np.zeros_like(trunc_q)}
        batch.truncated = {"p": trunc_p, "q": trunc_q}
        batch = self.corrupt_at(self.steps_since_seed, batch)
        self.steps_since_seed += 1
        return batch

    def acting_q(self) -> np.ndarray:
        return self.alive_q & (self.t % 2 == 0)[:, None]

    def observe(self, ended_p: np.ndarray, ended_q: np.ndarray) -> BatchedStep:
        acting_q = self.acting_q()
        seen_p, seen_q = self.alive_p | ended_p, acting_q | ended_q
        now = np.stack([np.broadcast_to(self.offset, self.t.shape), self.t / 10], -1)
        self.obs_p = np.where(seen_p[:, :, None], now[:, None, :], self.obs_p).astype(np.float32)
        self.obs_q = np.where(seen_q, self.t[:, None], self.obs_q)
        legal = np.ones((self.num_envs, 3, 3), bool)
        legal[:, :, 2] = (self.t % 2 == 0)[:, None] | ~self.alive_p
        return BatchedStep(
            obs={"p": self.obs_p.copy(), "q": self.obs_q.copy()},
            alive={"p": self.alive_p.copy(), "q": self.alive_q.copy()},
            acting={"p": self.alive_p.copy(), "q": acting_q},
            action_mask={"p": legal},
            state=self.t[:, None].astype(np.float32),
        )

    def corrupt_at(self, step: int, batch: BatchedStep) -> BatchedStep:
        """A hook for broken variants: ``step`` counts the steps since the last seeded reset."""
        return batch


def violations(env: Any, **kwargs: Any) -> list[str]:
    report = check_env(env, raise_on_error=False, **kwargs)
    assert isinstance(report, BatchedCheckReport)
    return report.violations


def the_violation(env: Any, **kwargs: Any) -> str:
    found = violations(env, **kwargs)
    assert len(found) == 1, found
    return found[0]


def test_correct_env_passes_and_matches_its_dict_env() -> None:
    report = check_env(Squad(), dict_env=SquadDict)
    assert report.ok, report.violations
    assert report.complete and report.compared
    assert (report.steps, report.episodes) == (13, 8)  # each copy ended two episodes
    assert str(report).startswith("Squad (batched: 4 copies, numpy, compared with its dict env")
    assert str(report).endswith(": ok, no contract violation found")


class Broken(Squad):
    """Squad whose step ``n`` (since the seeded reset) is changed by ``corrupt``.

    Copy 1 (seed 1) plays 4-step episodes: it ends in step 3, idles in step 4 and restarts
    before step 5. Copies 0, 2 and 3 play 6-step episodes. ``p_2`` dies in step 2.
    """

    n = 1

    def corrupt_at(self, step: int, batch: BatchedStep) -> BatchedStep:
        return self.corrupt(batch) if step == self.n else batch

    def corrupt(self, batch: BatchedStep) -> BatchedStep:
        raise NotImplementedError


def broken(n: int, change: Any) -> type:
    """A :class:`Broken` Squad whose step ``n`` returns the batch ``change`` edited."""

    def corrupt(self: Broken, batch: BatchedStep) -> BatchedStep:
        change(batch)
        return batch

    return type("BrokenSquad", (Broken,), {"n": n, "corrupt": corrupt})


def put(array: np.ndarray, index: tuple, value: Any) -> None:
    array[index] = value


class ReturnsATuple(Broken):
    def corrupt(self, batch):
        return (batch.obs, batch.reward)


class InfObs(Broken):
    def __init__(self) -> None:
        super().__init__()
        self.unbounded = spaces.Box(-np.inf, np.inf, (2,), np.float32)

    def observation_space(self, agent):
        return self.unbounded if agent in P else OBS_Q

    def corrupt(self, batch):
        batch.obs["p"][2, 0, 1] = np.inf
        return batch


class InfState(Broken):
    state_space = spaces.Box(-np.inf, np.inf, (1,), np.float32)

    def corrupt(self, batch):
        batch.state[2, 0] = np.inf
        return batch


class Autoreset(Squad):
    """Restarts an ended copy inside step, as a single-env wrapper would."""

    def step(self, actions):
        batch = super().step(actions)
        over = ~(self.alive_p.any(1) | self.alive_q.any(1))
        if over.any():
            fresh = self.reset(where=over)
            batch.alive = fresh.alive
            batch.acting = fresh.acting
        return batch


class Revives(Broken):
    n = 4

    def corrupt(self, batch):
        batch.alive["p"][2, 2] = True
        batch.acting["p"][2, 2] = True
        return batch


class Nondeterministic(Squad):
    def reset(self, seed=None, where=None, options=None):
        batch = super().reset(seed, where, options)
        self.offset[:] = np.random.default_rng().random(self.num_envs, dtype=np.float32) / 2
        return batch


class ResetsEveryCopy(Squad):
    def reset(self, seed=None, where=None, options=None):
        return super().reset(seed, None, options)


class ResetTouchesOtherCopies(Squad):
    """Its reset(where=...) returns the copies it does not select with another observation."""

    def reset(self, seed=None, where=None, options=None):
        batch = super().reset(seed, where, options)
        if where is not None:
            batch.obs["q"][~np.asarray(where)] += 1
        return batch


class RestartsOnlyEndedCopies(Squad):
    def reset(self, seed=None, where=None, options=None):
        if where is not None:
            where = where & ~(self.alive_p.any(1) | self.alive_q.any(1))
        return super().reset(seed, where, options)


class ResetStartsNothing(Squad):
    def reset(self, seed=None, where=None, options=None):
        batch = super().reset(seed, where, options)
        if where is not None:
            for flags in (batch.alive, batch.acting):
                flags["p"][where], flags["q"][where] = False, False
        return batch


class NoAgents(Squad):
    possible_agents = []


class ReadsIdleActions(Squad):
    """The radio's reward is its action's at every step, acting or not."""

    def step(self, actions):
        batch = super().step(actions)
        earned = np.asarray(actions["q"])[:, :, 0].astype(np.float64)
        batch.reward["q"] = np.where(batch.alive["q"] | batch.truncated["q"], earned, 0.0)
        return batch


class SeedsEveryCopyAlike(Squad):
    def reset(self, seed=None, where=None, options=None):
        alike = [seed] * self.num_envs if isinstance(seed, int) else seed
        return super().reset(alike, where, options)


class NoCopies(Squad):
    def __init__(self) -> None:
        super().__init__()
        self.num_envs = 0


class NotAPlace(Squad):
    place = "numpy"


class GroupsMissAnAgent(Squad):
    groups = {"p": ("p_0", "p_1", "p_2")}


class GroupMixesSpaces(Squad):
    groups = {"all": ("p_0", "p_1", "p_2", "q_0")}


class TextObservations(Squad):
    def observation_space(self, agent):
        return spaces.Text(5) if agent == "q_0" else OBS_P


class Overlong(Squad):
    max_episode_steps = 5


class Crashes(Broken):
    n = 3

    def corrupt(self, batch):
        raise RuntimeError("boom")


BROKEN = [
    (ReturnsATuple, "step 1: env.step must return a corral.BatchedStep, got tuple"),
    (
        broken(1, lambda b: b.obs.pop("q")),
        "step 1: obs has no array for group(s) ['q']; it holds one per group",
    ),
    (
        broken(1, lambda b: put(b.reward, "p", b.reward["p"][:, :2])),
        "step 1: reward['p'] must be an array of shape (4, 3) ([copies, agents of the group, "
        "...]), got array of shape (4, 2)",
    ),
    (
        broken(1, lambda b: put(b.reward, "p", b.reward["p"].astype(np.float32))),
        "step 1: reward['p'] must have dtype float64, got array of shape (4, 3) and dtype float32",
    ),
    (
        broken(1, lambda b: put(b.obs, "q", b.obs["q"].tolist())),
        "step 1: obs['q'] must be an array of shape (4, 1) ([copies, agents of the group, ...]), "
        "got list",
    ),
    (
        broken(1, lambda b: put(b.action_mask, "q", np.ones((4, 1, 1), bool))),
        "step 1: action_mask holds group 'q', which has the action space Box(-1.0, 1.0, (1,), "
        "float32); only groups with a Discrete action space have masks",
    ),
    (
        broken(1, lambda b: setattr(b, "state", None)),
        "step 1: state is None, but env.state_space is Box(0.0, 10.0, (1,), float32)",
    ),
    (
        broken(3, lambda b: put(b.acting["p"], (2, 2), True)),
        "step 3, copy 2: agent 'p_2' (group 'p') is acting but not alive; acting implies alive",
    ),
    (
        broken(1, lambda b: (put(b.acting["p"], 2, False), put(b.acting["q"], 2, False))),
        "step 1, copy 2: agents are alive but none is acting; a copy whose episode goes on must "
        "ask at least one agent to act",
    ),
    (
        broken(1, lambda b: put(b.obs["p"], (2, 1, 0), 1.5)),
        "step 1, copy 2: observation of agent 'p_1' (group 'p') is not in its observation space "
        "Box(0.0, 1.0, (2,), float32): got array of shape (2,) and dtype float32 with values in "
        "[0.20000000298023224, 1.5]",
    ),
    (
        broken(2, lambda b: put(b.obs["p"], (2, 2, 1), -1.0)),
        "step 2, copy 2: final observation of agent 'p_2' (group 'p') is not in its observation "
        "space",
    ),
    (
        InfObs,
        "step 1, copy 2: observation of agent 'p_0' (group 'p'): expected finite values, got inf "
        "at index (1,)",
    ),
    (
        broken(1, lambda b: put(b.action_mask["p"], (2, 0), False)),
        "step 1, copy 2: action_mask of agent 'p_0' (group 'p') is all False; an acting agent "
        "must have at least one legal action",
    ),
    (
        broken(3, lambda b: put(b.action_mask["p"], (2, 2, 2), False)),
        "step 3, copy 2: action_mask of agent 'p_2' (group 'p') forbids actions [2], but the "
        "agent is not acting; the mask rows of agents that are not acting are all True",
    ),
    (
        broken(1, lambda b: put(b.state, 2, 20.0)),
        "step 1, copy 2: state is not in env.state_space Box(0.0, 10.0, (1,), float32): got "
        "array of shape (1,) and dtype float32 with values in [20.0, 20.0]",
    ),
    (InfState, "step 1, copy 2: state: expected finite values, got inf at index (0,)"),
    (
        broken(1, lambda b: put(b.reward["p"], (2, 0), np.nan)),
        "step 1, copy 2: reward of agent 'p_0' (group 'p') is nan; rewards must be finite",
    ),
    (
        Autoreset,
        "step 4, copy 1: agents ['p_0', 'p_1', 'p_2', 'q_0'] are alive again, but the copy's "
        "episode ended at step 3 and reset(where=...) did not select it; an env never resets a "
        "copy by itself (no autoreset)",
    ),
    (Revives, "step 4, copy 2: agent 'p_2' (group 'p') was revived after its episode ended at "),
    (
        broken(3, lambda b: put(b.reward["p"], (2, 2), 0.5)),
        "step 3, copy 2: reward of agent 'p_2' (group 'p') is 0.5, but the agent was not alive "
        "when the step began (its episode ended at step 2); an agent that is not alive earns 0",
    ),
    (
        broken(4, lambda b: put(b.truncated["q"], (1, 0), True)),
        "step 4, copy 1: truncated of agent 'q_0' (group 'q') is True, but the agent was not "
        "alive when the step began (its episode ended at step 3)",
    ),
    (
        broken(2, lambda b: put(b.alive["p"], (2, 2), True)),
        "step 2, copy 2: agent 'p_2' (group 'p') ended (terminated or truncated) but is still "
        "alive; an agent whose episode ends in a step is not alive after it",
    ),
    (
        broken(2, lambda b: put(b.terminated["p"], (2, 2), False)),
        "step 2, copy 2: agent 'p_2' (group 'p') was alive when the step began and is not alive "
        "after it, but neither terminated nor truncated is set",
    ),
    (
        Overlong,
        "step 4, copy 0: the episode goes on after 5 steps, but env.max_episode_steps is 5",
    ),
    (Nondeterministic, "step 0, copy 0: obs of agent 'p_0' ("),
    (
        ResetsEveryCopy,
        "differs from a run that did not restart copy 0 alone with reset(where=...) before step "
        "1; reset(where=mask) must start new episodes only in the selected copies",
    ),
    (
        RestartsOnlyEndedCopies,
        "reset(seed=[...], where=...) of a running copy before step 1, copy 0: acting of agent "
        "'q_0' (False vs True) differs from the copy's first reset(seed=0); a copy that "
        "reset(seed=[...], where=mask) selects with the seed 0 must start the episode",
    ),
    (
        ReadsIdleActions,
        "step 1, copy 0: reward of agent 'q_0' (-0.8174502849578857 vs 0.21233685314655304) "
        "differs from a run whose actions differ only in the entries of agents that are not "
        "acting; step must ignore those entries",
    ),
    (
        ResetStartsNothing,
        "reset(where=...) before step 5, copy 1: no agent is alive after the reset; reset must "
        "start an episode in every copy it selects",
    ),
    (NoAgents, "env.possible_agents must be a non-empty list of agent ids, got []"),
    (NoCopies, "env.num_envs must be a positive int (the number of copies), got int 0"),
    (NotAPlace, "env.place must be a corral.Place (Place('numpy') or Place('torch', device))"),
    (
        GroupsMissAnAgent,
        "env.groups lists agent 'q_0' 0 times; each of possible_agents is in exactly one group",
    ),
    (GroupMixesSpaces, "env.groups puts 'p_0' and 'q_0' in group 'all', but their"),
    (TextObservations, "env.observation_space('q_0') is Text(1, 5, charset="),
    (Crashes, "step 3: env.step raised RuntimeError: boom"),
    (
        ResetTouchesOtherCopies,
        "reset(where=...) before step 5, copy 0: reset(where=...) did not select the copy but "
        "changed the observation or alive flag of agent 'q_0' (group 'q')",
    ),
    (
        broken(3, lambda b: put(b.obs["p"], (0, 2), 9.0)),  # p_2 died in step 2
        "step 3, copy 0: the observation of agent 'p_2' (group 'p') changed, but it neither "
        "acts next nor ended in the step",
    ),
    (
        broken(2, lambda b: setattr(b, "same_alive", True)),  # p_2 dies in step 2
        "step 2, copy 0: the step says same_alive=True, but alive of agent 'p_2' (group 'p') "
        "went from True to False; same_alive promises that no agent ended or joined",
    ),
]


@pytest.mark.parametrize(
    ("env_cls", "expected"),
    BROKEN,
    ids=[f"{i}-{cls.__name__}" for i, (cls, _) in enumerate(BROKEN)],
)
def test_broken_env_fails_with_its_rule(env_cls: type, expected: str) -> None:
    found = violations(env_cls())
    assert any(expected in message for message in found), found


def test_the_dict_env_rule_names_the_copy_and_its_seed() -> None:
    found = violations(SeedsEveryCopyAlike(), dict_env=SquadDict)
    assert [m.split(":")[0] for m in found] == ["reset, copy 1", "reset, copy 2", "reset, copy 3"]
    assert found[0].startswith(
        "reset, copy 1: obs of agent 'p_0' is [0.8506242036819458, 0.0], but the dict env "
        "(seeded 1) gives [0.4731886386871338, 0.0]; copy i of reset(seed=s) must equal the dict "
        "env reset with seed s + i"
    ), found


def test_the_dict_env_rule_follows_the_copies_over_later_episodes() -> None:
    class SecondEpisodeDiffers(Squad):
        def reset(self, seed=None, where=None, options=None):
            batch = super().reset(seed, where, options)
            if seed is None:
                self.offset[selected(where, self.num_envs)] = 0.25
            return batch

    found = violations(SecondEpisodeDiffers(), dict_env=SquadDict)
    assert found[0].startswith("step 7, copy 0: obs of agent 'p_0' is [0.25, 0.1"), found
    assert found[1].startswith(
        "step 5, copy 1: obs of agent 'p_0' is [0.25, 0.10000000149011612], but the dict env "
        "(seeded 1) gives ["
    ), found


def test_the_dict_env_is_not_compared_without_it() -> None:
    report = check_env(SeedsEveryCopyAlike())
    assert report.ok and not report.compared


# The broken variants above each break one rule; a test that the others stay quiet.
def test_a_broken_env_reports_only_its_own_rule() -> None:
    message = the_violation(broken(1, lambda b: put(b.reward["p"], (2, 0), np.nan))())
    assert message.startswith("step 1, copy 2: reward of agent 'p_0'")
    message = the_violation(broken(3, lambda b: put(b.reward["p"], (2, 2), 0.5))())
    assert message.startswith("step 3, copy 2: reward of agent 'p_2' (group 'p') is 0.5")


def test_repeats_of_one_rule_are_capped() -> None:
    class AlwaysNaN(Squad):
        def step(self, actions):
            batch = super().step(actions)
            batch.reward["p"] = np.full_like(batch.reward["p"], np.nan)
            return batch

    found = violations(AlwaysNaN())
    assert len([m for m in found if "rewards must be finite" in m]) == MAX_REPEATS
    assert found[-1].startswith("... and ") and "rewards_are_finite" in found[-1]


class Handover(Squad):
    """The radio joins in the episode's step 1, as all three scouts leave (truncated), and
    then acts at every step."""

    def acting_q(self) -> np.ndarray:
        return self.alive_q.copy()

    def reset(self, seed=None, where=None, options=None):
        batch = super().reset(seed, where, options)
        rows = selected(where, self.num_envs)
        self.alive_q[rows] = False
        batch.alive["q"][rows] = batch.acting["q"][rows] = False
        return batch

    def step(self, actions):
        joining = self.alive_p.any(1) & (self.t == 1)
        batch = super().step(actions)
        self.alive_p[joining] = batch.alive["p"][joining] = batch.acting["p"][joining] = False
        batch.truncated["p"][joining] = True
        self.alive_q[joining] = batch.alive["q"][joining] = batch.acting["q"][joining] = True
        self.obs_q[joining] = batch.obs["q"][joining] = self.t[joining, None]
        return batch


def test_an_agent_may_join_as_the_others_end() -> None:
    report = check_env(Handover())
    assert report.ok and report.episodes == 8, report


def test_env_that_never_ends_is_reported_incomplete() -> None:
    class Endless(Squad):
        max_episode_steps = None

        def step(self, actions):
            batch = super().step(actions)
            self.t = np.minimum(self.t, 1)  # never reaches an end
            return batch

    with pytest.warns(CheckIncompleteWarning, match="no copy's episode ended within 30 steps"):
        report = check_env(Endless(), max_steps=20, step_cap=30)
    assert report.ok and not report.complete and report.steps == 30


def test_raise_on_error_raises_with_every_violation() -> None:
    with pytest.raises(EnvContractError, match="reward of agent 'p_0' \\(group 'p'\\) is nan"):
        check_env(broken(1, lambda b: put(b.reward["p"], (2, 0), np.nan))())


def test_an_id_registered_only_batched_is_checked_batched(isolated_registry: None) -> None:
    corral.register("test/squad", batched=lambda num_envs, array, device: Squad(num_envs))
    report = check_env("test/squad")
    assert isinstance(report, BatchedCheckReport) and report.num_envs == 4 and report.ok


def test_an_id_with_both_is_compared_with_its_dict_env(isolated_registry: None) -> None:
    corral.register(
        "test/squad", SquadDict, batched=lambda num_envs, array, device: Squad(num_envs)
    )
    report = check_batched_env("test/squad", num_envs=3)
    assert report.ok and report.compared and report.num_envs == 3
    assert isinstance(check_env("test/squad"), corral.checks.CheckReport)  # the dict env


def load_example() -> Any:
    spec = importlib.util.spec_from_file_location(
        "batched_env_example", ROOT / "examples/batched_env.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize(
    ("array", "device"), [("numpy", "cpu"), ("torch", "cpu"), ("torch", "cuda")]
)
def test_example_batched_nim_passes(
    array: str, device: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    if array == "torch":
        torch = pytest.importorskip("torch")
        if device == "cuda" and not torch.cuda.is_available():
            pytest.skip("torch sees no CUDA GPU here")
    monkeypatch.syspath_prepend(str(ROOT))
    example = load_example()
    from examples.custom_env import Nim

    env = example.BatchedNim(5, array=array, device=device, sticks=7)
    report = check_env(env, dict_env=lambda: Nim(sticks=7))
    assert report.ok, report.violations
    assert report.compared and report.episodes >= 10


def test_torch_env_returning_numpy_arrays_is_reported() -> None:
    pytest.importorskip("torch")

    class NumpyInsideTorch(Squad):
        place = corral.Place("torch", "cpu")

    found = violations(NumpyInsideTorch())
    assert any(
        m.startswith("reset: obs['p'] must be a torch tensor on cpu, where the env's arrays live")
        for m in found
    ), found


# ---------------------------------------------------------------- corral check


@pytest.fixture
def nim_v1(isolated_registry: None, monkeypatch: pytest.MonkeyPatch) -> str:
    """``test/nim-v1``: the dict Nim and examples/batched_env.py's BatchedNim."""
    monkeypatch.syspath_prepend(str(ROOT))
    from examples.custom_env import Nim

    corral.register("test/nim-v1", Nim, batched=load_example().BatchedNim, sticks=6)
    return "test/nim-v1"


def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, list[str], str]:
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out.splitlines(), err


def test_check_an_id_with_both_checks_each_implementation(
    capsys: pytest.CaptureFixture[str], nim_v1: str
) -> None:
    code, lines, _ = run_cli(capsys, "check", nim_v1, "--num-envs", "3")
    assert code == 0, lines
    assert lines[0].startswith("test/nim-v1 (seed 0, ")
    assert lines[1].startswith(
        "test/nim-v1 (batched: 3 copies, numpy, compared with its dict env; seed 0, "
    )
    places = ["numpy"] + (["torch on cpu"] if importlib.util.find_spec("torch") else [])
    assert [line.split(", ")[1] for line in lines[1:]][: len(places)] == places
    assert all(line.endswith(": ok, no contract violation found") for line in lines)


def test_check_native_only_skips_the_dict_env(
    capsys: pytest.CaptureFixture[str], nim_v1: str
) -> None:
    code, lines, _ = run_cli(capsys, "check", nim_v1, "--native-only", "--set", "sticks=4")
    assert code == 0
    assert all(line.startswith("test/nim-v1 (batched: 4 copies, ") for line in lines), lines


def test_check_native_only_without_a_batched_implementation_exits_2(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, _, err = run_cli(capsys, "check", "corral/rps", "--native-only")
    assert code == 2
    assert "'corral/rps' has no natively batched implementation; those that do:" in err


def test_check_a_broken_batched_env_exits_1(
    capsys: pytest.CaptureFixture[str], isolated_registry: None
) -> None:
    nan = broken(1, lambda b: put(b.reward["p"], (2, 0), np.nan))
    corral.register("test/nan-squad", batched=lambda num_envs, array, device: nan(num_envs))
    code, lines, _ = run_cli(capsys, "check", "test/nan-squad", "--steps", "20")
    assert code == 1
    assert lines[0].startswith("test/nan-squad (batched: 4 copies, numpy; seed 0, ")
    assert "  - step 1, copy 2: reward of agent 'p_0' (group 'p') is nan" in lines[1]


def test_check_a_batched_env_class_given_as_module_attr(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(ROOT)
    try:
        code, lines, _ = run_cli(
            capsys, "check", "examples.batched_env:BatchedNim", "--set", "sticks=5"
        )
    finally:
        for name in ("examples.batched_env", "examples.custom_env", "examples"):
            sys.modules.pop(name, None)
    assert code == 0, lines
    assert lines[0] == (
        "examples.batched_env:BatchedNim (batched: 4 copies, numpy; seed 0, 8 steps, 8 episodes): "
        "ok, no contract violation found"
    )


def test_batched_env_doc_shows_the_example_code() -> None:
    # The blocks marked as fragments of the class are the example's, stretch by stretch.
    example = (ROOT / "examples/batched_env.py").read_text()
    fragments = re.findall(
        r"<!-- skip: fragment: [^>]*examples/batched_env.py\) -->\n```python\n(.*?)```",
        (ROOT / "docs/batched_env.md").read_text(),
        re.S,
    )
    assert len(fragments) == 3
    for block in fragments:
        for part in filter(None, block.strip("\n").split("\n\n")):
            assert part in example, part


OBS_Q_DICT = spaces.Dict({"t": OBS_Q, "pair": spaces.Tuple((OBS_Q, OBS_P))})


class NestedSquadDict(SquadDict):
    """SquadDict whose radio sees a Dict (with a Tuple inside) of what it saw before."""

    def observation_space(self, agent: str) -> spaces.Space:
        return OBS_P if agent in P else OBS_Q_DICT

    def _obs(self, agent: str) -> Any:
        if agent in P:
            return super()._obs(agent)
        return {"t": self._t, "pair": (self._t, np.zeros(2, np.float32))}


class NestedSquad(Squad):
    def observation_space(self, agent: str) -> spaces.Space:
        return OBS_P if agent in P else OBS_Q_DICT

    def observe(self, ended_p: np.ndarray, ended_q: np.ndarray) -> BatchedStep:
        batch = super().observe(ended_p, ended_q)
        t = batch.obs["q"]
        batch.obs["q"] = {"t": t, "pair": (t.copy(), np.zeros((*t.shape, 2), np.float32))}
        return batch


def test_dict_and_tuple_observations_are_checked_leaf_by_leaf() -> None:
    assert check_env(NestedSquad(), dict_env=NestedSquadDict).ok

    class MissingLeaf(NestedSquad):
        def observe(self, ended_p, ended_q):
            batch = super().observe(ended_p, ended_q)
            batch.obs["q"] = {"t": batch.obs["q"]["t"]}
            return batch

    assert violations(MissingLeaf()) == [
        "reset: obs['q']['pair'][0] must be an array of shape (4, 1) ([copies, agents of the "
        "group, ...]), got NoneType None",
        "reset: obs['q']['pair'][1] must be an array of shape (4, 1, 2) ([copies, agents of the "
        "group, ...]), got NoneType None",
    ]

    class LeafDiffers(NestedSquad):
        def observe(self, ended_p, ended_q):
            batch = super().observe(ended_p, ended_q)
            batch.obs["q"]["pair"][1][:, :, 1] = 0.5
            return batch

    found = violations(LeafDiffers(), dict_env=NestedSquadDict)
    assert found[0].startswith(
        "reset, copy 0: obs['pair'][1] of agent 'q_0' is [0.0, 0.5], but the dict env (seeded 0) "
        "gives [0.0, 0.0]"
    ), found


OBS_Q_DIGITS = spaces.Dict({"0": OBS_Q, "1": spaces.Tuple((OBS_Q, OBS_P))})


class DigitKeysDict(NestedSquadDict):
    """NestedSquadDict whose Dict keys are digits, which a path of keys cannot tell from
    tuple indices."""

    def observation_space(self, agent: str) -> spaces.Space:
        return OBS_P if agent in P else OBS_Q_DIGITS

    def _obs(self, agent: str) -> Any:
        found = super()._obs(agent)
        return found if agent in P else {"0": found["t"], "1": found["pair"]}


class DigitKeys(NestedSquad):
    def __init__(self, num_envs: int = 4, array: str = "numpy", device: str = "cpu") -> None:
        super().__init__(num_envs)  # numpy only

    def observation_space(self, agent: str) -> spaces.Space:
        return OBS_P if agent in P else OBS_Q_DIGITS

    def observe(self, ended_p: np.ndarray, ended_q: np.ndarray) -> BatchedStep:
        batch = super().observe(ended_p, ended_q)
        batch.obs["q"] = {"0": batch.obs["q"]["t"], "1": batch.obs["q"]["pair"]}
        return batch


def test_digit_keys_of_a_dict_observation_run_natively_as_in_the_dict_env(
    isolated_registry: None,
) -> None:
    assert check_env(DigitKeys(), dict_env=DigitKeysDict).ok
    corral.register("test/digit-keys", DigitKeysDict, batched=DigitKeys)
    batches = []
    for native in (True, False):
        with corral.make_vec("test/digit-keys", 4, seed=0, native=native) as venv:
            rng, seen = np.random.default_rng(1), [venv.reset()]
            for _ in range(12):  # past the first autoresets, which the vector layer checks
                seen.append(venv.step(venv.sample_actions(seen[-1], rng)))
            batches.append([(b.obs["q"]["0"].copy(), b.obs["q"]["1"][0].copy()) for b in seen])
    for (native_t, native_pair), (dict_t, dict_pair) in zip(*batches, strict=True):
        np.testing.assert_array_equal(native_t, dict_t)
        np.testing.assert_array_equal(native_pair, dict_pair)


def test_sampled_actions_of_a_nested_space_stack_leaf_by_leaf() -> None:
    space = spaces.Dict(
        move=spaces.Box(-1, 1, (2,), np.float32),
        pick=spaces.Tuple((spaces.Discrete(3), spaces.MultiBinary(4))),
    )
    space.seed(0)
    rows = [[space.sample() for _ in range(2)] for _ in range(3)]  # 3 copies, 2 agents
    stacked = _stack(array_tree(space), rows)
    # the reference: each leaf stacked by hand
    move = np.asarray([[v["move"] for v in row] for row in rows], np.float32)
    pick = np.asarray([[v["pick"][0] for v in row] for row in rows], np.int64)
    bits = np.asarray([[v["pick"][1] for v in row] for row in rows], np.int8)
    for got, want in (
        (stacked["move"], move),
        (stacked["pick"][0], pick),
        (stacked["pick"][1], bits),
    ):
        assert got.dtype == want.dtype and got.shape == want.shape
        np.testing.assert_array_equal(got, want)
