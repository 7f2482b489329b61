"""corral envs handed to other libraries: PettingZoo (Parallel or AEC) and Gymnasium.

corral's own loop keeps an ended agent's last observation in
``infos[a]["final_obs"]`` and legal actions in ``infos[a]["action_mask"]``.
The exports are wrappers that speak the target library's conventions
instead, so that its tools (``pettingzoo.test``, SuperSuit, RLlib's and
TorchRL's PettingZoo wrappers, Gymnasium's checker) take corral envs as they are.
PettingZoo is imported only when :func:`to_pettingzoo` is called.
"""

from __future__ import annotations

import importlib
from typing import Any, Literal

import gymnasium

from corral.errors import ExportError, MissingDependencyError
from corral.export.corral_env import corral_env, env_name
from corral.export.to_gymnasium import GymnasiumEnvExport

API = Literal["parallel", "aec"]


def to_pettingzoo(
    env: Any, api: API | None = None, *, mask_in_obs: bool | None = None, **kwargs: Any
) -> Any:
    """``env`` as a ``pettingzoo.ParallelEnv`` (``api="parallel"``) or ``pettingzoo.AECEnv``.

    Args:
        env: a corral env, anything :func:`corral.adapt` accepts, or a
            registered id (then ``kwargs`` go to :func:`corral.make`).
        api: ``"parallel"`` or ``"aec"``; by default parallel for envs that
            declare ``simultaneous = True`` and AEC for the others (turn-based
            and asynchronous envs, which have no parallel form).
        mask_in_obs: give observations as ``{"observation", "action_mask"}``
            Dicts, the form PettingZoo's tools read masks from. By default as
            the source did: PettingZoo's classic games yes, other envs no.
            Masks also stay in ``infos[agent]["action_mask"]``.

    Raises:
        ExportError: ``api="parallel"`` for an env that is not simultaneous.
        MissingDependencyError: PettingZoo is not installed.

    Examples:
        >>> import corral
        >>> env = corral.to_pettingzoo("corral/rps", num_rounds=1)  # turn-based: AEC
        >>> env.reset(seed=0)
        >>> for agent in env.agent_iter():
        ...     observation, reward, terminated, truncated, info = env.last()
        ...     print(agent, reward, terminated)
        ...     env.step(None if terminated or truncated else int(agent == "player_0"))
        player_0 0.0 False
        player_1 0.0 False
        player_0 1.0 True
        player_1 -1.0 True
    """
    name = env_name(env)
    env = corral_env(env, kwargs)
    simultaneous = bool(getattr(env, "simultaneous", False))
    if api is None:
        api = "parallel" if simultaneous else "aec"
    if api not in ("parallel", "aec"):
        raise ValueError(f"api must be 'parallel' or 'aec', got {api!r}")
    if api == "parallel" and not simultaneous:
        raise ExportError(
            f"{name} is not simultaneous (its obs holds only the agents that must act, not "
            "every live agent), so it has no PettingZoo Parallel form: use api='aec'. An env "
            "whose every live agent acts at every step can declare simultaneous = True."
        )
    if mask_in_obs is None:
        mask_in_obs = bool(getattr(env, "mask_in_obs", False))
    module = "to_pettingzoo_parallel" if api == "parallel" else "to_pettingzoo_aec"
    export = _import_pettingzoo_module(f"corral.export.{module}")
    cls = export.ParallelEnvExport if api == "parallel" else export.AECEnvExport
    return cls(env, mask_in_obs=mask_in_obs)


def to_gymnasium(env: Any, **kwargs: Any) -> gymnasium.Env:
    """A single-agent ``env`` as a ``gymnasium.Env`` (its one agent's spaces, obs and info).

    ``env`` is a corral env, anything :func:`corral.adapt` accepts, or a
    registered id (then ``kwargs`` go to :func:`corral.make`). Raises
    :class:`ExportError` for an env with more than one agent.

    Examples:
        >>> import corral
        >>> env = corral.to_gymnasium("gym/CartPole-v1")
        >>> obs, info = env.reset(seed=0)
        >>> obs.shape, env.action_space
        ((4,), Discrete(2))
    """
    return GymnasiumEnvExport(corral_env(env, kwargs), name=env_name(env))


def _import_pettingzoo_module(name: str) -> Any:
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as err:
        if (err.name or "").split(".")[0] != "pettingzoo":
            raise
        raise MissingDependencyError(
            "corral.to_pettingzoo needs PettingZoo, which is not installed: "
            "pip install 'corral[pettingzoo]'"
        ) from err


__all__ = ["ExportError", "to_gymnasium", "to_pettingzoo"]
