"""Stepping a slice of a vector env's envs into its arrays, with same-step autoreset.

An :class:`EnvRunner` is the body of every backend: the in-process backend
runs one over all envs, a worker process or Ray actor runs one over its own
envs. It is the only place that turns env dicts into batch arrays and the
only place that resets a finished env, so every backend returns the same
batch for the same seeds and actions.

It is also where an env's values are judged: an unknown agent, a value of the
wrong shape or type, or (with the layout's ``check_finite``) a NaN, inf or
overflowing value raises :class:`~corral.errors.EnvError` naming the env, the
agent and the field.
"""

from __future__ import annotations

import contextlib
import math
import numbers
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, NoReturn

import numpy as np

from corral.adapters import adapt
from corral.env import MultiAgentEnv
from corral.errors import EnvError
from corral.values import describe
from corral.vector.backend import env_error, first_fault, guarded
from corral.vector.layout import ArraySpec, Layout, WriteError, array_tree, reader, writer


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
        self.check_finite = layout.check_finite
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
            obs_write = writer(g.obs_tree, f"obs/{g.name}", arrays, self.check_finite)
            act_read = reader(g.action_tree, f"action/{g.name}", arrays)
            mask_write = None
            if g.num_actions is not None:
                mask_spec = ArraySpec((g.num_actions,), np.dtype(bool))
                mask_write = writer(mask_spec, f"action_mask/{g.name}", arrays)
            for j, agent in enumerate(g.agents):
                self._agents[agent] = _AgentSlots(
                    g.name, j, obs_write, act_read, mask_write, arrays
                )
        self._state_write = (
            writer(array_tree(layout.state_space), "state", arrays, self.check_finite)
            if self.has_state
            else None
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
                faults.append(env_error(self.offset + i, "reset() after a worker restart", err))
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
        fault = env_error(self.offset + i, what, err)
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
            return env_error(self.offset + i, "reset() of the rebuilt env", err)
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
        if type(obs) is not dict or type(infos) is not dict:
            self._check_dicts(i, "reset()", {"obs": obs, "infos": infos})
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
        if not (
            type(obs) is dict
            and type(rewards) is dict
            and type(terminations) is dict
            and type(truncations) is dict
            and type(infos) is dict
        ):
            parts = {"obs": obs, "rewards": rewards, "terminations": terminations}
            parts.update(truncations=truncations, infos=infos)
            self._check_dicts(i, "step()", parts)
        agents, check_finite = self._agents, self.check_finite
        for agent, reward in rewards.items():
            slots = agents.get(agent) or self._unknown(i, agent, "rewards")
            if not isinstance(reward, (float, int)):
                reward = self._real(i, agent, reward)
            if check_finite and not math.isfinite(reward):
                raise self._error(
                    i, f"reward of agent {agent!r}: expected a finite number, got {reward}"
                )
            slots.reward[i, slots.j] = reward
            self._running_return[slots.group][i, slots.j] += reward
        self._record_ends(i, terminations, "terminated", infos)
        self._record_ends(i, truncations, "truncated", infos)
        self._length[i] += 1
        self._write_observations(i, obs, infos)

    def _record_ends(
        self, i: int, flags: Mapping[str, Any], ended: str, infos: Mapping[str, Any]
    ) -> None:
        """Mark the agents whose flag is set ``ended`` ("terminated" or "truncated")."""
        agents = self._agents
        for agent, flag in flags.items():
            if flag is False:
                continue
            if flag is not True and not self._flag(i, agent, ended, flag):
                continue
            slots = agents.get(agent) or self._unknown(i, agent, _END_FLAGS[ended][0])
            getattr(slots, ended)[i, slots.j] = True
            if slots.alive[i, slots.j]:
                slots.alive[i, slots.j] = False
                self._num_alive[i] -= 1
            final = self._info(i, infos, agent, "final_obs")
            if final is not None:
                try:
                    slots.write_obs((i, slots.j), final)
                except WriteError as err:
                    raise self._bad_value(i, agent, "final_obs", err) from None

    def _read_alive(self, i: int, agents: Sequence[str]) -> None:
        """Set env ``i``'s alive row to exactly ``agents`` (agents that joined included)."""
        for g in self.layout.groups:
            self.arrays[f"alive/{g}"][i] = False
        for agent in agents:
            slots = self._agents.get(agent) or self._unknown(i, agent, "env.agents")
            slots.alive[i, slots.j] = True
        self._num_alive[i] = len(agents)

    def _write_observations(self, i: int, obs: Mapping[str, Any], infos: Mapping[str, Any]) -> None:
        for agent in self._acting[i]:
            slots = self._agents[agent]
            slots.acting[i, slots.j] = False
        agents = self._agents
        for agent, value in obs.items():
            slots = agents.get(agent) or self._unknown(i, agent, "obs")
            try:
                slots.write_obs((i, slots.j), value)
            except WriteError as err:
                raise self._bad_value(i, agent, "observation", err) from None
            slots.acting[i, slots.j] = True
            if slots.write_mask is not None:
                info = infos.get(agent)
                try:
                    mask = None if info is None else info.get("action_mask")
                except AttributeError:
                    mask = self._info(i, infos, agent, "action_mask")  # raises
                if mask is None:
                    slots.mask[i, slots.j] = True
                else:
                    try:
                        slots.write_mask((i, slots.j), mask)
                    except WriteError as err:
                        raise self._bad_value(i, agent, "action_mask", err) from None
        self._acting[i] = list(obs)

    def _write_state(self, i: int, env: Any) -> None:
        if self._state_write is not None:
            state = guarded(self.offset + i, "state()", env.state)
            try:
                self._state_write((i,), state)
            except WriteError as err:
                raise self._error(i, f"state{err.where}: expected {err.expected}") from None

    # -- judging an env's values (the slow paths: the checks of the good path are inline) ---

    def _error(self, i: int, message: str) -> EnvError:
        return EnvError(self.offset + i, message)

    def _bad_value(self, i: int, agent: str, field: str, err: WriteError) -> EnvError:
        return self._error(i, f"{field}{err.where} of agent {agent!r}: expected {err.expected}")

    def _unknown(self, i: int, agent: Any, field: str) -> NoReturn:
        raise self._error(
            i,
            f"{field} names agent {agent!r}, which is not one of possible_agents "
            f"{list(self._agents)}",
        )

    def _check_dicts(self, i: int, call: str, parts: dict[str, Any]) -> None:
        for name, part in parts.items():
            if not isinstance(part, Mapping):
                raise self._error(
                    i,
                    f"{call} must return {len(parts)} dicts ({', '.join(parts)}), "
                    f"but {name} is {describe(part)}",
                )

    def _real(self, i: int, agent: str, reward: Any) -> float:
        """``reward`` as a float, if it is a real number (or an array holding one)."""
        if isinstance(reward, (numbers.Real, np.bool_)):
            return float(reward)
        if isinstance(reward, np.ndarray) and reward.size == 1 and reward.dtype.kind in "biuf":
            return float(reward.item())
        raise self._error(
            i, f"reward of agent {agent!r}: expected a real number, got {describe(reward)}"
        )

    def _flag(self, i: int, agent: str, ended: str, flag: Any) -> bool:
        """``flag`` as a bool, if it is one (a numpy bool, 0 or 1, or an array holding one)."""
        value = flag.item() if isinstance(flag, np.ndarray) and flag.size == 1 else flag
        if isinstance(value, (bool, np.bool_)) or (
            isinstance(value, numbers.Integral) and value in (0, 1)
        ):
            return bool(value)
        field = _END_FLAGS[ended][1]
        raise self._error(i, f"{field} of agent {agent!r}: expected a bool, got {describe(flag)}")

    def _info(self, i: int, infos: Mapping[str, Any], agent: str, key: str) -> Any:
        """``infos[agent][key]``, or ``None`` where there is none."""
        info = infos.get(agent)
        if info is None:
            return None
        try:
            return info.get(key)
        except AttributeError:
            raise self._error(
                i, f"info of agent {agent!r}: expected a dict, got {describe(info)}"
            ) from None

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


def _raise_first(faults: list[EnvError]) -> None:
    """Raise the first fault by env index, listing all of them."""
    if faults:
        raise first_fault(faults)


# The batch array of each end flag -> the dict that holds it and its name in messages.
_END_FLAGS = {
    "terminated": ("terminations", "termination"),
    "truncated": ("truncations", "truncation"),
}


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
        "write_mask",
        "write_obs",
    )

    def __init__(
        self,
        group: str,
        j: int,
        obs_write: Callable[[tuple[int, ...], Any], None],
        act_read: Callable[[tuple[int, ...]], Any],
        mask_write: Callable[[tuple[int, ...], Any], None] | None,
        arrays: Mapping[str, np.ndarray],
    ) -> None:
        self.group = group
        self.j = j
        self.write_obs = obs_write  # write_obs((i, j), obs)
        self.read_action = lambda i: act_read((i, j))
        self.write_mask = mask_write  # write_mask((i, j), mask)
        self.reward = arrays[f"reward/{group}"]
        self.terminated = arrays[f"terminated/{group}"]
        self.truncated = arrays[f"truncated/{group}"]
        self.alive = arrays[f"alive/{group}"]
        self.acting = arrays[f"acting/{group}"]
        self.mask = arrays.get(f"action_mask/{group}")
