"""corral.to_pettingzoo, proven by PettingZoo's own test suites and against the raw envs.

Every export runs PettingZoo's ``api_test``/``parallel_api_test`` and
``seed_test``/``parallel_seed_test``; exports of PettingZoo envs must give
exactly what the raw env gives for the same seed and actions, and must raise
the same warnings in PettingZoo's suites as the raw env does.
"""

from __future__ import annotations

import importlib
import importlib.util
import subprocess
import sys
import types
import warnings
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import pytest
from gymnasium import spaces
from gymnasium.utils.env_checker import data_equivalence
from support.paths import ROOT

import corral
import corral.export
from corral.env import MultiAgentEnv, validate_actions
from corral.envs.rps4 import RockPaperScissors4
from corral.errors import (
    EnvContractError,
    EpisodeOverError,
    ExportError,
    InvalidActionError,
    MissingDependencyError,
)

pettingzoo = pytest.importorskip("pettingzoo")
pytest.importorskip("mpe2")
with warnings.catch_warnings():  # pettingzoo.test imports a deprecated module path
    warnings.simplefilter("ignore", DeprecationWarning)
    from pettingzoo.test import (
        api_test,
        max_cycles_test,
        parallel_api_test,
        parallel_seed_test,
        render_test,
        seed_test,
    )
from pettingzoo.utils.conversions import parallel_to_aec  # noqa: E402

# The warnings PettingZoo's suites raise about corral's own envs, and why they are fine.
# rps/rps4: nothing played yet at reset; Nim: no stick left at the end
ALL_ZEROS = "Observation numpy array is all zeros."
INFINITE_BOUNDS = {  # OpenSpiel tensors are declared unbounded
    "Agent's minimum observation space value is -infinity. This is probably too low.",
    "Agent's maximum observation space value is infinity. This is probably too high",
}
DICT_OBS = {  # observations given as Dicts with their masks (mask_in_obs=True)
    "Observation is not a NumPy array",
    "Observation space for each agent probably should be gymnasium.spaces.box or "
    "gymnasium.spaces.discrete",
}
TWO_KINDS = DICT_OBS | {  # tag's predators and prey see different things
    "Agents have different observation space sizes",
    "Observations are different shapes",
}


def warned(run: Callable[..., Any], *args: Any, **kwargs: Any) -> set[str]:
    """Run a PettingZoo suite; the set of warning messages it raised."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        run(*args, **kwargs)
    return {str(w.message) for w in caught}


def load_nim() -> type:
    """The user env of examples/custom_env.py (turn-based Nim with action masks)."""
    spec = importlib.util.spec_from_file_location(
        "custom_env_example", ROOT / "examples/custom_env.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.Nim


Nim = load_nim()


def raw_mpe2(name: str, **kwargs: Any) -> Any:
    return importlib.import_module(f"mpe2.{name}").parallel_env(**kwargs)


# --- which API an env is exported to -------------------------------------------------------


@pytest.mark.parametrize(
    ("source", "kwargs", "base"),
    [
        ("mpe2/simple_spread_v3", {}, "ParallelEnv"),
        ("corral/tag", {}, "ParallelEnv"),
        ("mdp/climbing", {}, "ParallelEnv"),
        ("corral/memory", {}, "ParallelEnv"),  # every agent acts at every step
        ("corral/memory-turns", {}, "AECEnv"),
        ("pettingzoo/classic/tictactoe_v3", {}, "AECEnv"),
        ("corral/rps", {}, "AECEnv"),
        ("corral/rps4", {}, "AECEnv"),
        (Nim, {}, "AECEnv"),
    ],
    ids=str,
)
def test_the_default_api_fits_the_kind_of_env(source: Any, kwargs: dict, base: str) -> None:
    env = corral.to_pettingzoo(source() if isinstance(source, type) else source, **kwargs)
    assert isinstance(env, getattr(pettingzoo, base))
    assert isinstance(corral.to_pettingzoo(env.env, api="aec"), pettingzoo.AECEnv)


@pytest.mark.parametrize("source", ["corral/rps", "corral/rps4", "openspiel/kuhn_poker", Nim])
def test_parallel_api_for_an_env_that_is_not_simultaneous_says_to_use_aec(source: Any) -> None:
    if source == "openspiel/kuhn_poker":
        pytest.importorskip("pyspiel")
    env = source() if isinstance(source, type) else corral.make(source)
    with pytest.raises(ExportError, match=r"not simultaneous.*api='aec'"):
        corral.to_pettingzoo(env, api="parallel")


def test_export_errors_name_the_env_by_its_id_else_by_its_class_and_name() -> None:
    pytest.importorskip("pyspiel")
    with pytest.raises(ExportError, match=r"^'openspiel/kuhn_poker' is not simultaneous"):
        corral.to_pettingzoo("openspiel/kuhn_poker", api="parallel")
    with pytest.raises(ExportError, match=r"^OpenSpielEnv 'kuhn_poker' is not simultaneous"):
        corral.to_pettingzoo(corral.make("openspiel/kuhn_poker"), api="parallel")


def test_openspiel_simultaneous_games_export_as_parallel() -> None:
    pytest.importorskip("pyspiel")
    assert isinstance(corral.to_pettingzoo("openspiel/goofspiel"), pettingzoo.ParallelEnv)
    assert isinstance(corral.to_pettingzoo("openspiel/kuhn_poker"), pettingzoo.AECEnv)


class FalselySimultaneous(MultiAgentEnv):
    """Declares simultaneous = True but lets its two players take one turn each."""

    simultaneous = True
    possible_agents = ["p_0", "p_1"]

    def __init__(self) -> None:
        self._space = spaces.Discrete(2)

    def observation_space(self, agent: str) -> spaces.Space:
        return self._space

    def action_space(self, agent: str) -> spaces.Space:
        return self._space

    def reset(self, seed: int | None = None, options: dict | None = None) -> tuple:
        self.agents = list(self.possible_agents)
        return {"p_0": 0}, {"p_0": {}}

    def step(self, actions: Mapping) -> tuple:
        validate_actions(actions, ["p_1" if "p_1" in actions else "p_0"], self.action_space, {}, 0)
        no = dict.fromkeys(self.agents, False)
        if "p_0" in actions:
            return {"p_1": 1}, dict.fromkeys(self.agents, 0.0), no, dict(no), {"p_1": {}}
        done = dict.fromkeys(self.agents, True)
        infos = {a: {"final_obs": 1} for a in self.agents}
        self.agents = []
        return {}, dict.fromkeys(done, 0.0), done, dict(no), infos


def test_an_env_that_falsely_declares_simultaneous_is_caught() -> None:
    env = corral.to_pettingzoo(FalselySimultaneous())
    with pytest.raises(EnvContractError, match=r"reset: .*simultaneous = True.*\['p_0'\].*aec"):
        env.reset(seed=0)
    report = corral.check_env(FalselySimultaneous(), raise_on_error=False, episodes=1)
    assert report.violations == [
        "reset: the env declares simultaneous = True, but obs holds ['p_0'] while env.agents "
        "is ['p_0', 'p_1']; every live agent must act at every step of a simultaneous env",
        "step 0: the env declares simultaneous = True, but obs holds ['p_1'] while env.agents "
        "is ['p_0', 'p_1']; every live agent must act at every step of a simultaneous env",
    ]
    assert corral.check_env(corral.make("corral/tag"), raise_on_error=False).ok


def test_bad_arguments_are_refused() -> None:
    with pytest.raises(ValueError, match="api must be 'parallel' or 'aec'"):
        corral.to_pettingzoo("corral/tag", api="Parallel")
    with pytest.raises(TypeError, match=r"\['num_rounds'\] build an env from a registered id"):
        corral.to_pettingzoo(corral.make("corral/rps"), num_rounds=2)
    with pytest.raises(TypeError, match="not a multi-agent env"):
        corral.to_pettingzoo(object())


def test_ids_with_kwargs_are_made_by_corral() -> None:
    env = corral.to_pettingzoo("corral/tag", num_prey=3, max_cycles=7)
    assert env.possible_agents == [f"predator_{i}" for i in range(2)] + [
        f"prey_{i}" for i in range(3)
    ]
    assert env.env.max_cycles == 7 and str(env) == "tag"


# --- PettingZoo's suites -------------------------------------------------------------------

# parallel_seed_test samples one step of actions without masks; at its seed (42) they are legal
# in corral/tag, whose step would otherwise raise an InvalidActionError.
SIMULTANEOUS = {
    "simple_spread": (lambda **kw: corral.to_pettingzoo("mpe2/simple_spread_v3", **kw), set()),
    "simple_tag": (lambda **kw: corral.to_pettingzoo("mpe2/simple_tag_v3", **kw), set()),
    "corral_tag": (
        lambda **kw: corral.to_pettingzoo("corral/tag", mask_in_obs=True, **kw),
        TWO_KINDS,
    ),
    # corral/memory: blank observations between the cue and the query
    "corral_memory": (lambda **kw: corral.to_pettingzoo("corral/memory", **kw), {ALL_ZEROS}),
    "goofspiel": (
        lambda **kw: corral.to_pettingzoo(
            "openspiel/goofspiel", num_cards=4, mask_in_obs=True, **kw
        ),
        DICT_OBS,
    ),
}


def simultaneous(name: str) -> tuple[Callable[..., Any], set[str]]:
    if name == "goofspiel":
        pytest.importorskip("pyspiel")
    return SIMULTANEOUS[name]


@pytest.mark.parametrize("name", SIMULTANEOUS)
def test_parallel_exports_pass_the_parallel_suites(name: str) -> None:
    make, _ = simultaneous(name)
    assert warned(parallel_api_test, make(), num_cycles=200) == set()
    assert warned(parallel_seed_test, make) == set()


@pytest.mark.parametrize("name", SIMULTANEOUS)
def test_parallel_exports_pass_api_test_through_parallel_to_aec(name: str) -> None:
    make, expected = simultaneous(name)
    assert warned(api_test, parallel_to_aec(make()), num_cycles=200) == expected


@pytest.mark.parametrize("name", SIMULTANEOUS)
def test_simultaneous_envs_also_export_as_aec(name: str) -> None:
    make, expected = simultaneous(name)
    env = make(api="aec")
    assert env.metadata["is_parallelizable"] is True
    assert warned(api_test, env, num_cycles=200) == expected
    assert warned(seed_test, lambda: make(api="aec"), num_cycles=200) == set()


@pytest.mark.parametrize("name", ["simple_spread_v3", "simple_tag_v3"])
def test_mpe2_exports_warn_exactly_as_the_raw_envs(name: str) -> None:
    raw = warned(parallel_api_test, raw_mpe2(name), num_cycles=200)
    raw |= warned(api_test, parallel_to_aec(raw_mpe2(name)), num_cycles=200)
    export = warned(parallel_api_test, corral.to_pettingzoo(f"mpe2/{name}"), num_cycles=200)
    export |= warned(api_test, parallel_to_aec(corral.to_pettingzoo(f"mpe2/{name}")), 200)
    assert export == raw


TURN_BASED = {
    "tictactoe": (lambda: corral.to_pettingzoo("pettingzoo/classic/tictactoe_v3"), {ALL_ZEROS}),
    "connect_four": (
        lambda: corral.to_pettingzoo("pettingzoo/classic/connect_four_v3"),
        {ALL_ZEROS},
    ),
    "kuhn_poker": (lambda: corral.to_pettingzoo("openspiel/kuhn_poker"), INFINITE_BOUNDS),
    "corral_rps": (lambda: corral.to_pettingzoo("corral/rps"), {ALL_ZEROS}),
    "corral_rps4": (lambda: corral.to_pettingzoo("corral/rps4"), {ALL_ZEROS}),
    "user_nim": (lambda: corral.to_pettingzoo(Nim()), {ALL_ZEROS}),
}


@pytest.mark.parametrize("name", TURN_BASED)
def test_aec_exports_pass_api_test_and_seed_test(name: str) -> None:
    if name == "kuhn_poker":
        pytest.importorskip("pyspiel")
    make, expected = TURN_BASED[name]
    assert warned(api_test, make(), num_cycles=200) == expected
    assert warned(seed_test, make, num_cycles=200) == set()


@pytest.mark.parametrize("name", ["tictactoe_v3", "connect_four_v3"])
def test_classic_exports_warn_exactly_as_the_raw_games(name: str) -> None:
    raw = importlib.import_module(CLASSIC[name][0]).env()
    export = corral.to_pettingzoo(f"pettingzoo/classic/{name}")
    assert warned(api_test, export, num_cycles=200) == warned(api_test, raw, num_cycles=200)


def test_max_cycles_test_on_mpe2() -> None:
    module = types.SimpleNamespace(
        parallel_env=lambda max_cycles: corral.to_pettingzoo(
            "mpe2/simple_spread_v3", max_cycles=max_cycles
        ),
        env=lambda max_cycles: corral.to_pettingzoo(
            "mpe2/simple_spread_v3", api="aec", max_cycles=max_cycles
        ),
    )
    assert warned(max_cycles_test, module) == set()


def test_render_test_on_mpe2(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SDL_VIDEODRIVER", "dummy")  # "human" mode opens a window
    monkeypatch.setenv("SDL_AUDIODRIVER", "dummy")

    def make(render_mode: str | None = None) -> Any:
        return corral.to_pettingzoo(
            "mpe2/simple_spread_v3", api="aec", render_mode=render_mode, max_cycles=5
        )

    assert make().metadata["render_modes"] == ["human", "rgb_array"]
    assert warned(render_test, make) == set()


def test_render_passes_through_text_modes() -> None:
    env = corral.to_pettingzoo("corral/tag", render_mode="ansi", num_prey=1, size=5)
    env.reset(seed=0)
    assert env.render_mode == "ansi" and env.render() == env.env.render()
    assert env.render().count("P") == 2 and env.render().count("o") == 1


# --- the export of a PettingZoo env is that env --------------------------------------------


def parallel_rollout(env: Any, seed: int, steps: int) -> list[Any]:
    """Everything ``env`` returns on a seeded rollout of random actions."""
    rng = np.random.default_rng(seed)
    seen = [tuple(map(dict, env.reset(seed=seed))), list(env.agents)]
    for _ in range(steps):
        if not env.agents:
            break
        actions = {}
        for agent in env.agents:
            space = env.action_space(agent)
            actions[agent] = (
                int(rng.integers(space.n))
                if isinstance(space, spaces.Discrete)
                else rng.uniform(space.low, space.high).astype(space.dtype)
            )
        # dict(): the raw env's rewards are a defaultdict
        seen += [tuple(map(dict, env.step(actions))), list(env.agents), env.state()]
    return seen


@pytest.mark.parametrize("name", ["simple_spread_v3", "simple_tag_v3", "simple_adversary_v3"])
def test_parallel_export_reproduces_the_raw_mpe2_env(name: str) -> None:
    raw = parallel_rollout(raw_mpe2(name, max_cycles=8), seed=3, steps=10)
    made = corral.to_pettingzoo(f"mpe2/{name}", max_cycles=8)
    adapted = corral.to_pettingzoo(raw_mpe2(name, max_cycles=8))
    for export in (made, adapted):
        for agent in export.possible_agents:
            assert export.observation_space(agent) == raw_mpe2(name).observation_space(agent)
        assert data_equivalence(parallel_rollout(export, seed=3, steps=10), raw)
        assert export.state_space == raw_mpe2(name).state_space
    assert len(raw) == 2 + 3 * 8  # the episode ran to its truncation, terminal obs included


class MaskedParallel(pettingzoo.ParallelEnv):
    """A parallel env with Dict observations carrying action masks, whose agents end apart:
    ``b`` terminates at step 2, ``a`` is truncated at step 4. Action 1 is legal at odd steps."""

    metadata = {"name": "masked_parallel"}
    possible_agents = ["a", "b"]

    def __init__(self) -> None:
        mask = spaces.Box(0, 1, (3,), np.int8)
        self._obs_space = spaces.Dict(
            {"observation": spaces.Box(0, 9, (1,), np.float32), "action_mask": mask}
        )
        self._act_space = spaces.Discrete(3)

    def observation_space(self, agent: str) -> spaces.Space:
        return self._obs_space

    def action_space(self, agent: str) -> spaces.Space:
        return self._act_space

    def reset(self, seed: int | None = None, options: dict | None = None) -> tuple:
        self.t = 0
        self.agents = list(self.possible_agents)
        return self._obs(), {a: {"t": 0} for a in self.agents}

    def _obs(self) -> dict:
        mask = np.array([1, self.t % 2, 1], np.int8)
        return {
            a: {"observation": np.array([self.t], np.float32), "action_mask": mask.copy()}
            for a in self.agents
        }

    def step(self, actions: dict) -> tuple:
        self.t += 1
        rewards = {a: float(actions[a]) for a in self.agents}
        terms = {a: a == "b" and self.t == 2 for a in self.agents}
        truncs = {a: self.t == 4 for a in self.agents}
        obs, infos = self._obs(), {a: {"t": self.t} for a in self.agents}
        self.agents = [a for a in self.agents if not (terms[a] or truncs[a])]
        return obs, rewards, terms, truncs, infos


def test_parallel_export_gives_back_dict_observations_with_their_masks() -> None:
    raw, export = MaskedParallel(), corral.to_pettingzoo(MaskedParallel())
    assert export.observation_space("a") == raw.observation_space("a")
    assert export.observation_space("a") is export.observation_space("a")
    got, want = [export.reset(seed=0)], [raw.reset(seed=0)]
    alive = [list(export.agents)]
    for actions in ({"a": 0, "b": 2}, {"a": 1, "b": 1}, {"a": 2}, {"a": 1}):
        got.append(export.step(actions))
        want.append(raw.step(actions))
        alive.append(list(export.agents))
    for (obs, *_, infos), (raw_obs, *_, raw_infos), acting in zip(got, want, alive, strict=True):
        assert data_equivalence(obs, raw_obs)
        for agent, info in infos.items():  # the mask is also in infos, where the agent acts next
            mask = {"action_mask": raw_obs[agent]["action_mask"]} if agent in acting else {}
            assert data_equivalence(info, {**raw_infos[agent], **mask})
    assert data_equivalence([g[1:4] for g in got[1:]], [w[1:4] for w in want[1:]])
    assert export.agents == [] and "b" in got[2][0] and set(got[4][0]) == {"a"}


CLASSIC = {
    "tictactoe_v3": ("pettingzoo.classic.tictactoe.tictactoe", {}),
    "connect_four_v3": ("pettingzoo.classic.connect_four.connect_four", {}),
    "rps_v2": ("pettingzoo.classic.rps.rps", {}),
    "go_v5": ("pettingzoo.classic.go.go", {"board_size": 5}),
    "leduc_holdem_v4": ("pettingzoo.classic.rlcard_envs.leduc_holdem", {}),
}


def aec_turns(env: Any, seed: int, actions: list[int] | None = None) -> tuple[list, dict, list]:
    """PettingZoo's loop on ``env``: what ``last()`` and ``rewards`` say at each live turn,
    what each agent saw at its dead step, and the actions played (random legal ones unless
    ``actions`` are given)."""
    env.reset(seed=seed)
    rng = np.random.default_rng(seed)
    live, dead, played = [], {}, []
    for agent in env.agent_iter():
        obs, reward, term, trunc, info = env.last()
        mask = obs["action_mask"] if isinstance(obs, dict) else None
        if term or trunc:
            dead[agent] = (obs, float(reward), term, trunc, info)
            env.step(None)
            assert not any(env.rewards.values())  # rewards are cleared by a dead step
            continue
        if "action_mask" in info:  # the export keeps the mask in infos too
            assert np.array_equal(info.pop("action_mask"), mask)
        live.append((agent, obs, float(reward), term, trunc, info, list(env.agents)))
        legal = np.flatnonzero(mask) if mask is not None else np.arange(env.action_space(agent).n)
        action = actions.pop(0) if actions is not None else int(rng.choice(legal))
        played.append(action)
        env.step(action)
        live.append({a: float(r) for a, r in env.rewards.items()})
    return live, dead, played


@pytest.mark.parametrize("name", CLASSIC)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_aec_export_reproduces_the_raw_classic_game(name: str, seed: int) -> None:
    module, kwargs = CLASSIC[name]
    if "rlcard" in module:
        pytest.importorskip("rlcard")
    raw = importlib.import_module(module).env(**kwargs)
    export = corral.to_pettingzoo(f"pettingzoo/classic/{name}", **kwargs)
    assert export.possible_agents == raw.possible_agents
    for agent in raw.possible_agents:
        assert export.observation_space(agent) == raw.observation_space(agent)
        assert export.action_space(agent) == raw.action_space(agent)
    raw_live, raw_dead, played = aec_turns(raw, seed)
    live, dead, _ = aec_turns(export, seed, list(played))
    assert data_equivalence(live, raw_live)
    # Dead steps are compared as a set: PettingZoo leaves their order to the env.
    assert data_equivalence(dead, raw_dead) and set(dead) == set(raw.possible_agents)


def test_the_adapters_keep_the_mask_that_came_with_the_last_observation() -> None:
    env = corral.make("pettingzoo/classic/tictactoe_v3")
    obs, infos = env.reset(seed=0)
    for action in (0, 3, 1, 4, 2):  # player_1 fills the top row
        obs, _, terms, _, infos = env.step({next(iter(obs)): action})
    assert terms == {"player_1": True, "player_2": True}
    for info in infos.values():  # what the raw game showed with its final board
        assert info["final_obs"].shape == (3, 3, 2)
        assert info["final_action_mask"].dtype == np.int8
    assert infos["player_2"]["final_action_mask"].tolist() == [0, 0, 0, 0, 0, 1, 1, 1, 1]


def test_classic_without_mask_in_obs_gives_the_observation_part() -> None:
    env = corral.to_pettingzoo("pettingzoo/classic/connect_four_v3", mask_in_obs=False)
    assert env.observation_space("player_0") == spaces.Box(0, 1, (6, 7, 2), np.int8)
    env.reset(seed=0)
    obs, _, _, _, info = env.last()
    assert obs.shape == (6, 7, 2) and info["action_mask"].tolist() == [1] * 7


# --- corral's own loop against the export, and PettingZoo's loop ---------------------------


def pettingzoo_parallel_loop(env: Any, seed: int, choose: Callable) -> list[dict]:
    """The standard PettingZoo loop: it reads next_obs[agent] for every agent that acted."""
    obs, infos = env.reset(seed=seed)
    transitions = []
    while env.agents:
        actions = {a: choose(env, a, obs[a], infos[a]) for a in env.agents}
        next_obs, rewards, terms, truncs, infos = env.step(actions)
        transitions.append({a: (next_obs[a], rewards[a], terms[a] or truncs[a]) for a in actions})
        obs = next_obs
    return transitions


def corral_loop(env: Any, seed: int, choose: Callable) -> list[dict]:
    """corral's loop on the same env: an ended agent's last observation is in infos."""
    obs, infos = env.reset(seed=seed)
    transitions = []
    while env.agents:
        actions = {a: choose(env, a, obs[a], infos[a]) for a in obs}
        obs, rewards, terms, truncs, infos = env.step(actions)
        done = {a: terms[a] or truncs[a] for a in actions}
        transitions.append(
            {
                a: (infos[a]["final_obs"] if done[a] else obs[a], rewards[a], done[a])
                for a in actions
            }
        )
    return transitions


def legal(seed: int) -> Callable:
    rng = np.random.default_rng(seed)

    def choose(env: Any, agent: str, observation: Any, info: Mapping) -> int:
        return int(rng.choice(np.flatnonzero(info["action_mask"])))

    return choose


@pytest.mark.parametrize(
    ("env_id", "kwargs"),
    [
        ("mpe2/simple_spread_v3", {"max_cycles": 10, "continuous_actions": False}),
        ("corral/tag", {"size": 4, "walls": [], "max_cycles": 30}),
    ],
)
def test_pettingzoo_loop_reads_next_obs_of_every_agent_that_acted(
    env_id: str, kwargs: dict
) -> None:
    def choose(seed: int) -> Callable:
        if env_id.startswith("mpe2"):
            rng = np.random.default_rng(seed)
            return lambda env, agent, *_: int(rng.integers(env.action_space(agent).n))
        return legal(seed)

    for seed in range(4):
        export = pettingzoo_parallel_loop(
            corral.to_pettingzoo(env_id, **kwargs), seed, choose(seed)
        )
        own = corral_loop(corral.make(env_id, **kwargs), seed, choose(seed))
        assert data_equivalence(export, own)
    # corral/tag on a small open grid: some prey were caught before the end
    if env_id == "corral/tag":
        assert any(len(step) < len(export[0]) for step in export)


def test_parallel_step_after_the_end_returns_empty_dicts() -> None:
    env = corral.to_pettingzoo("mdp/climbing")
    env.reset(seed=0)
    env.step({a: 0 for a in env.agents})
    assert env.agents == []
    assert env.step({}) == ({}, {}, {}, {}, {})


def test_tag_with_masks_in_observations() -> None:
    env = corral.to_pettingzoo("corral/tag", mask_in_obs=True, size=4, walls=[], max_cycles=30)
    assert env.observation_space("predator_0")["action_mask"] == spaces.Box(0, 1, (5,), np.int8)
    assert env.observation_space("prey_0")["action_mask"] == spaces.Box(0, 1, (9,), np.int8)
    assert env.observation_space("prey_0")["observation"] == env.env.observation_space("prey_0")
    obs, infos = env.reset(seed=1)
    rng = np.random.default_rng(1)
    caught = 0
    while env.agents:
        for agent in env.agents:
            assert np.array_equal(obs[agent]["action_mask"], infos[agent]["action_mask"])
            assert env.observation_space(agent).contains(obs[agent])
        actions = {a: int(rng.choice(np.flatnonzero(obs[a]["action_mask"]))) for a in env.agents}
        obs, _, terms, _, infos = env.step(actions)
        for agent in [a for a in terms if terms[a] and a.startswith("prey")]:
            caught += 1  # an ended agent has no legal action left
            assert obs[agent]["action_mask"].tolist() == [0] * 9
    assert caught > 0


class CountedRPS4(RockPaperScissors4):
    """corral/rps4, counting its steps."""

    steps = 0

    def step(self, actions: Mapping) -> tuple:
        self.steps += 1
        return super().step(actions)


def test_aec_export_of_an_asynchronous_env_selects_only_the_agents_that_act() -> None:
    corral_env = CountedRPS4(num_cycles=2)
    env = corral.to_pettingzoo(corral_env)
    env.reset(seed=0)
    schedule = [["player_0", "player_1"], ["player_2", "player_3"], ["player_2", "player_3"]]
    selected, since_action, earned = [], dict.fromkeys(env.possible_agents, 0.0), []
    for agent in env.agent_iter():
        _, reward, term, trunc, _ = env.last()
        assert reward == since_action[agent]  # what it earned since it last acted
        since_action[agent] = 0.0
        if term or trunc:
            env.step(None)
            continue
        selected.append(agent)
        first_of_pair = len(selected) % 2 == 1
        before = corral_env.steps
        env.step(1 if agent in ("player_0", "player_2") else 0)  # paper beats rock
        # The corral step runs only once the last of the acting agents has acted.
        assert corral_env.steps == before + (not first_of_pair)
        if first_of_pair:
            assert not any(env.rewards.values())
        else:
            earned.append(dict(env.rewards))
        for a, r in env.rewards.items():
            since_action[a] += r
    assert selected == [a for pair in schedule * 2 for a in pair]
    assert earned[0] == {"player_0": 1.0, "player_1": -1.0, "player_2": 0.0, "player_3": 0.0}
    assert earned[1] == {"player_0": 0.0, "player_1": 0.0, "player_2": 1.0, "player_3": -1.0}


def test_aec_export_refuses_bad_actions_without_changing_anything() -> None:
    env = corral.to_pettingzoo("pettingzoo/classic/tictactoe_v3")
    env.reset(seed=0)
    env.step(4)
    with pytest.raises(InvalidActionError, match=r"agent 'player_2'.*legal action.*forbids 4"):
        env.step(4)
    with pytest.raises(InvalidActionError, match=r"agent 'player_2'.*integer in \[0, 8\]"):
        env.step(None)
    assert env.agent_selection == "player_2" and env.env.env.board.squares[4] == 1
    env.step(0)
    assert env.agent_selection == "player_1"


def test_a_dead_step_takes_only_none() -> None:
    env = corral.to_pettingzoo("corral/rps", num_rounds=1)
    env.reset(seed=0)
    env.step(0)
    env.step(1)
    assert env.terminations == {"player_0": True, "player_1": True}
    with pytest.raises(InvalidActionError, match=r"'player_0' has terminated.*only valid .* None"):
        env.step(0)
    env.step(None)
    env.step(None)
    assert env.agents == [] and env.rewards == {} and env._cumulative_rewards == {}
    with pytest.raises(EpisodeOverError, match="step 2: no agent is left to act"):
        env.step(None)


def test_state_passes_through() -> None:
    env = corral.to_pettingzoo("corral/rps4", num_cycles=1)
    env.reset(seed=0)
    assert env.state_space is env.env.state_space
    assert np.array_equal(env.state(), env.env.state())
    assert not hasattr(corral.to_pettingzoo(Nim()), "state_space")
    with pytest.raises(NotImplementedError, match="no global state"):
        corral.to_pettingzoo(Nim()).state()


# --- packaging -----------------------------------------------------------------------------


def test_missing_pettingzoo_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("corral.export.to_pettingzoo_parallel", "corral.export.to_pettingzoo_aec"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    monkeypatch.setitem(sys.modules, "pettingzoo", None)
    with pytest.raises(MissingDependencyError, match=r"pip install 'corral\[pettingzoo\]'"):
        corral.to_pettingzoo("corral/tag")


def test_importing_corral_does_not_import_pettingzoo() -> None:
    code = "import sys, corral; corral.to_gymnasium; print('pettingzoo' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "False"
