"""Reference baselines: the returns a learner's ``eval_return`` is compared with.

Two controllers play an env through its vector batch, and :func:`evaluate_baseline`
scores them on the measure of a run's evaluations (:mod:`corral.training.scoring`):
each episode's per-agent return averaged over the agents, then its mean and standard
error over episodes (:class:`~corral.training.scoring.Score`, as ``corral eval`` gives
the run's own).

* ``random``: uniformly random legal actions (:meth:`corral.VectorEnv.sample_actions`).
* ``heuristic``: a scripted controller of the env, where corral has one. On mpe2's
  ``simple_spread_v3`` (:func:`spread_heuristic`) each agent heads for a landmark
  assigned greedily (the closest remaining agent-landmark pair first).

Examples:
    >>> score = evaluate_baseline("heuristic", episodes=8, env_kwargs={"N": 2})
    >>> score.episodes, score.mean < 0
    (8, True)
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
from gymnasium import spaces

from corral.arrays import to_numpy
from corral.training.scoring import Score
from corral.vector.vector_env import Batch, VectorEnv, make_vec

SPREAD = "mpe2/simple_spread_v3"

Controller = Callable[[Batch, np.random.Generator], dict[str, Any]]
"""Actions for every group of a vector batch (``rng`` for controllers that draw)."""

# The scripted controller's model of mpe2's physics, for simple_spread's agents: a step
# moves an agent by dt * velocity before its action changes the velocity (damped by
# DAMPING, pushed by ACCEL * move * DT), so an action first shows in the position after
# next: the position two steps on is pos + VELOCITY_REACH * vel + MOVE_REACH * move.
_DT, _DAMPING, _ACCEL = 0.1, 0.25, 5.0  # mpe2's World.dt, World.damping, action scale
VELOCITY_REACH = _DT * (2 - _DAMPING)
MOVE_REACH = _DT * _DT * _ACCEL
# Discrete movement actions: 0 no-op, 1 -x, 2 +x, 3 -y, 4 +y.
_MOVES = np.array([[0.0, 0.0], [-1.0, 0.0], [1.0, 0.0], [0.0, -1.0], [0.0, 1.0]])


def greedy_assignment(distances: np.ndarray) -> np.ndarray:
    """``[E, n]``: the landmark each agent goes to, from ``distances`` ``[E, agent,
    landmark]`` (n x n): the closest agent-landmark pair first, then the closest pair among
    the agents and landmarks left, and so on."""
    e, n, _ = distances.shape
    left = np.array(distances, dtype=np.float64)
    target = np.zeros((e, n), dtype=np.int64)
    copies = np.arange(e)
    for _ in range(n):
        agent, landmark = np.divmod(left.reshape(e, -1).argmin(1), n)
        target[copies, agent] = landmark
        left[copies, agent, :] = np.inf
        left[copies, :, landmark] = np.inf
    return target


def spread_heuristic(obs: np.ndarray, *, continuous: bool = False) -> np.ndarray:
    """The scripted actions of ``simple_spread_v3``'s agents from their observations ``[E,
    n, obs]`` (the env's default observation: own velocity, own position, every landmark
    relative to the agent, then the other agents).

    Each agent goes to the landmark :func:`greedy_assignment` gives it: the discrete
    action (``[E, n]`` ints) whose position two steps on (the first its action moves)
    is closest to the landmark, or with ``continuous`` the action (``[E, n, 5]`` in
    [0, 1]) that brings it there, clipped to the action space.
    """
    obs = np.asarray(obs, dtype=np.float64)
    e, n, size = obs.shape
    if size < 4 + 2 * n:
        raise ValueError(
            f"simple_spread observations of {n} agents hold at least {4 + 2 * n} values (own "
            f"velocity and position, {n} landmarks), got {size}"
        )
    to_landmarks = obs[..., 4 : 4 + 2 * n].reshape(e, n, n, 2)
    target = greedy_assignment(np.sqrt((to_landmarks**2).sum(-1)))
    goal = np.take_along_axis(to_landmarks, target[:, :, None, None], 2)[:, :, 0]
    miss = goal - VELOCITY_REACH * obs[..., 0:2]  # where the landmark is left without acting
    if continuous:
        move = np.clip(miss / MOVE_REACH, -1.0, 1.0)  # per axis: the box is separable
        actions = np.zeros((e, n, 5), dtype=np.float32)
        actions[..., 1::2] = np.maximum(-move, 0.0)  # -x, -y
        actions[..., 2::2] = np.maximum(move, 0.0)  # +x, +y
        return actions
    after = miss[:, :, None, :] - MOVE_REACH * _MOVES  # [E, n, move, 2]
    return (after**2).sum(-1).argmin(-1)


def random_controller(venv: VectorEnv, env_kwargs: Mapping[str, Any]) -> Controller:
    """Uniformly random legal actions for every group of ``venv``."""
    return venv.sample_actions


def spread_controller(venv: VectorEnv, env_kwargs: Mapping[str, Any]) -> Controller:
    """:func:`spread_heuristic` for the agents of a ``simple_spread_v3`` vector env built
    with ``env_kwargs`` (a ``ValueError`` where its observations hide landmarks)."""
    nearest = env_kwargs.get("num_landmark_neighbors")
    if nearest is not None:
        raise ValueError(
            f"the simple_spread heuristic reads every landmark in the env's order: it cannot "
            f"play with num_landmark_neighbors={nearest!r} (nearest landmarks first)"
        )
    (group,) = venv.groups
    continuous = isinstance(venv.action_space(group), spaces.Box)

    def act(batch: Batch, rng: np.random.Generator) -> dict[str, Any]:
        actions = spread_heuristic(to_numpy(batch.obs[group]), continuous=continuous)
        return {group: venv.place.from_host(actions)}

    return act


BASELINES: dict[str, dict[str, Callable[[VectorEnv, Mapping[str, Any]], Controller]]] = {
    SPREAD: {"random": random_controller, "heuristic": spread_controller},
}
"""The baselines of each env id: name -> the controller for a vector env of it."""


def episode_returns(
    venv: VectorEnv, controller: Controller, episodes: int, seed: int | None = None
) -> np.ndarray:
    """``[episodes]``: the return of each of the first ``episodes`` episodes that end when
    ``controller`` plays ``venv`` (reset with ``seed``), averaged over the agents, as a run's
    evaluation counts them."""
    rng = np.random.default_rng(seed)
    batch = venv.reset(seed=seed)
    returns: list[np.ndarray] = []
    found = 0
    while found < episodes:
        batch = venv.step(controller(batch, rng))
        done = np.flatnonzero(to_numpy(batch.done))
        if len(done):
            per_agent = [to_numpy(batch.episode_return[g])[done] for g in venv.groups]
            returns.append(np.concatenate(per_agent, axis=1).mean(axis=1))
            found += len(done)
    return np.concatenate(returns)[:episodes]


def evaluate_baseline(
    name: str,
    env: str = SPREAD,
    *,
    episodes: int = 1000,
    seed: int = 0,
    env_kwargs: Mapping[str, Any] | None = None,
    num_envs: int | None = None,
) -> Score:
    """The :class:`Score` of the baseline ``name`` of ``env`` (built with ``env_kwargs``)
    over ``episodes`` episodes from ``seed``, in ``num_envs`` copies (by default one per
    episode, up to 1,000).

    Raises ``ValueError`` naming the envs and baselines corral has for an unknown one.
    """
    if episodes < 2:
        raise ValueError(f"a score needs at least 2 episodes, got {episodes}")
    controllers = baselines_of(env)
    if name not in controllers:
        raise ValueError(f"{env} has no baseline {name!r}; its baselines: {list(controllers)}")
    kwargs = dict(env_kwargs or {})
    venv = make_vec(env, num_envs or min(episodes, 1000), env_kwargs=kwargs)
    try:
        controller = controllers[name](venv, kwargs)
        return Score.of(episode_returns(venv, controller, episodes, seed))
    finally:
        venv.close()


def reference_scores(
    env: str,
    env_kwargs: Mapping[str, Any] | None = None,
    *,
    episodes: int = 1000,
    seed: int = 0,
) -> dict[str, Score]:
    """Every baseline of ``env``: name -> its :class:`Score` (see :func:`evaluate_baseline`)."""
    return {
        name: evaluate_baseline(name, env, episodes=episodes, seed=seed, env_kwargs=env_kwargs)
        for name in baselines_of(env)
    }


def baselines_of(env: str) -> dict[str, Callable[[VectorEnv, Mapping[str, Any]], Controller]]:
    """The baselines corral has for the env id ``env``; a ``ValueError`` naming the envs that
    have some where it has none."""
    if env not in BASELINES:
        raise ValueError(
            f"corral has no reference baselines for {env!r}; it has them for: "
            f"{', '.join(BASELINES)}"
        )
    return BASELINES[env]
