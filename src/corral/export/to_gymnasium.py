"""A single-agent corral env as a ``gymnasium.Env``: ``corral.to_gymnasium(env)``."""

from __future__ import annotations

from typing import Any

import gymnasium
from gymnasium import spaces

from corral.adapters.gymnasium import GymnasiumEnvAdapter
from corral.errors import ExportError
from corral.export.corral_env import env_name
from corral.export.observation_form import export_info


class GymnasiumEnvExport(gymnasium.Env):
    """A corral env with one agent as a ``gymnasium.Env``.

    ``step`` returns the last observation when the episode ends (Gymnasium's
    convention; corral puts it in ``infos[agent]["final_obs"]``), and the
    agent's info dict, with its ``action_mask`` when the env has one.
    ``reset(seed)`` seeds the corral env and, as Gymnasium asks of every env,
    ``np_random``. The corral env is ``export.env``; ``name`` names it in errors (by
    default its class and ``metadata["name"]``).
    """

    def __init__(self, env: Any, *, name: str | None = None) -> None:
        agents = list(env.possible_agents)
        if len(agents) != 1:
            raise ExportError(
                f"corral.to_gymnasium needs an env with one agent, but {name or env_name(env)} has "
                f"{len(agents)}: {agents}; use corral.to_pettingzoo for multi-agent envs"
            )
        if isinstance(env, GymnasiumEnvAdapter):  # a raw Gymnasium env takes what it takes
            env.masks_bind = False
        self.env = env
        self.agent = agents[0]
        self.observation_space: spaces.Space = env.observation_space(self.agent)
        self.action_space: spaces.Space = env.action_space(self.agent)
        self.metadata = dict(getattr(env, "metadata", {"render_modes": []}))
        self.render_mode = getattr(env, "render_mode", None)

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Any, dict[str, Any]]:
        super().reset(seed=seed)
        obs, infos = self.env.reset(seed=seed, options=options)
        return obs[self.agent], export_info(infos.get(self.agent, {}))

    def step(self, action: Any) -> tuple[Any, float, bool, bool, dict[str, Any]]:
        obs, rewards, terms, truncs, infos = self.env.step({self.agent: action})
        info = infos.get(self.agent, {})
        observation = obs[self.agent] if self.agent in obs else info.get("final_obs")
        reward = float(rewards.get(self.agent, 0.0))
        terminated = bool(terms.get(self.agent, False))
        truncated = bool(truncs.get(self.agent, False))
        return observation, reward, terminated, truncated, export_info(info)

    def render(self) -> Any:
        return self.env.render()

    def close(self) -> None:
        self.env.close()
