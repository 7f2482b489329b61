"""Gymnasium envs that play several agents in one env, as corral envs (EPyMARL's convention).

Level-Based Foraging (``lbforaging``), the multi-robot warehouse (``rware``) and
the other envs of EPyMARL's ``gymma`` wrapper are one ``gymnasium.Env`` for all
their agents: ``env.unwrapped.n_agents`` agents, ``Tuple`` observation and
action spaces with one entry per agent, ``step`` taking a tuple of actions and
returning a tuple of observations and a list of rewards. Entry ``i`` is the
agent ``agent_i``. Every agent acts at every step and all end together: when
the env's ``terminated`` (a bool, or a list that must be all true, as gymma
reads it) or ``truncated`` is true. Gymnasium's ``info`` dict is every agent's
``infos`` entry.

LBF and RWARE end at their own step limit with the same ``terminated`` flag as
at a real end. A *time-limit rule*, ``rule(env.unwrapped) -> bool`` asked after
a step that the env calls done, tells the two apart: where it is true the end
is reported as a truncation. What this module knows of LBF and RWARE beyond the
convention, by package (:data:`KNOWN`): that rule, RWARE's step limit (its own
``max_steps``, not a ``TimeLimit`` wrapper), and their ``rgb_array`` frames
(:mod:`corral.adapters.grid_frames`). An env of another package has its
``terminated`` reported as is unless the adapter is given a rule.

``corral.adapt(gymnasium.make("Foraging-8x8-2p-3f-v3"))`` picks this adapter;
a Gymnasium env that declares several agents without following the convention
is refused with an :class:`~corral.errors.UnsupportedEnvError` saying what is
missing. The ``lbf/...`` and ``rware/...`` ids are in :mod:`corral.adapters.catalog`.
"""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import gymnasium
import numpy as np
from gymnasium import spaces

from corral.adapters import SourceAdapter, register_adapter
from corral.adapters.grid_frames import lbf_frame, rware_frame
from corral.adapters.gymnasium import declares_agents, make_gymnasium, time_limit
from corral.env import AgentID, InfoDict, ObsDict, StepResult, validate_actions
from corral.errors import UnsupportedEnvError

TimeLimitRule = Callable[[gymnasium.Env], bool]
"""Whether an env (the unwrapped one), done after its last step, stopped at a time limit."""

CONVENTION = (
    "one Gymnasium env for all agents, as EPyMARL's gymma reads it: an int "
    "env.unwrapped.n_agents, and observation_space and action_space Tuples of one space "
    "per agent"
)


class MultiAgentGymnasiumAdapter(SourceAdapter):
    """A ``gymnasium.Env`` of ``n_agents`` agents with ``Tuple`` spaces, as agents ``agent_i``.

    Raises :class:`~corral.errors.UnsupportedEnvError` if ``env`` does not follow
    the convention (``n_agents`` missing, spaces that are not Tuples of
    ``n_agents`` entries), and in ``step`` if the env returns observations or
    rewards that are not one per agent. Attributes the adapter lacks are read
    from the Gymnasium env and the wrappers inside it (``adapter.n_agents``).

    ``time_limit_reached(env.unwrapped)``, asked after a step whose
    ``terminated`` is true, says whether the env stopped at a time limit: the
    end is then a truncation (``truncated`` true, ``terminated`` false). Left
    out, it is this module's rule for the package that defines the unwrapped
    env's class (LBF's and RWARE's), if any; with none, ``terminated`` is
    reported as the env gives it. A picklable rule (a module-level function)
    keeps the adapter picklable.

    The envs of a package with a drawing in :mod:`corral.adapters.grid_frames` (LBF's
    and RWARE's) render ``rgb_array`` frames drawn by corral, without a display.
    """

    simultaneous = True  # every agent acts at every step

    def __init__(self, env: gymnasium.Env, time_limit_reached: TimeLimitRule | None = None) -> None:
        problem = convention_problem(env)
        if problem is not None:
            raise UnsupportedEnvError(
                f"{_name(env)} does not follow the multi-agent Gymnasium convention "
                f"({CONVENTION}): {problem}. A single-agent env with Tuple spaces can be "
                "wrapped with corral.adapters.gymnasium.GymnasiumEnvAdapter(env)"
            )
        self.env = env
        observation_spaces, action_spaces = env.observation_space, env.action_space
        assert isinstance(observation_spaces, spaces.Tuple)  # convention_problem checked them
        assert isinstance(action_spaces, spaces.Tuple)
        self.possible_agents = [f"agent_{i}" for i in range(len(action_spaces))]
        self._observation_spaces = dict(zip(self.possible_agents, observation_spaces, strict=True))
        self._action_spaces = dict(zip(self.possible_agents, action_spaces, strict=True))
        self.metadata = dict(env.metadata)
        self.render_mode = env.render_mode
        known = KNOWN.get(_package(env), Known())
        self._frame, self._step_limit = known.frame, known.step_limit
        if self._frame is not None:
            modes = list(self.metadata.get("render_modes") or [])
            if "rgb_array" not in modes:
                modes.append("rgb_array")
            self.metadata["render_modes"] = modes
        self.agents = []
        self._step = 0
        if time_limit_reached is None:
            time_limit_reached = known.time_limit_reached
        self.time_limit_reached = time_limit_reached

    @property
    def max_episode_steps(self) -> int | None:  # type: ignore[override]
        """The first of the Gymnasium env's time limit (its ``TimeLimit`` wrapper) and its
        package's own (LBF's ``max_episode_steps``, RWARE's ``max_steps``), or ``None``."""
        own = None if self._step_limit is None else self._step_limit(self.env.unwrapped)
        limits = [n for n in (time_limit(self.env), own) if n is not None]
        return min(limits, default=None)

    def observation_space(self, agent: AgentID) -> spaces.Space:
        return self._observation_spaces[agent]

    def action_space(self, agent: AgentID) -> spaces.Space:
        return self._action_spaces[agent]

    def reset(
        self, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[ObsDict, InfoDict]:
        observations, info = self.env.reset(seed=seed, options=options)
        self.agents = list(self.possible_agents)
        self._step = 0
        obs = dict(zip(self.agents, self._per_agent(observations, "observations"), strict=True))
        return obs, {agent: dict(info) for agent in self.agents}

    def step(self, actions: Mapping[AgentID, Any]) -> StepResult:
        if self.check_actions:
            validate_actions(actions, self.agents, self.action_space, {}, self._step)
        observations, rewards, terminated, truncated, info = self.env.step(
            tuple(actions[agent] for agent in self.agents)
        )
        agents = self.agents
        observations = self._per_agent(observations, "observations")
        rewards = self._per_agent(rewards, "rewards")
        self._step += 1
        ended_by = _all_true(terminated), _all_true(truncated)
        if ended_by[0] and self._stopped_at_time_limit():
            ended_by = False, True
        infos = {agent: dict(info) for agent in agents}
        obs = dict(zip(agents, observations, strict=True))
        if any(ended_by):
            for agent in agents:
                infos[agent]["final_obs"] = obs[agent]
            obs = {}
            self.agents = []
        return (
            obs,
            {agent: float(reward) for agent, reward in zip(agents, rewards, strict=True)},
            dict.fromkeys(agents, ended_by[0]),
            dict.fromkeys(agents, ended_by[1]),
            infos,
        )

    def render(self) -> Any:
        if self.render_mode == "rgb_array" and self._frame is not None:
            return self._frame(self.env.unwrapped)
        return self.env.render()

    def close(self) -> None:
        self.env.close()

    def _stopped_at_time_limit(self) -> bool:
        rule = self.time_limit_reached
        return rule is not None and bool(rule(self.env.unwrapped))

    def _per_agent(self, values: Any, what: str) -> Sequence[Any] | np.ndarray:
        """``values`` if it holds one entry per agent, else an ``UnsupportedEnvError``."""
        n = len(self.possible_agents)
        if not isinstance(values, Sequence | np.ndarray) or len(values) != n:
            raise UnsupportedEnvError(
                f"{_name(self.env)}, step {self._step}: expected {what} for each of its "
                f"{n} agents (a sequence of {n}), got {type(values).__name__} {values!r:.80}"
            )
        return values


def convention_problem(env: gymnasium.Env) -> str | None:
    """What keeps ``env`` from the multi-agent Gymnasium convention, or ``None``."""
    n = getattr(env.unwrapped, "n_agents", None)
    if n is None:
        return "env.unwrapped has no n_agents"
    if not isinstance(n, int | np.integer) or isinstance(n, bool) or n < 1:
        return f"n_agents is {n!r}, not a positive int"
    for kind, space in (("observation", env.observation_space), ("action", env.action_space)):
        if not isinstance(space, spaces.Tuple):
            return f"its {kind}_space is {space}, not a Tuple"
        if len(space) != n:
            return f"its {kind}_space has {len(space)} entries for n_agents={n}"
    return None


LIMIT = "max_episode_steps"
"""``gymnasium.make``'s argument that wraps an env in a ``TimeLimit``."""


def make_from_package(package: str, name: str, **kwargs: Any) -> SourceAdapter:
    """The Gymnasium env ``name`` that importing ``package`` registers, as a corral env.

    Gymnasium's env checker is off unless ``disable_env_checker=False`` is given:
    it expects a single agent, and warns at the first list of rewards. An argument
    known to break the package's constructor (:attr:`Known.broken`) that makes it fail
    is an :class:`~corral.errors.UnsupportedEnvError` saying so.
    """
    importlib.import_module(package)
    kwargs.setdefault("disable_env_checker", True)
    known = KNOWN.get(package, Known())
    limit = kwargs.get(LIMIT)
    registered = gymnasium.registry.get(name)
    made: str | gymnasium.envs.registration.EnvSpec = name
    if limit is not None and registered is not None and LIMIT in registered.kwargs:
        # the constructor's own limit has the name of gymnasium.make's, which takes it
        made = dataclasses.replace(registered, kwargs={**registered.kwargs, LIMIT: limit})
    drawn = known.frame is not None and kwargs.get("render_mode") == "rgb_array"
    if drawn:  # corral draws the frames: the env itself need not know (LBF has no such mode)
        del kwargs["render_mode"]
    try:
        env = make_gymnasium(made, **kwargs)
    except ValueError as err:
        given = [arg for arg in known.broken if kwargs.get(arg)]
        if not given:
            raise
        raise UnsupportedEnvError(
            f"{package} could not build {name} with {given[0]}={kwargs[given[0]]!r}: "
            f"{known.broken[given[0]]} ({err}); leave {given[0]} out"
        ) from err
    if drawn:
        env.render_mode = "rgb_array"
    own = None if known.step_limit is None else known.step_limit(env.env.unwrapped)
    if limit is not None and own is not None and own < limit:
        env.close()
        raise UnsupportedEnvError(
            f"{package} ends {name}'s episodes at its own limit of {own} steps, before "
            f"max_episode_steps={limit}: raise that limit ({known.limit_name}={limit})"
        )
    return env


def _lbf_food_left(env: Any) -> bool:
    """LBF 2.0 is done when no food is left or at ``max_episode_steps``: food left, a time limit."""
    return bool(env.field.any())


def _lbf_max_steps(env: Any) -> int | None:
    """LBF 2.0's step limit, its ``max_episode_steps`` (50 by default)."""
    steps = getattr(env, "_max_episode_steps", None)
    return None if steps is None else int(steps)


def _rware_no_terminal_state(env: Any) -> bool:
    """RWARE 2.0 is done only at ``max_steps`` or after ``max_inactivity_steps`` idle steps."""
    return True


def _rware_max_steps(env: Any) -> int | None:
    """RWARE 2.0's step limit, its ``max_steps`` (``None``: none)."""
    return None if env.max_steps is None else int(env.max_steps)


@dataclass(frozen=True)
class Known:
    """What corral knows of one package's envs beyond the convention."""

    time_limit_reached: TimeLimitRule | None = None
    """Whether a done env stopped at a time limit (see the module's docstring)."""
    step_limit: Callable[[Any], int | None] | None = None
    """The env's own step limit, where no ``TimeLimit`` wrapper holds it."""
    frame: Callable[[Any], np.ndarray] | None = None
    """An ``rgb_array`` frame of the env's state, drawn by corral."""
    broken: Mapping[str, str] = field(default_factory=dict)
    """Arguments known to break the package's constructor, and why."""
    limit_name: str = LIMIT
    """The constructor's argument that sets :attr:`step_limit`."""


KNOWN: dict[str, Known] = {
    "lbforaging": Known(
        _lbf_food_left,
        _lbf_max_steps,
        frame=lbf_frame,
        broken={
            "grid_observation": "lbforaging 2.0.0 declares the grid observations' space with "
            "the shape of one axis, and Gymnasium refuses it"
        },
    ),
    "rware": Known(_rware_no_terminal_state, _rware_max_steps, rware_frame, limit_name="max_steps"),
}
"""What corral knows of the envs of a package, by the top-level package of their class."""


def _package(env: gymnasium.Env) -> str:
    """The top-level package of the module that defines the unwrapped env's class."""
    return type(env.unwrapped).__module__.partition(".")[0]


def _all_true(flag: Any) -> bool:
    """A Gymnasium end flag, or gymma's list of one per agent (true when all are)."""
    return bool(np.all(flag))


def _name(env: gymnasium.Env) -> str:
    spec = env.spec
    return f"Gymnasium env {spec.id!r}" if spec is not None else type(env.unwrapped).__name__


def _is_multi_agent_env(env: Any) -> bool:
    return isinstance(env, gymnasium.Env) and declares_agents(env)


register_adapter(_is_multi_agent_env, MultiAgentGymnasiumAdapter)
