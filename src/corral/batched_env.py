"""The batched-env protocol: ``E`` copies of a multi-agent env, stepped as arrays.

A :class:`BatchedEnv` is the source of every :class:`~corral.VectorEnv`: E dict
envs packed into arrays (:class:`~corral.vector.dict_envs.DictEnvs`) or a
natively batched env that steps all copies in one array operation, on numpy or
torch, on any device. Its agents form groups (agents of identical spaces,
stacked along one axis); every value is an array whose first two axes are
``[copy, agent of the group]``:

* ``step(actions)`` takes ``actions[g]`` of shape ``[E, n_g, *action_shape]``
  (entries of agents that are not acting are ignored) and returns a
  :class:`BatchedStep` for every copy;
* ``reset(seed=None, where=None)`` starts a new episode in the copies where
  the bool array ``where`` (``[E]``) holds, all of them if it is ``None``.
  ``seed=s`` seeds copy ``i`` with ``s + i`` (a sequence gives each copy its
  own, ``None`` entries keeping their generator).

An env never resets a copy by itself. A copy's episode ends in the step after
which none of its agents is ``alive``; the vector layer then records the
episode (``final_obs``, return, length) and calls ``reset(where=...)`` for
those copies, in the same step (:mod:`corral.vector.episodes`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from gymnasium import spaces

from corral.arrays import Array, Place, to_numpy
from corral.env import check_render_mode
from corral.groups import group_agents

Seed = int | Sequence[int | None] | None


@dataclass
class BatchedStep:
    """What a :class:`BatchedEnv` returns from ``reset`` and ``step``, for all ``E`` copies.

    Per group ``g`` of ``n_g`` agents:

    * ``obs[g]``: ``[E, n_g, *obs_shape]`` (a dict or tuple of such arrays for a
      Dict or Tuple space). An agent that is not alive keeps the last
      observation it had: in the step it ended, its final one.
    * ``alive[g]``: ``[E, n_g]`` bool, the agent is in its copy's episode now
      (one that terminated or was truncated in this step is not).
    * ``acting[g]``: ``[E, n_g]`` bool, the agent must act at the next step.
    * ``action_mask[g]``: ``[E, n_g, n_actions]`` bool, legal actions of a
      discrete group; a group left out has every action legal.
    * ``reward[g]``, ``terminated[g]``, ``truncated[g]``: ``[E, n_g]``, what each
      agent earned in this step and whether its episode ended here; ``None``
      from ``reset``.
    * ``state``: ``[E, *state_shape]``, where the env has a ``state_space``.

    Rows of copies that a ``reset(where=...)`` did not select hold those copies as they
    stood (the vector layer compares them in its first resets; it writes none of them).
    ``restarted``, ``failed`` (``[E]`` bool) and ``faults`` are for sources that
    restart a failed copy themselves (packed dict envs): the copies rebuilt in
    this call, the copies whose step raised (it did not happen: the episode's
    length does not count it), and the :class:`~corral.errors.EnvError` of each
    failure.

    ``same_alive``: a step's promise that every copy's ``alive`` is as it was
    before the step (no agent ended or joined): the vector layer then looks for
    no ended episode. ``False`` (the default) promises nothing.
    """

    obs: dict[str, Any]
    alive: dict[str, Array]
    acting: dict[str, Array]
    action_mask: dict[str, Array] = field(default_factory=dict)
    reward: dict[str, Array] | None = None
    terminated: dict[str, Array] | None = None
    truncated: dict[str, Array] | None = None
    state: Any = None
    restarted: Array | None = None
    failed: Array | None = None
    faults: list[Any] = field(default_factory=list)
    same_alive: bool = False


class BatchedEnv:
    """Base class of natively batched envs (and of packed dict envs).

    A subclass sets ``num_envs``, ``possible_agents`` and ``place`` (where its
    arrays live: ``Place("numpy")`` or ``Place("torch", device)``), implements
    :meth:`observation_space`, :meth:`action_space`, :meth:`reset` and
    :meth:`step`, and may set ``state_space``, ``metadata`` and
    ``max_episode_steps``, and list in ``settable_attributes`` the attributes that
    ``VectorEnv.set_attr`` may set (one value for all copies, in effect from the next
    step). One that can draw its copies lists ``metadata["render_modes"]``
    and has ``render(copy)`` (a frame of one copy; ``VectorEnv.render()`` calls it for
    each). ``groups`` defaults to :func:`corral.group_agents`
    over the agents' spaces; a subclass may override it.
    """

    num_envs: int
    possible_agents: list[str]
    place: Place = Place()
    state_space: spaces.Space | None = None
    metadata: dict[str, Any] = {}
    max_episode_steps: int | None = None
    settable_attributes: tuple[str, ...] = ()
    keeps_masks: bool = False
    """An optional speed-up: ``True`` promises that the env's action masks already leave every
    action legal for agents that are not acting, so the vector layer does not apply that rule
    again. Say it only where a differential test against the dict env checks the masks."""
    keeps_rules: bool = False
    """``True`` promises that the env judges every value it returns itself and keeps its masks
    (:attr:`keeps_masks`), so the vector layer does not look at them again: packed dict envs,
    which check each dict env's values as they pack them."""

    @property
    def groups(self) -> dict[str, tuple[str, ...]]:
        """Group name -> its agents, in array order."""
        grouped = group_agents(self.possible_agents, self.observation_space, self.action_space)
        return {name: tuple(agents) for name, agents in grouped.items()}

    @property
    def array(self) -> str:
        """``"numpy"`` or ``"torch"``: the namespace of every array in and out."""
        return self.place.array

    @property
    def device(self) -> str:
        return self.place.device

    def observation_space(self, agent: str) -> spaces.Space:
        raise NotImplementedError

    def action_space(self, agent: str) -> spaces.Space:
        raise NotImplementedError

    def reset(
        self, seed: Seed = None, where: Array | None = None, options: dict[str, Any] | None = None
    ) -> BatchedStep:
        """Start a new episode in the copies selected by ``where`` (all if ``None``)."""
        raise NotImplementedError

    def step(self, actions: dict[str, Any]) -> BatchedStep:
        """Step every copy with ``actions[g]`` (``[E, n_g, *action_shape]``)."""
        raise NotImplementedError

    def close(self) -> None:
        """Release what the env holds; safe to call twice."""

    def write_into(self, arrays: Mapping[str, Array]) -> bool:
        """An optional speed-up: write every later reset and step straight into ``arrays``.

        Called once before the first reset with the batch's own arrays (``obs/<group>``,
        ``alive/<group>``, ``reward/<group>``..., ``[E, ...]``, C-contiguous, on the env's
        place). An env that returns ``True`` writes every later reset and step into them
        and returns them (one copy less of every value per step); ``False`` (the default,
        and where an array is missing or differs in shape, dtype or place): it returns
        arrays of its own.
        """
        return False

    def check_render_mode(self, render_mode: str | None, hint: str = "") -> None:
        """Raise ``ValueError`` unless ``render_mode`` is ``None`` or in
        ``metadata["render_modes"]``; ``hint`` ends the message."""
        check_render_mode(render_mode, self.metadata.get("render_modes", []), hint)


def copy_seeds(seed: Seed, num_envs: int) -> list[int | None]:
    """The seed of each copy: ``seed + i``, the sequence as given, or ``None`` for all."""
    if seed is None:
        return [None] * num_envs
    if isinstance(seed, (int, np.integer)):
        return [int(seed) + i for i in range(num_envs)]
    seeds = list(seed)
    if len(seeds) != num_envs:
        raise ValueError(f"got {len(seeds)} seeds for {num_envs} copies")
    return seeds


def selected(where: Array | None, num_envs: int) -> np.ndarray:
    """The indices of the copies ``where`` selects (all of them for ``None``), on the host."""
    if where is None:
        return np.arange(num_envs)
    return np.flatnonzero(to_numpy(where))


class CopyGenerators:
    """One numpy ``Generator`` per copy, seeded the way a dict env's ``reset(seed)`` seeds its
    own: copy ``i`` reset with seed ``s`` draws what a dict env reset with ``s`` draws, and
    keeps drawing from it at later unseeded resets. A copy first reset without a seed
    draws from fresh entropy."""

    def __init__(self, num_envs: int) -> None:
        self._generators: list[np.random.Generator | None] = [None] * num_envs

    def at_reset(self, seeds: Sequence[int | None], indices: Iterable[int]) -> list:
        """The generators of the copies ``indices`` being reset with ``seeds`` (one per copy
        of the env, as :func:`copy_seeds` gives them), reseeded where a seed is given."""
        out = []
        for i in indices:
            if seeds[i] is not None or self._generators[i] is None:
                self._generators[i] = np.random.default_rng(seeds[i])
            out.append(self._generators[i])
        return out
