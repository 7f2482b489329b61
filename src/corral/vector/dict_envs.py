"""``E`` dict envs (the env contract) packed into arrays: one :class:`~corral.BatchedEnv`.

This is the only place that turns env dicts into arrays, and the only per-env
loop of the vector layer: the episode bookkeeping on top of it is array
operations (:mod:`corral.vector.episodes`). :mod:`corral.vector.packer` writes
the values into the arrays, and names the env, the agent and the field of a value
that does not fit in an :class:`~corral.errors.EnvError`.

A fault of one env (an exception while it steps or resets, or a bad value)
leaves the other envs' call complete: the faulty env's step did not happen,
its live agents are truncated where they stood before it, so its episode ends
in this step, and it is rebuilt from its constructor when the vector layer
resets it, with the attributes ``set_attr`` wrote on it set again.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from corral.adapters import adapt, set_env_attr
from corral.batched_env import BatchedEnv, BatchedStep, Seed, copy_seeds, selected
from corral.env import MultiAgentEnv
from corral.errors import EnvError
from corral.groups import GroupMap
from corral.vector.env_calls import (
    Written,
    env_error,
    first_fault,
    guarded,
    remember,
    set_env_attrs,
)
from corral.vector.layout import Layout, Role, array_tree, assemble
from corral.vector.packer import GroupArrays, Packer

EnvFn = Callable[[], Any]
STEP, RESET = 0, 1
"""The calls :attr:`DictEnvs.inside` tells apart."""


def call_inside(inside: Any) -> str | None:
    """The env call that a :attr:`DictEnvs.inside` says (``"env 2's step()"``), if any."""
    if inside[0] < 0:
        return None
    return f"env {inside[0]}'s {'step' if inside[1] == STEP else 'reset'}()"


class DictEnvs(BatchedEnv):
    """The envs built by ``env_fns`` (global indices from ``offset``), packed into arrays.

    ``group_map`` forms the groups (:func:`corral.group_agents`); ``state``: fill the
    ``state`` arrays from each env's ``state()``; ``check_finite``: NaN or inf is a fault
    of the env that returned it (as a value its array's dtype cannot hold always is).
    """

    # The packing judges every value (naming the env and the agent), and leaves the masks
    # of agents that are not acting all legal: the bookkeeping needs no second look.
    keeps_rules = True

    def __init__(
        self,
        env_fns: Sequence[EnvFn],
        *,
        offset: int = 0,
        group_map: GroupMap = None,
        state: bool = False,
        check_finite: bool = False,
    ) -> None:
        self.env_fns = list(env_fns)
        self.offset = offset
        self.written: Written = {}
        """What :meth:`set_attr` wrote on the envs, set again on an env that a fault rebuilds."""
        self.envs = [self._build(k) for k in range(len(self.env_fns))]
        first = self.envs[0]
        self.num_envs = len(self.envs)
        self.possible_agents = list(first.possible_agents)
        self.metadata = dict(getattr(first, "metadata", {}))
        self._obs_spaces = {a: first.observation_space(a) for a in self.possible_agents}
        self._action_spaces = {a: first.action_space(a) for a in self.possible_agents}
        self.state_space = getattr(first, "state_space", None) if state else None
        self.check_finite = check_finite
        groups = Layout.grouping(
            self.possible_agents, self.observation_space, self.action_space, group_map
        )
        self.layout = Layout(
            groups, self.observation_space, self.action_space, self.state_space, self.num_envs
        )
        self.arrays = {
            path: np.zeros(f.shape, f.dtype)
            for path, f in self.layout.fields.items()
            if f.role in (Role.STEP, Role.ACTION)
        }
        self._packer = Packer(self.layout, self.arrays, offset, check_finite)
        # What every step and every reset returns (see _output).
        self._views: tuple[BatchedStep, BatchedStep] | None = None
        # The agents of each env that act next, each with its flat index in its group.
        self._acting: list[Sequence[tuple[str, int, GroupArrays]]] = [()] * self.num_envs
        # How many agents each env's alive row holds: a step that leaves env.agents with
        # another count had agents join (or break the contract), and alive is read anew.
        self._num_alive = [0] * self.num_envs
        self._to_rebuild: set[int] = set()  # failed: rebuilt at their next reset
        self._broken: set[int] = set()  # could not be restarted: tried again each step
        self.inside: Any = [-1, -1]
        """``[env, call]``: the global index of the env being stepped (``call`` :data:`STEP`)
        or reset (:data:`RESET`), ``env`` -1 between calls. A backend whose worker may hang
        puts shared memory here, to tell which env it hung in."""

    @property
    def groups(self) -> dict[str, tuple[str, ...]]:
        return {name: g.agents for name, g in self.layout.groups.items()}

    @property
    def max_episode_steps(self) -> int | None:  # type: ignore[override]
        """The first env's ``max_episode_steps`` as it is now (``set_attr`` may change it)."""
        return getattr(self.envs[0], "max_episode_steps", None) if self.envs else None

    def write_into(self, arrays: Mapping[str, np.ndarray]) -> bool:
        """Pack straight into ``arrays`` (the batch's own, such as shared memory) instead of
        arrays of its own, when they hold the same fields: one copy less per step. Called
        before the first reset; what ``arrays`` hold is left as it is (a replacement worker
        reads its predecessor's last step there). Whether it does."""
        wanted = {p: (a.shape, a.dtype) for p, a in self.arrays.items()}
        if any(
            not isinstance(arrays.get(p), np.ndarray)
            or (arrays[p].shape, arrays[p].dtype) != w
            or not arrays[p].flags.c_contiguous
            for p, w in wanted.items()
        ):
            return False
        self.arrays = {path: arrays[path] for path in wanted}
        self._views = None
        self._packer = Packer(self.layout, self.arrays, self.offset, self.check_finite)
        return True

    def observation_space(self, agent: str) -> Any:
        return self._obs_spaces[agent]

    def action_space(self, agent: str) -> Any:
        return self._action_spaces[agent]

    # -- the protocol ---------------------------------------------------------------

    def reset(
        self, seed: Seed = None, where: Any = None, options: dict[str, Any] | None = None
    ) -> BatchedStep:
        seeds = copy_seeds(seed, self.num_envs)
        rows = selected(where, self.num_envs)
        packer = self._packer
        packer.begin(rows)
        restarted: set[int] = set()
        faults = []
        inside = self.inside
        inside[1] = RESET
        offset, envs, acting, num_alive = self.offset, self.envs, self._acting, self._num_alive
        broken, to_rebuild = self._broken, self._to_rebuild
        state = self.state_space is not None
        record, alive_as_acting, alive_as_all = (
            packer.record_reset,
            packer.alive_as_acting,
            packer.alive_as_all,
        )
        every_agent = self.possible_agents
        for i in rows.tolist():
            inside[0] = offset + i
            try:
                if broken or to_rebuild:
                    broken.discard(i)
                    if i in to_rebuild:
                        to_rebuild.discard(i)
                        self._rebuild(i)
                        restarted.add(i)
                env = envs[i]
                obs, infos = env.reset(seeds[i], options)  # what it raises: its reset() fault
                acting[i] = keys = record(i, obs, infos)
                agents = env.agents
                if keys and len(agents) == len(keys):  # the same agents: each alive one acts
                    num_alive[i] = len(keys)
                    alive_as_acting(i)
                elif type(agents) is list and agents == every_agent:
                    num_alive[i] = len(agents)
                    alive_as_all(i)
                else:
                    num_alive[i] = packer.gather_alive(i, agents)
                if state:
                    packer.add_state(i, guarded(offset + i, "state()", env.state))
            except Exception as err:
                faults.append(self._restart(i, "reset()", err, seeds[i], options, restarted))
        for i, fault in sorted(packer.flush().items()):  # a bad value: restart the env now
            inside[0] = self.offset + i
            packer.begin(np.array([i]))
            faults.append(self._restart(i, "reset()", fault, seeds[i], options, restarted))
            again = packer.flush().get(i)
            if again is not None:
                self._give_up(i)
                faults[-1] = EnvError(
                    again.env_index,
                    f"{fault.message}; restarting the env failed: {again.message}",
                    again.remote_traceback,
                )
        inside[0] = -1
        return self._output(restarted, faults, step=False)

    def step(self, actions: Mapping[str, Any]) -> BatchedStep:
        packer = self._packer
        packer.begin(None)
        for name, value in actions.items():
            packer.store_actions(name, value)
        restarted: set[int] = set()
        failed = []
        faults = []
        inside = self.inside
        inside[1] = STEP
        offset, envs, acting, broken = self.offset, self.envs, self._acting, self._broken
        num_alive, record = self._num_alive, packer.record_step
        state = self.state_space is not None
        for i in range(self.num_envs):
            inside[0] = offset + i
            try:
                if broken and i in broken:  # its last restart failed: try again
                    fault = self._restart(i, "step()", None, None, None, restarted)
                    if fault is not None:
                        faults.append(fault)
                    continue
                env = envs[i]  # what it raises in here is its step() fault
                actions = {}
                for agent, f, g in acting[i]:
                    actions[agent] = g.actions[f]
                obs, rewards, terminations, truncations, infos = env.step(actions)
                acting[i] = record(i, obs, rewards, terminations, truncations, infos, num_alive)
                if state:
                    packer.add_state(i, guarded(offset + i, "state()", env.state))
                agents = env.agents
                if len(agents) != num_alive[i]:  # agents joined, or (wrongly) left or stayed
                    packer.check_leaving(i, agents, terminations, truncations)
                    num_alive[i] = packer.read_alive(i, agents)
            except Exception as err:
                failed.append(i)
                faults.append(self._cut(i, "step()", err))
        inside[0] = -1
        for i, fault in sorted(packer.flush().items()):
            failed.append(i)
            faults.append(self._bad_value(i, fault))
        out = self._output(restarted, faults, step=True)
        if failed:
            out.failed = self._mask(failed)
            out.same_alive = False
        return out

    def set_attr(self, name: str, values: Sequence[Any]) -> None:
        """Set attribute ``name`` of env ``i`` to ``values[i]`` where reading it finds it
        (:func:`~corral.vector.env_calls.set_env_attrs`), and again on each env rebuilt
        later."""
        set_env_attrs(self.envs, self.offset, name, values)
        remember(self.written, name, values)

    def close(self) -> None:
        """Close every env, then raise the first that failed (every fault in its ``faults``)."""
        envs, self.envs = self.envs, []
        faults: list[BaseException] = []
        for i, env in enumerate(envs):
            try:
                guarded(self.offset + i, "close()", env.close)
            except EnvError as fault:
                faults.append(fault)
        if faults:
            raise first_fault(faults)

    # -- one env ----------------------------------------------------------------------

    def _reset_env(self, i: int, seed: int | None, options: dict[str, Any] | None) -> None:
        """Reset env ``i`` (its rows were not cleared by the call's ``begin``)."""
        env = self.envs[i]
        obs, infos = env.reset(seed, options)  # what it raises is its reset() fault
        packer = self._packer
        packer.clear_obs(i)
        self._acting[i] = packer.record_reset(i, obs, infos)
        self._num_alive[i] = packer.read_alive(i, env.agents)
        if self.state_space is not None:
            packer.add_state(i, guarded(self.offset + i, "state()", env.state))

    def _cut(self, i: int, what: str, err: BaseException) -> EnvError:
        """Env ``i`` failed in a step: its episode ends where it stood before the step,
        truncated; it is rebuilt at its reset (in this same step)."""
        self._packer.put_back(i)
        self._packer.truncate(i)
        self._acting[i] = ()
        self._num_alive[i] = 0
        self._to_rebuild.add(i)
        fault = env_error(self.offset + i, what, err)
        fault.restarted = True
        return fault

    def _restart(
        self,
        i: int,
        what: str,
        err: BaseException | None,
        seed: int | None,
        options: dict[str, Any] | None,
        restarted: set[int],
    ) -> EnvError | None:
        """Rebuild env ``i`` after ``err`` (or, with ``None``, after a failed restart) and
        reset it; the fault to report, or ``None`` if a retry succeeded quietly."""
        fault = None if err is None else env_error(self.offset + i, what, err)
        restarted.add(i)
        self._packer.forget(i)
        try:
            self._rebuild(i)
            self._reset_env(i, seed, options)
        except Exception as again:
            self._give_up(i)
            failed = env_error(self.offset + i, "reset() of the rebuilt env", again)
            if fault is None:
                text = f"restarting the env failed again: {failed.message}"
                return EnvError(failed.env_index, text, failed.remote_traceback)
            return EnvError(
                fault.env_index,
                f"{fault.message}; restarting the env failed: {failed.message}",
                f"{fault.remote_traceback}\n{failed.remote_traceback}",
            )
        if fault is not None:
            fault.restarted = True
        return fault

    def _build(self, i: int) -> Any:
        """Env ``i`` from its constructor, adapted, with what :meth:`set_attr` wrote on the
        env it replaces (none at the start)."""
        index, build = self.offset + i, self.env_fns[i]
        env = guarded(index, "building the env", lambda: adapt(build()))
        _skip_action_checks(env)
        for name, values in self.written.items():
            what = f"setting attribute {name!r} on the rebuilt env"
            guarded(index, what, functools.partial(set_env_attr, env, name, values[i]))
        return env

    def _rebuild(self, i: int) -> None:
        env = self._build(i)
        old, self.envs[i] = self.envs[i], env
        with contextlib.suppress(Exception):  # it failed already; its close may too
            old.close()

    def _give_up(self, i: int) -> None:
        """Env ``i`` has no episode: none of its agents lives until a restart succeeds."""
        self._broken.add(i)
        self._packer.forget(i)
        self._acting[i] = ()
        self._num_alive[i] = 0

    def _bad_value(self, i: int, fault: EnvError) -> EnvError:
        """Env ``i`` returned a value that does not fit: its step did not happen (for none
        of its agents), and its episode ends where it stood before it, truncated."""
        self._packer.put_back_written(i)
        self._packer.truncate(i)
        self._acting[i] = ()
        self._num_alive[i] = 0
        self._to_rebuild.add(i)
        fault.restarted = True
        return fault

    def _mask(self, indices: Iterable[int]) -> np.ndarray | None:
        """The ``[E]`` bool mask of ``indices``; ``None`` for none."""
        if not indices:
            return None
        mask = np.zeros(self.num_envs, bool)
        mask[list(indices)] = True
        return mask

    def _output(self, restarted: set[int], faults: list, step: bool) -> BatchedStep:
        """What the call returns: one :class:`BatchedStep` per kind of call, kept (its
        arrays are the same at every call), with this call's restarts and faults."""
        if self._views is None:
            a, layout = self.arrays, self.layout

            def per_group(field: str) -> dict[str, np.ndarray]:
                return {g: a[f"{field}/{g}"] for g in layout.groups}

            state = self.state_space
            obs = {g: assemble(gr.obs_tree, f"obs/{g}", a) for g, gr in layout.groups.items()}
            alive, acting = per_group("alive"), per_group("acting")
            masks = {g: a[f"action_mask/{g}"] for g in layout.groups if f"action_mask/{g}" in a}
            states = None if state is None else assemble(array_tree(state), "state", a)
            ends = (per_group("reward"), per_group("terminated"), per_group("truncated"))
            self._views = (
                BatchedStep(obs, alive, acting, masks, *ends, state=states),
                BatchedStep(obs, alive, acting, masks, state=states),
            )
        out = self._views[0 if step else 1]
        out.restarted = self._mask(restarted) if restarted else None
        out.faults = faults
        out.failed = None
        out.same_alive = step and not restarted and self._packer.same_alive()
        return out


def _skip_action_checks(env: Any) -> None:
    """The vector env validated the batch: checking each env's actions again is waste."""
    if isinstance(env, MultiAgentEnv):
        env.check_actions = False
