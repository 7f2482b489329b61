"""The conformance checker: a correct env passes, and each broken env fails with its rule.

``Relay`` is a small correct turn-based env. Each broken env below is a subclass
that breaks one rule at a known step, so the tests can assert the message names
the rule, the agent and the step.
"""

from __future__ import annotations

import doctest
import importlib.util
import re
import subprocess
import sys
import textwrap
from collections.abc import Mapping
from typing import Any

import numpy as np
import pytest
from gymnasium import spaces
from support.paths import ROOT

import corral
from corral.checks import MAX_REPEATS, CheckReport, RandomPolicy, check_env
from corral.env import MultiAgentEnv, validate_actions
from corral.errors import CheckIncompleteWarning, EnvContractError

EXAMPLE = ROOT / "examples" / "custom_env.py"
DOC = ROOT / "docs" / "custom_env.md"


class Relay(MultiAgentEnv):
    """Three agents act in turn. ``p_2`` terminates in step 2; all truncate in step 6.

    Observations are seeded noise; action 2 is illegal at odd steps; every live
    agent is rewarded every step; the global state is the step count.
    """

    possible_agents = ["p_0", "p_1", "p_2"]
    state_space = spaces.Box(0, 10, (1,), np.float32)
    reads_masks = True

    def __init__(self) -> None:
        self.agents = []
        self._obs_space = spaces.Box(0, 1, (2,), np.float32)
        self._action_space = spaces.Discrete(3)
        self._step = 0
        self._rng = np.random.default_rng()

    def observation_space(self, agent: str) -> spaces.Space:
        return self._obs_space

    def action_space(self, agent: str) -> spaces.Space:
        return self._action_space

    def state(self) -> np.ndarray:
        return np.array([self._step], dtype=np.float32)

    def reset(self, seed: int | None = None, options: dict | None = None) -> tuple[dict, dict]:
        self._rng = np.random.default_rng(seed)
        self.agents = list(self.possible_agents)
        self._step = 0
        return self._next_turn({})

    def step(self, actions: Mapping[str, Any]) -> tuple[dict, dict, dict, dict, dict]:
        acting = self._acting()
        masks = self._masks(acting) if self.reads_masks else {}
        validate_actions(actions, acting, self.action_space, masks, self._step)
        alive = list(self.agents)
        rewards = {agent: 0.1 for agent in alive}
        rewards[acting[0]] = float(actions[acting[0]])
        self._step += 1
        terms = {agent: agent == "p_2" and self._step == 3 for agent in alive}
        truncs = {agent: self._step == 7 for agent in alive}
        ended = [agent for agent in alive if terms[agent] or truncs[agent]]
        infos = {agent: {"final_obs": self._observe()} for agent in ended}
        self.agents = [agent for agent in alive if agent not in ended]
        obs, infos = self._next_turn(infos)
        return obs, rewards, terms, truncs, infos

    def _acting(self) -> list[str]:
        return [self.agents[self._step % len(self.agents)]] if self.agents else []

    def _observe(self) -> np.ndarray:
        return self._rng.random(2, dtype=np.float32)

    def _masks(self, acting: list[str]) -> dict[str, np.ndarray]:
        return {agent: np.array([1, 1, 1 - self._step % 2], dtype=np.int8) for agent in acting}

    def _next_turn(self, infos: dict) -> tuple[dict, dict]:
        acting = self._acting()
        obs = {agent: self._observe() for agent in acting}
        for agent, mask in self._masks(acting).items():
            infos[agent] = {"action_mask": mask}
        return obs, infos


def violations(env: Any, **kwargs: Any) -> list[str]:
    report = check_env(env, raise_on_error=False, **kwargs)
    assert isinstance(report, CheckReport)
    return report.violations


def the_violation(env: Any) -> str:
    """The single violation ``env`` has."""
    found = violations(env)
    assert len(found) == 1, found
    return found[0]


class Broken(Relay):
    """Relay with a hook that breaks what step ``n`` of the first episode returns.

    Step 0 is taken by p_0 and returns obs for p_1, step 1 returns obs for p_2,
    step 2 (where p_2 terminates) for p_1, step 3 for p_0, ... step 6 ends it.
    """

    n = 1

    def reset(self, seed: int | None = None, options: dict | None = None) -> tuple[dict, dict]:
        self.episode_seed = seed
        return super().reset(seed, options)

    def step(self, actions: Mapping[str, Any]) -> tuple[dict, dict, dict, dict, dict]:
        result = list(super().step(actions))
        if self._step == self.n + 1 and self.episode_seed == 0:
            self.corrupt(*result)
        return tuple(result)

    def corrupt(self, obs: dict, rewards: dict, terms: dict, truncs: dict, infos: dict) -> None:
        raise NotImplementedError


def test_correct_env_passes() -> None:
    report = check_env(Relay())
    assert report.ok
    assert report.violations == []
    assert report.steps == 14
    assert report.episodes == 2
    assert "ok" in str(report)


def test_example_custom_env_passes() -> None:
    spec = importlib.util.spec_from_file_location("custom_env", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    report = check_env(module.Nim(sticks=7))
    assert report.ok, report.violations
    assert report.episodes == 2


def test_the_example_prints_what_its_doc_shows(isolated_registry: None) -> None:
    """``python examples/custom_env.py``'s first line, as docs/custom_env.md shows it: its
    random moves come from seeded action spaces (they were unseeded: 2 runs in 5 differed)."""
    shown = re.search(r"\$ python examples/custom_env.py\n(returns: .*)\n", DOC.read_text())
    assert shown is not None
    for _ in range(3):
        done = subprocess.run(
            [sys.executable, str(EXAMPLE)], capture_output=True, text=True, cwd=ROOT, check=True
        )
        assert done.stdout.splitlines()[0] == shown.group(1)


def doc_blocks(language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", DOC.read_text(), re.S)


def test_custom_env_doc_shows_the_example_code() -> None:
    # Each stretch of a block between blank lines is the example's (at the top level or
    # in a function), apart from the lines that import the example itself.
    example = EXAMPLE.read_text()
    blocks = doc_blocks("python")
    assert len(blocks) >= 6
    for block in blocks:
        code = re.sub(r"(?m)^from examples\.custom_env import .*\n", "", block)
        for part in filter(None, code.strip("\n").split("\n\n")):
            assert part in example or textwrap.indent(part, "    ") in example, part


def test_custom_env_doc_sessions_run(
    isolated_registry: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.syspath_prepend(str(ROOT))
    text = "\n".join(doc_blocks("pycon"))
    test = doctest.DocTestParser().get_doctest(text, {}, DOC.name, str(DOC), 0)
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS)
    try:
        runner.run(test)
    finally:
        sys.modules.pop("examples.custom_env", None)
        sys.modules.pop("examples", None)
    assert runner.summarize(verbose=False) == (0, len(test.examples))
    assert len(test.examples) >= 6


def test_max_steps_and_episodes_bound_the_rollout() -> None:
    assert check_env(Relay(), max_steps=10).steps == 10  # the second episode is cut
    assert check_env(Relay(), max_steps=5).steps == 7  # the first one plays on to its end
    assert check_env(Relay(), episodes=1).steps == 7


class Ticker(MultiAgentEnv):
    """Two agents act together every step; everyone is truncated after ``length`` steps."""

    possible_agents = ["a_0", "a_1"]

    def __init__(self, length: int) -> None:
        self.length = length
        self.agents = []
        self._t = 0

    def observation_space(self, agent: str) -> spaces.Space:
        return spaces.Box(0, 1, (1,), np.float32)

    def action_space(self, agent: str) -> spaces.Space:
        return spaces.Discrete(2)

    def reset(self, seed: int | None = None, options: dict | None = None) -> tuple[dict, dict]:
        self.agents, self._t = list(self.possible_agents), 0
        return self._observe(), {a: {} for a in self.agents}

    def step(self, actions: Mapping[str, Any]) -> tuple[dict, dict, dict, dict, dict]:
        validate_actions(actions, self.agents, self.action_space, {}, self._t)
        alive = list(self.agents)
        self._t += 1
        over = self._t == self.length
        rewards = dict.fromkeys(alive, 0.0)
        terms, truncs = dict.fromkeys(alive, False), dict.fromkeys(alive, over)
        if over:
            self.agents = []
            return {}, rewards, terms, truncs, {a: {"final_obs": self._obs()} for a in alive}
        return self._observe(), rewards, terms, truncs, {a: {} for a in alive}

    def _obs(self) -> np.ndarray:
        return np.array([self._t / self.length], dtype=np.float32)

    def _observe(self) -> dict:
        return {a: self._obs() for a in self.agents}


def test_first_episode_plays_past_max_steps_until_it_ends() -> None:
    """Like go or pursuit (500 steps): max_steps ends no episode, so the checker plays on."""
    report = check_env(Ticker(500))
    assert report.ok and report.complete, str(report)
    assert (report.steps, report.episodes) == (500, 1)
    assert str(report).endswith(": ok, no contract violation found")


def test_env_that_does_not_end_within_the_cap_is_reported_incomplete() -> None:
    with pytest.warns(CheckIncompleteWarning, match="no episode ended within 40 steps"):
        report = check_env(Ticker(500), max_steps=20, step_cap=40)
    assert report.ok and not report.complete
    assert (report.steps, report.episodes) == (40, 0)
    assert "incomplete, no contract violation found, but no episode ended" in str(report)
    assert "final_obs" in str(report) and "were not checked" in str(report)


def test_episodes_outlasting_max_episode_steps_are_reported() -> None:
    class Overlong(Ticker):
        max_episode_steps = 6

    found = violations(Overlong(9))
    assert found == [
        "step 5: the episode goes on after 6 steps, but env.max_episode_steps is 6; an "
        "episode must end within max_episode_steps",
        "episode 1, step 5: the episode goes on after 6 steps, but env.max_episode_steps is 6; "
        "an episode must end within max_episode_steps",
    ], found
    assert check_env(Overlong(6)).ok

    class Fractional(Relay):
        max_episode_steps = 6.5

    assert violations(Fractional()) == [
        "env.max_episode_steps must be a positive int or None, got float 6.5"
    ]


def test_raise_on_error_raises_with_every_violation() -> None:
    class NaNReward(Broken):
        def corrupt(self, obs, rewards, terms, truncs, infos):
            rewards["p_0"] = float("nan")

    with pytest.raises(EnvContractError) as err:
        check_env(NaNReward())
    assert err.value.violations == violations(NaNReward())
    assert "step 1: reward of agent 'p_0' is nan" in str(err.value)


def test_check_env_builds_an_id(isolated_registry: None) -> None:
    corral.register("test/relay", Relay)
    assert check_env("test/relay").ok


# ---------------------------------------------------------------- one broken env per rule


class ObsOutsideSpace(Broken):
    def corrupt(self, obs, rewards, terms, truncs, infos):
        obs["p_2"] = np.array([2.0, 0.5], dtype=np.float32)


class ObsWrongDtype(Broken):
    def corrupt(self, obs, rewards, terms, truncs, infos):
        obs["p_2"] = obs["p_2"].astype(np.float64)


class ObsScalar(Broken):
    def corrupt(self, obs, rewards, terms, truncs, infos):
        obs["p_2"] = np.float32(0.5)  # the space holds arrays of shape (2,)


class Unbounded(Broken):
    """Broken, with unbounded observations and state: only the finiteness rules catch inf."""

    state_space = spaces.Box(-np.inf, np.inf, (1,), np.float32)

    def __init__(self) -> None:
        super().__init__()
        self._obs_space = spaces.Box(-np.inf, np.inf, (2,), np.float32)


class ObsInf(Unbounded):
    def corrupt(self, obs, rewards, terms, truncs, infos):
        obs["p_2"] = np.array([0.5, np.inf], dtype=np.float32)


class ObsOverflowsFloat32(Unbounded):
    def corrupt(self, obs, rewards, terms, truncs, infos):
        obs["p_2"] = np.array([1e300, 0.5])


class FinalObsNaN(Unbounded):
    n = 2

    def corrupt(self, obs, rewards, terms, truncs, infos):
        infos["p_2"]["final_obs"] = np.array([np.nan, 0.5], dtype=np.float32)


class StateInf(Unbounded):
    def corrupt(self, obs, rewards, terms, truncs, infos):
        pass  # only the state is broken

    def state(self) -> np.ndarray:
        return np.array([np.inf if self._step == 3 else self._step], dtype=np.float32)


class ObsForDeadAgent(Broken):
    n = 3

    def corrupt(self, obs, rewards, terms, truncs, infos):
        obs["p_2"] = np.zeros(2, dtype=np.float32)


class ObsForUnknownAgent(Broken):
    def corrupt(self, obs, rewards, terms, truncs, infos):
        obs["ghost"] = np.zeros(2, dtype=np.float32)


class MissingInfos(Broken):
    def corrupt(self, obs, rewards, terms, truncs, infos):
        del infos["p_2"]


class MaskWrongLength(Broken):
    def corrupt(self, obs, rewards, terms, truncs, infos):
        infos["p_2"]["action_mask"] = np.ones(2, dtype=np.int8)


class MaskAllZeros(Broken):
    def corrupt(self, obs, rewards, terms, truncs, infos):
        infos["p_2"]["action_mask"] = np.zeros(3, dtype=np.int8)


class MaskWrongDtype(Broken):
    def corrupt(self, obs, rewards, terms, truncs, infos):
        infos["p_2"]["action_mask"] = np.ones(3, dtype=np.float32)


class MaskBool(Broken):
    def corrupt(self, obs, rewards, terms, truncs, infos):
        infos["p_2"]["action_mask"] = np.ones(3, dtype=bool)


class RewardForUnknownAgent(Broken):
    def corrupt(self, obs, rewards, terms, truncs, infos):
        rewards["ghost"] = 1.0


class RewardForDeadAgent(Broken):
    n = 3

    def corrupt(self, obs, rewards, terms, truncs, infos):
        rewards["p_2"] = 0.0


class MissingReward(Broken):
    def corrupt(self, obs, rewards, terms, truncs, infos):
        del rewards["p_2"]


class NaNReward(Broken):
    def corrupt(self, obs, rewards, terms, truncs, infos):
        rewards["p_0"] = float("nan")


class NonBoolTermination(Broken):
    def corrupt(self, obs, rewards, terms, truncs, infos):
        terms["p_1"] = 0


class MissingFinalObs(Broken):
    n = 2

    def corrupt(self, obs, rewards, terms, truncs, infos):
        del infos["p_2"]["final_obs"]


class FinalObsOutsideSpace(Broken):
    n = 2

    def corrupt(self, obs, rewards, terms, truncs, infos):
        infos["p_2"]["final_obs"] = np.full(2, -1.0, dtype=np.float32)


class EndedAgentStays(Broken):
    n = 2

    def corrupt(self, obs, rewards, terms, truncs, infos):
        self.agents.append("p_2")


class AgentListedTwice(Broken):
    def corrupt(self, obs, rewards, terms, truncs, infos):
        self.agents.append("p_0")  # e.g. an env that adds a joining agent every step


class AgentVanishes(Broken):
    n = 2

    def corrupt(self, obs, rewards, terms, truncs, infos):
        terms["p_2"] = False


class Revived(Broken):
    n = 5

    def corrupt(self, obs, rewards, terms, truncs, infos):
        self.agents.append("p_2")


class ObsAfterEpisodeEnd(Broken):
    n = 6

    def corrupt(self, obs, rewards, terms, truncs, infos):
        obs["p_0"] = infos["p_0"]["final_obs"]


class StateOutsideStateSpace(Relay):
    def state(self) -> np.ndarray:
        return np.array([20.0 if self._step == 3 else self._step], dtype=np.float32)


class Nondeterministic(Relay):
    def _observe(self) -> np.ndarray:
        return np.random.default_rng().random(2, dtype=np.float32)


class AcceptsActionOfIdleAgent(Relay):
    def step(self, actions: Mapping[str, Any]) -> tuple[dict, dict, dict, dict, dict]:
        return super().step({a: v for a, v in actions.items() if a in self._acting()})


class AcceptsMissingAction(Relay):
    def step(self, actions: Mapping[str, Any]) -> tuple[dict, dict, dict, dict, dict]:
        return super().step({a: actions.get(a, 0) for a in self._acting()})


class AcceptsActionOutsideItsSpace(Relay):
    def step(self, actions: Mapping[str, Any]) -> tuple[dict, dict, dict, dict, dict]:
        return super().step({a: min(int(v), 2) for a, v in actions.items()})  # 3 plays as 2


class AcceptsMaskedAction(Relay):
    """Action 2 is illegal from the first step on, and played all the same."""

    reads_masks = False

    def _masks(self, acting: list[str]) -> dict[str, np.ndarray]:
        return {agent: np.array([1, 1, 0], dtype=np.int8) for agent in acting}


class RaisesKeyErrorOnBadAction(Relay):
    def step(self, actions: Mapping[str, Any]) -> tuple[dict, dict, dict, dict, dict]:
        if set(actions) != set(self._acting()):
            raise KeyError("bad agent")
        return super().step(actions)


class ChangesStateBeforeRejecting(Relay):
    def step(self, actions: Mapping[str, Any]) -> tuple[dict, dict, dict, dict, dict]:
        self._rng.random()  # consumed even when the actions are then rejected
        return super().step(actions)


class SpacesChangeEveryCall(Relay):
    def observation_space(self, agent: str) -> spaces.Space:
        self._calls = getattr(self, "_calls", 0) + 1
        return spaces.Box(0, self._calls, (2,), np.float32)


class NotASpace(Relay):
    def action_space(self, agent: str) -> Any:
        return 3


BROKEN = [
    (ObsOutsideSpace, "step 1: observation of agent 'p_2' is not in its observation space"),
    (ObsWrongDtype, "step 1: observation of agent 'p_2' is not in"),
    (ObsScalar, "step 1: observation of agent 'p_2' is not in its observation space"),
    (ObsInf, "step 1: observation of agent 'p_2': expected finite values, got inf at index (1,)"),
    (
        ObsOverflowsFloat32,
        "step 1: observation of agent 'p_2': expected values that float32 holds",
    ),
    (FinalObsNaN, "step 2: final_obs of agent 'p_2': expected finite values, got nan"),
    (StateInf, "step 2: env.state(): expected finite values, got inf at index (0,)"),
    (ObsForDeadAgent, "step 3: obs holds agent 'p_2', which is not in env.agents"),
    (ObsForUnknownAgent, "step 1: obs holds agent 'ghost', which is not one of possible_agents"),
    (MissingInfos, "step 1: infos has no entry for agent 'p_2', which is in obs"),
    (MaskWrongLength, "step 1: infos['p_2']['action_mask'] has shape (2,), but the action space"),
    (MaskAllZeros, "step 1: infos['p_2']['action_mask'] is all zeros"),
    (
        MaskWrongDtype,
        "step 1: infos['p_2']['action_mask'] must have dtype int8, the dtype Gymnasium's "
        "Discrete.sample(mask=...) takes, got dtype float32: return mask.astype(np.int8)",
    ),
    (MaskBool, "step 1: infos['p_2']['action_mask'] must have dtype int8, the dtype"),
    (RewardForUnknownAgent, "step 1: rewards names agent 'ghost', which is not one of possible"),
    (RewardForDeadAgent, "step 3: rewards names agent 'p_2', whose episode already ended at step"),
    (MissingReward, "step 1: rewards has no entry for agent 'p_2', which was alive"),
    (NaNReward, "step 1: reward of agent 'p_0' is nan; rewards must be finite"),
    (NonBoolTermination, "step 1: terminations['p_1'] must be a bool, got int 0"),
    (MissingFinalObs, "step 2: agent 'p_2' ended but infos['p_2']['final_obs']"),
    (FinalObsOutsideSpace, "step 2: infos['p_2']['final_obs'] is not in the observation space"),
    (EndedAgentStays, "step 2: agent 'p_2' ended but is still in env.agents"),
    (AgentListedTwice, "step 1: env.agents lists agent 'p_0' 2 times; each live agent is listed"),
    (AgentVanishes, "step 2: agent 'p_2' left env.agents without terminations or truncations"),
    (Revived, "step 5: agent 'p_2' was revived after its episode ended at step 2"),
    (ObsAfterEpisodeEnd, "step 6: the episode is over (env.agents is empty) but obs holds"),
    (StateOutsideStateSpace, "step 2: env.state() is not in env.state_space"),
    (Nondeterministic, "reset: obs['p_0'] differs between two runs that both call reset(seed=0)"),
    (
        AcceptsActionOfIdleAgent,
        "step 0: env.step accepted an action for 'p_1' (not an acting agent)",
    ),
    (AcceptsMissingAction, "step 0: env.step accepted no action for 'p_0' (an acting agent)"),
    (
        AcceptsActionOutsideItsSpace,
        "step 0: env.step accepted an action outside the space of 'p_0' (3)",
    ),
    (AcceptsMaskedAction, "step 0: env.step accepted an action that the mask of 'p_0' forbids (2)"),
    (RaisesKeyErrorOnBadAction, "env.step raised KeyError instead of a ValueError"),
    (ChangesStateBeforeRejecting, "step 0: obs['p_1'] differs from a run without the bad actions"),
    (SpacesChangeEveryCall, "env.observation_space('p_0') returned a different space"),
    (NotASpace, "env.action_space('p_0') must be a gymnasium space, got int 3"),
]


@pytest.mark.parametrize(("env_cls", "expected"), BROKEN, ids=[cls.__name__ for cls, _ in BROKEN])
def test_broken_env_fails_with_its_rule(env_cls: type, expected: str) -> None:
    found = violations(env_cls())
    assert any(expected in message for message in found), found


def test_obs_wrong_dtype_names_the_dtype() -> None:
    message = the_violation(ObsWrongDtype())
    assert "dtype float64" in message
    assert "float32" in message  # the space's dtype


def test_broken_env_reports_only_its_own_rule() -> None:
    assert the_violation(Revived()).startswith("step 5: agent 'p_2' was revived")
    assert the_violation(NaNReward()).startswith("step 1: reward of agent 'p_0'")
    assert the_violation(ObsInf()).startswith("step 1: observation of agent 'p_2': expected")


def test_a_nondeterministic_env_is_still_probed_with_bad_actions() -> None:
    class NondeterministicAndLax(Nondeterministic, AcceptsActionOfIdleAgent):
        pass

    found = violations(NondeterministicAndLax())
    assert any("differs between two runs" in m for m in found), found
    assert any("env.step accepted an action for 'p_1' (not an acting agent)" in m for m in found)


def test_several_violations_are_reported_together() -> None:
    class ThreeBugs(Broken):
        n = 2

        def corrupt(self, obs, rewards, terms, truncs, infos):
            rewards["p_0"] = float("inf")
            infos["p_1"]["action_mask"] = np.ones(2, dtype=np.int8)
            del infos["p_2"]["final_obs"]

    found = violations(ThreeBugs())
    assert len(found) == 3, found
    assert any("step 2: reward of agent 'p_0' is inf" in m for m in found)
    assert any("step 2: infos['p_1']['action_mask'] has shape (2,)" in m for m in found)
    assert any("step 2: agent 'p_2' ended but infos['p_2']['final_obs']" in m for m in found)


def test_repeats_of_one_rule_are_capped() -> None:
    class AlwaysNaN(Relay):
        def step(self, actions):
            obs, rewards, terms, truncs, infos = super().step(actions)
            return obs, dict.fromkeys(rewards, float("nan")), terms, truncs, infos

    found = violations(AlwaysNaN())
    assert len([m for m in found if "is nan" in m]) == MAX_REPEATS
    assert found[-1].startswith("... and ")
    assert "rewards_are_finite_numbers" in found[-1]


def test_later_episodes_are_named() -> None:
    class SecondEpisodeNaN(Relay):
        def reset(self, seed=None, options=None):
            self.seed = seed
            return super().reset(seed, options)

        def step(self, actions):
            obs, rewards, terms, truncs, infos = super().step(actions)
            if self.seed == 1 and self._step == 2:
                rewards["p_0"] = float("nan")
            return obs, rewards, terms, truncs, infos

    assert the_violation(SecondEpisodeNaN()).startswith("episode 1, step 1: reward of agent 'p_0'")


def test_env_that_raises_is_reported_not_propagated() -> None:
    class Crashes(Broken):
        n = 3

        def corrupt(self, obs, rewards, terms, truncs, infos):
            raise RuntimeError("boom")

    assert the_violation(Crashes()) == "step 3: env.step raised RuntimeError: boom"


def test_bad_reset_result_is_reported() -> None:
    class ResetReturnsObsOnly(Relay):
        def reset(self, seed=None, options=None):
            return super().reset(seed, options)[0]

    message = the_violation(ResetReturnsObsOnly())
    assert message.startswith("reset: env.reset must return (obs, infos), two dicts; got dict")


def test_bad_possible_agents_stop_the_check() -> None:
    class NoAgents(Relay):
        possible_agents = []

    assert the_violation(NoAgents()).startswith("env.possible_agents must be a non-empty list")


def test_a_bool_mask_is_reported_with_the_conversion_that_makes_it_int8() -> None:
    message = the_violation(MaskBool())
    assert message.endswith("got dtype bool: return mask.astype(np.int8)"), message


class XuanCeStyle:
    """Spaces as dicts by agent, as XuanCe's multi-agent envs keep them (otherwise Relay)."""

    def __init__(self) -> None:
        relay = Relay()
        self.possible_agents = relay.possible_agents
        self.observation_space = {a: relay.observation_space(a) for a in self.possible_agents}
        self.action_space = {a: relay.action_space(a) for a in self.possible_agents}
        self.reset, self.step = relay.reset, relay.step


class RLlibStyle(Relay):
    """Spaces in a dict ``observation_spaces``, and ``observation_space`` a gymnasium Dict
    over the agents, as RLlib's MultiAgentEnv keeps them."""

    def __init__(self) -> None:
        super().__init__()
        self.observation_spaces = {a: self._obs_space for a in self.possible_agents}
        self.observation_space = spaces.Dict(self.observation_spaces)


def test_spaces_kept_as_dicts_are_named_with_what_the_contract_expects() -> None:
    found = violations(XuanCeStyle())  # the check stops there: no space can be read
    assert found == [
        f"env.{kind} is a dict keyed by ['p_0', 'p_1', 'p_2'], not a method: the contract asks "
        f"each agent's space as env.{kind}(agent), which returns a gymnasium space. An env "
        "that keeps its spaces in a dict by agent (as XuanCe, RLlib and MALib do) can keep it "
        f"as self.{kind}s and add: def {kind}(self, agent): return self.{kind}s[agent]"
        for kind in ("observation_space", "action_space")
    ]
    message = the_violation(RLlibStyle())
    assert message.startswith("env.observation_space is a gymnasium space, Dict('p_0': Box("), (
        message
    )
    assert "def observation_space(self, agent): return self.observation_spaces[agent]" in message


class MALibStyle:
    """Spaces only in the dicts ``observation_spaces`` and ``action_spaces``, as MALib's envs
    keep them (otherwise Relay)."""

    def __init__(self) -> None:
        relay = Relay()
        self.possible_agents = relay.possible_agents
        self.observation_spaces = {a: relay.observation_space(a) for a in self.possible_agents}
        self.action_spaces = {a: relay.action_space(a) for a in self.possible_agents}
        self.reset, self.step = relay.reset, relay.step


def test_an_env_with_only_dicts_of_spaces_is_told_the_methods_to_add() -> None:
    with pytest.raises(TypeError) as refused:  # not an env at all: corral.adapt refuses it
        check_env(MALibStyle())
    message = str(refused.value)
    assert "lacks ['observation_space', 'action_space']" in message
    for kind in ("observation_space", "action_space"):
        assert f"def {kind}(self, agent): return self.{kind}s[agent]" in message


def test_simultaneous_env_probe_uses_an_unknown_agent() -> None:
    class Simultaneous(Relay):
        def _acting(self):
            return list(self.agents)

        def step(self, actions):
            return super().step({a: v for a, v in actions.items() if a in self.agents})

    found = violations(Simultaneous())
    assert any("accepted an action for '__not_an_agent__'" in m for m in found), found


def test_random_policy_respects_masks_and_is_seeded() -> None:
    env = Relay()
    env.reset(seed=0)
    mask = np.array([0, 1, 0], dtype=np.int8)
    first, second = RandomPolicy(env, seed=3), RandomPolicy(env, seed=3)
    assert [first.sample("p_0") for _ in range(10)] == [second.sample("p_0") for _ in range(10)]
    assert {int(first.sample("p_0", mask)) for _ in range(30)} == {1}
    assert set(first({"p_1": None}, {"p_1": {"action_mask": mask}})) == {"p_1"}
