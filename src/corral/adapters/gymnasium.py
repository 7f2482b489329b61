"""Single-agent Gymnasium envs as one-agent corral envs.

``corral.make("gym/CartPole-v1")`` builds ``gymnasium.make("CartPole-v1")``
(any Gymnasium id works, keyword arguments go to ``gymnasium.make``), and
``corral.adapt(gym_env)`` wraps an existing ``gymnasium.Env``. The one agent is
``agent_0``; Gymnasium's ``info`` dict becomes ``infos["agent_0"]``. An env that
declares several agents (:func:`declares_agents`) is left to
:mod:`corral.adapters.gymnasium_multi`.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Mapping
from typing import Any

import gymnasium
import numpy as np
from gymnasium import spaces

from corral.adapters import SourceAdapter, adapt, register_adapter
from corral.env import AgentID, InfoDict, ObsDict, StepResult, validate_actions
from corral.errors import UnknownEnvError

AGENT = "agent_0"


class GymnasiumEnvAdapter(SourceAdapter):
    """A single-agent ``gymnasium.Env`` as a corral env with the one agent ``agent_0``.

    When the episode ends (terminated or truncated) ``agents`` and ``obs`` are
    empty and the last observation is ``infos["agent_0"]["final_obs"]``. An
    ``action_mask`` in Gymnasium's info is passed on as an ``int8`` array and
    enforced on the next step (unless ``masks_bind`` is false). Attributes the adapter
    lacks are read from the Gymnasium env and the wrappers inside it (``adapter.spec``).
    """

    simultaneous = True  # one agent, acting at every step
    masks_bind = True
    """Whether an action that the info's ``action_mask`` forbids is refused. Gymnasium's masks
    are hints (Taxi's marks the moves that change the state): ``corral.to_gymnasium`` turns
    this off, so that the export takes every action the raw env takes."""

    def __init__(self, env: gymnasium.Env) -> None:
        self.env = env
        self.possible_agents = [AGENT]
        self.metadata = dict(env.metadata)
        self.render_mode = env.render_mode
        self.agents = []
        self._mask: np.ndarray | None = None
        self._step = 0

    @property
    def max_episode_steps(self) -> int | None:  # type: ignore[override]
        """The Gymnasium env's time limit (its ``TimeLimit`` wrapper), or ``None``."""
        return time_limit(self.env)

    def observation_space(self, agent: AgentID) -> spaces.Space:
        return self.env.observation_space

    def action_space(self, agent: AgentID) -> spaces.Space:
        return self.env.action_space

    def reset(
        self, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[ObsDict, InfoDict]:
        observation, info = self.env.reset(seed=seed, options=options)
        self.agents = [AGENT]
        self._step = 0
        return {AGENT: observation}, {AGENT: self._info(info)}

    def step(self, actions: Mapping[AgentID, Any]) -> StepResult:
        if self.check_actions:
            masks = {AGENT: self._mask} if self.masks_bind else {}
            validate_actions(actions, self.agents, self.action_space, masks, self._step)
        observation, reward, terminated, truncated, info = self.env.step(actions[AGENT])
        self._step += 1
        infos = {AGENT: self._info(info)}
        obs = {AGENT: observation}
        if terminated or truncated:
            infos[AGENT]["final_obs"] = observation
            obs = {}
            self.agents = []
        return (
            obs,
            {AGENT: float(reward)},
            {AGENT: bool(terminated)},
            {AGENT: bool(truncated)},
            infos,
        )

    def render(self) -> Any:
        return self.env.render()

    def close(self) -> None:
        self.env.close()

    def _info(self, info: dict[str, Any]) -> dict[str, Any]:
        """Gymnasium's info, with its action mask (if any) as ``int8``."""
        info = dict(info)
        self._mask = None
        if "action_mask" in info:
            self._mask = np.asarray(info["action_mask"]).astype(np.int8)
            info["action_mask"] = self._mask
        return info


def time_limit(env: gymnasium.Env) -> int | None:
    """The time limit of a Gymnasium env (its ``TimeLimit`` wrapper), or ``None``."""
    steps = getattr(env.spec, "max_episode_steps", None)
    if steps is None:  # a TimeLimit around an env registered nowhere has no spec
        with contextlib.suppress(AttributeError):
            steps = env.get_wrapper_attr("_max_episode_steps")
    return steps


def declares_agents(env: gymnasium.Env) -> bool:
    """Whether a Gymnasium env says it plays several agents at once.

    It does by declaring ``n_agents`` (EPyMARL's convention), or by having
    ``Tuple`` observation and action spaces.
    """
    return hasattr(env.unwrapped, "n_agents") or (
        isinstance(env.observation_space, spaces.Tuple)
        and isinstance(env.action_space, spaces.Tuple)
    )


def make_gymnasium(name: str | gymnasium.envs.registration.EnvSpec, **kwargs: Any) -> SourceAdapter:
    """``gymnasium.make(name, **kwargs)`` as a corral env, by the adapter that fits it
    (``name``: an id, or a spec of Gymnasium's registry)."""
    module = name.partition(":")[0] if isinstance(name, str) and ":" in name else None
    try:
        env = gymnasium.make(name, **kwargs)
    except ModuleNotFoundError as err:
        # Gymnasium raises its own ModuleNotFoundError, which names the module in its text
        named = re.findall(r"No module named '([\w.]+)'", str(err))
        missing = err.name or (named[0] if named else "")
        if module is None or not (module == missing or module.startswith(missing + ".")):
            raise  # a module that the env's own module imports: its error says which
        raise UnknownEnvError(
            f"gym/{name}: cannot import {module!r}, whose import registers the id with "
            f"Gymnasium: no module named {missing!r} (install it, or put the directory that "
            "holds it on PYTHONPATH)"
        ) from err
    return adapt(env)


def _is_single_agent_env(env: Any) -> bool:
    return isinstance(env, gymnasium.Env) and not declares_agents(env)


register_adapter(_is_single_agent_env, GymnasiumEnvAdapter)
