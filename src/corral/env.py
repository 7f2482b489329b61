"""The env contract: one interface for simultaneous, turn-based and asynchronous envs.

It has the members of the PettingZoo Parallel API, read corral's way: **the
keys of the observation dict are the agents that must act next.** (PettingZoo's
own tools want its conventions; :func:`corral.to_pettingzoo` exports an env
with them.)

* ``reset(seed, options) -> (obs, infos)`` and
  ``step(actions) -> (obs, rewards, terminations, truncations, infos)``.
* ``actions`` holds exactly the agents that were keys of the last ``obs``.
* ``rewards``, ``terminations`` and ``truncations`` hold every agent that was
  alive when the step began; ``rewards[a]`` is what ``a`` earned during this
  step, whether or not it acted in it.
* An agent whose episode ends in a step (terminated or truncated) leaves
  ``agents`` and ``obs``; its last observation is ``infos[a]["final_obs"]``.
* ``infos`` holds every agent in ``obs`` and every agent that ended in the
  step. Legal actions of a discrete agent are ``infos[a]["action_mask"]``, an
  ``int8`` array of 0/1 (the dtype ``gymnasium.spaces.Discrete.sample`` takes).
* Optional: ``state()`` and ``state_space`` for a global state.
* Optional: ``simultaneous = True`` declares that every live agent acts at
  every step (``obs`` keys equal ``agents``). Undeclared envs are treated as
  turn-based or asynchronous; :func:`corral.to_pettingzoo` reads it to pick
  PettingZoo's Parallel or AEC API.

Any object with these members is an env; :class:`MultiAgentEnv` documents them
and gives defaults, and :func:`validate_actions` gives every env the same
clear errors for bad actions.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import numpy as np
from gymnasium import spaces

from corral.errors import EpisodeOverError, InvalidActionError
from corral.spaces import action_problem

AgentID = str
ObsDict = dict[AgentID, Any]
InfoDict = dict[AgentID, dict[str, Any]]
BoolDict = dict[AgentID, bool]
StepResult = tuple[ObsDict, dict[AgentID, float], BoolDict, BoolDict, InfoDict]


class MultiAgentEnv:
    """Base class of corral envs. Inheriting from it is optional.

    Subclasses set ``possible_agents`` and ``agents`` and implement
    :meth:`observation_space`, :meth:`action_space`, :meth:`reset` and
    :meth:`step`; global-state envs also set ``state_space`` and implement
    :meth:`state`.
    """

    metadata: dict[str, Any] = {"render_modes": []}
    possible_agents: list[AgentID] = []
    agents: list[AgentID] = []
    render_mode: str | None = None
    simultaneous: bool = False
    """Every live agent acts at every step (``obs`` keys equal ``agents``), as in
    a PettingZoo ``ParallelEnv``. Leave it ``False`` for turn-based and
    asynchronous envs; :func:`corral.to_pettingzoo` exports those as AEC envs."""
    check_actions: bool = True
    """Validate actions in ``step``. A vector env turns this off for the envs it
    runs: it has validated the whole batch of actions before they arrive."""
    max_episode_steps: int | None = None
    """The most steps an episode lasts, where the env knows it: a time limit
    that truncates it (mpe2's ``max_cycles``) or a bound of the game; else ``None``."""

    def observation_space(self, agent: AgentID) -> spaces.Space:
        """The observation space of ``agent``; fixed for the env's lifetime."""
        raise NotImplementedError

    def action_space(self, agent: AgentID) -> spaces.Space:
        """The action space of ``agent``; fixed for the env's lifetime."""
        raise NotImplementedError

    def reset(
        self, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[ObsDict, InfoDict]:
        """Start an episode; returns the observations of the agents that act first."""
        raise NotImplementedError

    def step(self, actions: Mapping[AgentID, Any]) -> StepResult:
        """Apply the actions of exactly the agents that must act."""
        raise NotImplementedError

    def render(self) -> Any:
        """A frame of the current state in ``render_mode``, or ``None``."""
        return None

    def check_render_mode(self, render_mode: str | None, hint: str = "") -> None:
        """Raise ``ValueError`` unless ``render_mode`` is ``None`` or in
        ``metadata["render_modes"]``; ``hint`` ends the message."""
        check_render_mode(render_mode, self.metadata.get("render_modes", []), hint)

    def close(self) -> None:
        """Release what the env holds; calling it twice is harmless."""

    @property
    def unwrapped(self) -> MultiAgentEnv:
        return self

    @property
    def num_agents(self) -> int:
        return len(self.agents)

    @property
    def max_num_agents(self) -> int:
        return len(self.possible_agents)


def check_render_mode(render_mode: str | None, modes: Sequence[str], hint: str = "") -> None:
    """Raise ``ValueError`` unless ``render_mode`` is ``None`` or one of ``modes`` (an env's
    ``metadata["render_modes"]``): the one render-mode rule of dict and batched envs."""
    if render_mode is None or render_mode in modes:
        return
    if not modes:
        expected = "None (the env cannot render)"
    elif len(modes) == 1:
        expected = f"None or {modes[0]!r}"
    else:
        expected = f"None or one of {list(modes)}"
    end = f"; {hint}" if hint else ""
    raise ValueError(f"render_mode must be {expected}, got {render_mode!r}{end}")


def spaces_by_agent_hint(kind: str) -> str:
    """How an env that keeps its spaces in a dict by agent meets the contract's method ``kind``
    (``"observation_space"`` or ``"action_space"``)."""
    return (
        "An env that keeps its spaces in a dict by agent (as XuanCe, RLlib and MALib do) can "
        f"keep it as self.{kind}s and add: def {kind}(self, agent): return self.{kind}s[agent]"
    )


def validate_actions(
    actions: Mapping[AgentID, Any],
    acting: Iterable[AgentID],
    action_space: Callable[[AgentID], spaces.Space],
    masks: Mapping[AgentID, np.ndarray | None] | None,
    step: int,
    env_index: int | None = None,
) -> None:
    """Raise :class:`InvalidActionError` unless ``actions`` fits the acting agents.

    Raises :class:`EpisodeOverError` when no agent is acting. Checks that
    exactly the ``acting`` agents have an action, that each action is in its
    agent's space, and that discrete actions are allowed by ``masks`` (agent ->
    0/1 array; an agent left out, or ``masks=None``, has every action allowed).
    The message names the agent, the step (and the env index, when given) and
    what was expected. Nothing is changed, so the env stays usable.
    """
    where = f"step {step}" if env_index is None else f"env {env_index}, step {step}"
    if not isinstance(actions, Mapping):
        raise InvalidActionError(
            f"{where}: actions must be a dict keyed by agent id, got {type(actions).__name__}"
        )
    acting = list(acting)
    masks = {} if masks is None else masks
    if not acting:
        raise EpisodeOverError(
            f"{where}: no agent is left to act (the episode ended, or reset() was never "
            "called); call reset() first"
        )
    for agent in actions:
        if agent not in acting:
            raise InvalidActionError(
                f"{where}: got an action for agent {agent!r}, which is not acting; "
                f"the agents that must act are {acting}"
            )
    for agent in acting:
        if agent not in actions:
            raise InvalidActionError(
                f"{where}: agent {agent!r} must act but has no action; "
                f"expected actions for {acting}"
            )
        problem = action_problem(action_space(agent), actions[agent], masks.get(agent))
        if problem is not None:
            raise InvalidActionError(f"{where}: agent {agent!r}: expected {problem}")
