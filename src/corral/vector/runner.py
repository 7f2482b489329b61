"""Stepping a slice of a vector env's envs into its arrays, with same-step autoreset.

An :class:`EnvRunner` is the body of every backend: the in-process backend
runs one over all envs, a worker process or Ray actor runs one over its own
envs. It is the only place that turns env dicts into batch arrays and the
only place that resets a finished env, so every backend returns the same
batch for the same seeds and actions.
"""

from __future__ import annotations

import contextlib
import traceback
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from corral.adapters import adapt
from corral.env import MultiAgentEnv
from corral.errors import EnvError
from corral.vector.backend import guarded
from corral.vector.layout import Layout, array_tree, reader, writer


class EnvRunner:
    """Runs ``envs`` (global indices ``offset``, ``offset + 1``, ...) into ``arrays``.

    ``arrays`` maps each path of :meth:`Layout.array_specs` to this runner's
    slice of that array (first axis: its envs, in order). ``env_fns`` builds
    each env anew after a fault (without them the env is reused); a rebuilt
    env replaces its entry of ``envs``, the caller's list, in place.

    A fault of one env (an exception while it steps, resets or its output is
    recorded) leaves the others' step complete: the faulty env's episode
    ends truncated with its stats kept, the env is rebuilt and reset, and
    ``worker_restarts`` counts it. Once every env is done, the first fault
    (by env index) is raised as an :class:`EnvError` listing all of them.
    """

    def __init__(
        self,
        envs: list[Any],
        layout: Layout,
        arrays: Mapping[str, np.ndarray],
        offset: int = 0,
        env_fns: Sequence[Callable[[], Any]] | None = None,
    ) -> None:
        self.envs = envs
        for env in self.envs:
            _skip_action_checks(env)
        self.env_fns = None if env_fns is None else list(env_fns)
        self.layout = layout
        self.arrays = arrays
        self.offset = offset
        self.has_state = layout.state_space is not None
        self._acting: list[list[str]] = [[] for _ in self.envs]
        # How many agents each env's alive row holds: a step that leaves env.agents with
        # another count had agents join (or break the contract), and alive is read anew.
        self._num_alive = [0] * len(self.envs)
        # Envs that could not be restarted after a fault: the next step tries again.
        self._broken: set[int] = set()
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
        faults = []
        for i in range(len(self.envs)):
            self._broken.discard(i)
            try:
                self._reset_env(i, seeds[i], options)
            except Exception as err:
                faults.append(self._fault(i, "reset()", err, seeds[i], options))
        _raise_first(faults)

    def step(self) -> None:
        """Step every env with the actions in the ``action/...`` arrays."""
        self._clear_step_fields()
        faults = []
        for i in range(len(self.envs)):
            try:
                if i in self._broken:  # its last restart failed: try again
                    failed = self._restart_env(i, None, None)
                    if failed:
                        text = f"restarting the env failed again: {failed.message}"
                        faults.append(EnvError(failed.env_index, text, failed.remote_traceback))
                else:
                    self._step_env(i)
            except Exception as err:
                faults.append(self._fault(i, "step()", err, None, None, cut=True))
        _raise_first(faults)

    def restart_all(self, seeds: Sequence[int | None]) -> None:
        """Take over from a dead worker: reset env ``i`` with ``seeds[i]``; the episodes it
        was running end truncated.

        The step fields (``reward``, ``done``...) hold what the dead worker wrote of its
        last step, cleared before it (:func:`clear_step_fields`): an episode that ended in
        that step is reported as it ended, the others are cut where they stand.
        """
        for g in self.layout.groups:  # this fresh runner does not know which agents acted
            self.arrays[f"acting/{g}"].fill(False)
        faults = []
        for i in range(len(self.envs)):
            if not self.arrays["done"][i]:
                self._truncate(i)
            self.arrays["worker_restarts"][i] += 1
            try:
                self._reset_env(i, seeds[i], None)
            except Exception as err:
                faults.append(_env_error(self.offset + i, "reset() after a worker restart", err))
                self._give_up(i)
        _raise_first(faults)

    # -- one env ------------------------------------------------------------------

    def _step_env(self, i: int) -> None:
        env = self.envs[i]
        actions = {a: self._agents[a].read_action(i) for a in self._acting[i]}
        result = self._guard(i, "step", lambda: env.step(actions))
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

    def _reset_env(self, i: int, seed: int | None, options: dict[str, Any] | None) -> None:
        env = self.envs[i]
        obs, infos = self._guard(i, "reset", lambda: env.reset(seed, options))
        self._begin_episode(i, obs, infos)

    def _fault(
        self,
        i: int,
        what: str,
        err: Exception,
        seed: int | None,
        options: dict[str, Any] | None,
        cut: bool = False,
    ) -> EnvError:
        """Handle env ``i``'s exception ``err`` (being handled): with ``cut``, end its episode
        truncated; restart the env. The fault to report."""
        fault = _env_error(self.offset + i, what, err)
        if cut and not self.arrays["done"][i]:  # an episode that ended in this step is kept
            self._truncate(i)
        failed = self._restart_env(i, seed, options)
        if failed:
            return EnvError(
                fault.env_index,
                f"{fault.message}; restarting the env failed: {failed.message}",
                f"{fault.remote_traceback}\n{failed.remote_traceback}",
            )
        fault.restarted = True
        return fault

    def _restart_env(
        self, i: int, seed: int | None, options: dict[str, Any] | None
    ) -> EnvError | None:
        """Rebuild env ``i`` (closing the old one) and reset it; the error if that fails."""
        self.arrays["worker_restarts"][i] += 1
        self._broken.discard(i)
        try:
            if self.env_fns is not None:
                build = self.env_fns[i]
                env = guarded(self.offset + i, "building the env", lambda: adapt(build()))
                _skip_action_checks(env)
                old, self.envs[i] = self.envs[i], env
                with contextlib.suppress(Exception):  # it failed already; its close may too
                    old.close()
            self._reset_env(i, seed, options)
        except Exception as err:
            self._give_up(i)
            return _env_error(self.offset + i, "reset() of the rebuilt env", err)
        return None

    def _give_up(self, i: int) -> None:
        """Env ``i`` has no episode: none of its agents acts until a restart succeeds."""
        self._broken.add(i)
        for g in self.layout.groups:
            self.arrays[f"alive/{g}"][i] = False
            self.arrays[f"acting/{g}"][i] = False
        self._acting[i] = []
        self._num_alive[i] = 0

    # -- bookkeeping --------------------------------------------------------------

    def _guard(self, i: int, what: str, call: Callable[[], Any]) -> Any:
        return guarded(self.offset + i, f"{what}()", call)

    def _clear_step_fields(self) -> None:
        clear_step_fields(self.arrays, self.layout.groups)

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

    def _truncate(self, i: int) -> None:
        """End env ``i``'s episode where it stands: its agents alive are truncated."""
        for slots in self._agents.values():
            if slots.alive[i, slots.j]:
                slots.truncated[i, slots.j] = True
        self._end_episode(i)

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


def clear_step_fields(arrays: Mapping[str, np.ndarray], groups: Iterable[str]) -> None:
    """Clear what a step reports (rewards, ends, ``done``) before the step."""
    for g in groups:
        arrays[f"reward/{g}"].fill(0)
        arrays[f"terminated/{g}"].fill(False)
        arrays[f"truncated/{g}"].fill(False)
    arrays["done"].fill(False)


def _env_error(index: int, what: str, err: Exception) -> EnvError:
    """``err`` (being handled) as an :class:`EnvError` of env ``index``, with its traceback."""
    if isinstance(err, EnvError):
        return err
    text = f"{what} raised {type(err).__name__}: {err}"
    return EnvError(index, text, traceback.format_exc())


def _raise_first(faults: list[EnvError]) -> None:
    """Raise the first fault (they come in env order), listing all of them."""
    if faults:
        faults[0].faults = list(faults)
        raise faults[0]


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
