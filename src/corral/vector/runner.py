"""Stepping a slice of a vector env's envs into its arrays, with same-step autoreset.

An :class:`EnvRunner` is the body of every backend: the in-process backend
runs one over all envs, a worker process or Ray actor runs one over its own
envs. It is the only place that turns env dicts into batch arrays and the
only place that resets a finished env, so every backend returns the same
batch for the same seeds and actions.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from corral.env import MultiAgentEnv
from corral.vector.backend import guarded
from corral.vector.layout import Layout, array_tree, reader, writer


class EnvRunner:
    """Runs ``envs`` (global indices ``offset``, ``offset + 1``, ...) into ``arrays``.

    ``arrays`` maps each path of :meth:`Layout.array_specs` to this runner's
    slice of that array (first axis: its envs, in order).
    """

    def __init__(
        self,
        envs: Sequence[Any],
        layout: Layout,
        arrays: Mapping[str, np.ndarray],
        offset: int = 0,
    ) -> None:
        self.envs = list(envs)
        for env in self.envs:
            _skip_action_checks(env)
        self.layout = layout
        self.arrays = arrays
        self.offset = offset
        self.has_state = layout.state_space is not None
        self._acting: list[list[str]] = [[] for _ in self.envs]
        # How many agents each env's alive row holds: a step that leaves env.agents with
        # another count had agents join (or break the contract), and alive is read anew.
        self._num_alive = [0] * len(self.envs)
        self._running_return = {g: arrays[f"running_return/{g}"] for g in layout.groups}
        self._length = arrays["running_length"]
        self._obs_paths = [p for p in arrays if p.startswith("obs/")]
        self._state_paths = [p for p in arrays if p.startswith("state")]
        self._agents: dict[str, _AgentSlots] = {}
        for g in layout.groups.values():
            obs_write = writer(g.obs_tree, f"obs/{g.name}", arrays)
            act_read = reader(g.action_tree, f"action/{g.name}", arrays)
            for j, agent in enumerate(g.agents):
                self._agents[agent] = _AgentSlots(g.name, j, obs_write, act_read, arrays)
        self._state_write = (
            writer(array_tree(layout.state_space), "state", arrays) if self.has_state else None
        )

    # -- commands -----------------------------------------------------------------

    def reset(self, seeds: Sequence[int | None], options: dict[str, Any] | None = None) -> None:
        """Reset every env, env ``i`` with ``seeds[i]``."""
        self._clear_step_fields()
        for i, env in enumerate(self.envs):
            obs, infos = self._guard(i, "reset", lambda e=env, s=seeds[i]: e.reset(s, options))
            self._begin_episode(i, obs, infos)

    def step(self) -> None:
        """Step every env with the actions in the ``action/...`` arrays."""
        self._clear_step_fields()
        for i, env in enumerate(self.envs):
            actions = {a: self._agents[a].read_action(i) for a in self._acting[i]}
            result = self._guard(i, "step", lambda e=env, act=actions: e.step(act))
            self._record_step(i, *result)
            # also after the last step: final_state is the state the episode ended in
            self._write_state(i, env)
            agents = env.agents
            if not agents:
                self._end_episode(i)
                obs, infos = self._guard(i, "reset", env.reset)
                self._begin_episode(i, obs, infos)
            elif len(agents) != self._num_alive[i]:
                self._read_alive(i, agents)

    def restart(self, i: int, env: Any, seed: int | None) -> None:
        """Replace env ``i`` (after its worker died): its agents are marked truncated."""
        self.envs[i] = env
        _skip_action_checks(env)
        # a fresh runner over shared arrays: row i still holds the dead worker's last step
        for g in self.layout.groups:
            for field in ("reward", "terminated", "truncated", "acting"):
                self.arrays[f"{field}/{g}"][i] = 0
        for slots in self._agents.values():
            if slots.alive[i, slots.j]:
                slots.truncated[i, slots.j] = True
        self._end_episode(i)
        self.arrays["worker_restarts"][i] += 1
        obs, infos = self._guard(i, "reset", lambda: env.reset(seed))
        self._begin_episode(i, obs, infos)

    # -- bookkeeping --------------------------------------------------------------

    def _guard(self, i: int, what: str, call: Callable[[], Any]) -> Any:
        return guarded(self.offset + i, f"{what}()", call)

    def _clear_step_fields(self) -> None:
        for g in self.layout.groups:
            self.arrays[f"reward/{g}"].fill(0)
            self.arrays[f"terminated/{g}"].fill(False)
            self.arrays[f"truncated/{g}"].fill(False)
        self.arrays["done"].fill(False)

    def _begin_episode(self, i: int, obs: Mapping[str, Any], infos: Mapping[str, Any]) -> None:
        for path in self._obs_paths:
            self.arrays[path][i] = 0
        for g in self.layout.groups:
            self._running_return[g][i] = 0
        self._length[i] = 0
        self._read_alive(i, self.envs[i].agents)
        self._write_observations(i, obs, infos)
        self._write_state(i, self.envs[i])

    def _record_step(
        self,
        i: int,
        obs: Mapping[str, Any],
        rewards: Mapping[str, float],
        terminations: Mapping[str, bool],
        truncations: Mapping[str, bool],
        infos: Mapping[str, Any],
    ) -> None:
        for agent, reward in rewards.items():
            slots = self._agents[agent]
            slots.reward[i, slots.j] = reward
            self._running_return[slots.group][i, slots.j] += reward
        for ended, field in ((terminations, "terminated"), (truncations, "truncated")):
            for agent, flag in ended.items():
                if flag:
                    slots = self._agents[agent]
                    getattr(slots, field)[i, slots.j] = True
                    if slots.alive[i, slots.j]:
                        slots.alive[i, slots.j] = False
                        self._num_alive[i] -= 1
                    final = infos.get(agent, {}).get("final_obs")
                    if final is not None:
                        slots.write_obs(i, final)
        self._length[i] += 1
        self._write_observations(i, obs, infos)

    def _read_alive(self, i: int, agents: Sequence[str]) -> None:
        """Set env ``i``'s alive row to exactly ``agents`` (agents that joined included)."""
        for g in self.layout.groups:
            self.arrays[f"alive/{g}"][i] = False
        for agent in agents:
            slots = self._agents[agent]
            slots.alive[i, slots.j] = True
        self._num_alive[i] = len(agents)

    def _write_observations(self, i: int, obs: Mapping[str, Any], infos: Mapping[str, Any]) -> None:
        for agent in self._acting[i]:
            slots = self._agents[agent]
            slots.acting[i, slots.j] = False
        for agent, value in obs.items():
            slots = self._agents[agent]
            slots.write_obs(i, value)
            slots.acting[i, slots.j] = True
            if slots.mask is not None:
                mask = infos[agent].get("action_mask") if agent in infos else None
                slots.mask[i, slots.j] = True if mask is None else mask
        self._acting[i] = list(obs)

    def _write_state(self, i: int, env: Any) -> None:
        if self._state_write is not None:
            self._state_write((i,), env.state())

    def _end_episode(self, i: int) -> None:
        arrays = self.arrays
        arrays["done"][i] = True
        for path in self._obs_paths:
            arrays["final_" + path][i] = arrays[path][i]
        for path in self._state_paths:
            if not path.startswith("final_"):
                arrays["final_" + path][i] = arrays[path][i]
        for g in self.layout.groups:
            arrays[f"episode_return/{g}"][i] = self._running_return[g][i]
        arrays["episode_length"][i] = self._length[i]


def _skip_action_checks(env: Any) -> None:
    """The vector env validated the batch: checking each env's actions again is waste."""
    if isinstance(env, MultiAgentEnv):
        env.check_actions = False


class _AgentSlots:
    """The array cells of one agent, and how to read and write its values."""

    __slots__ = (
        "acting",
        "alive",
        "group",
        "j",
        "mask",
        "read_action",
        "reward",
        "terminated",
        "truncated",
        "write_obs",
    )

    def __init__(
        self,
        group: str,
        j: int,
        obs_write: Callable[[tuple[int, ...], Any], None],
        act_read: Callable[[tuple[int, ...]], Any],
        arrays: Mapping[str, np.ndarray],
    ) -> None:
        self.group = group
        self.j = j
        self.write_obs = lambda i, value: obs_write((i, j), value)
        self.read_action = lambda i: act_read((i, j))
        self.reward = arrays[f"reward/{group}"]
        self.terminated = arrays[f"terminated/{group}"]
        self.truncated = arrays[f"truncated/{group}"]
        self.alive = arrays[f"alive/{group}"]
        self.acting = arrays[f"acting/{group}"]
        self.mask = arrays.get(f"action_mask/{group}")
