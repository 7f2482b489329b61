"""``VectorEnv``: many copies of an env as one batch of arrays per agent group."""

from __future__ import annotations

import difflib
import enum
import numbers
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from corral.adapters import adapt
from corral.arrays import Array, Place, to_numpy, tree_to_numpy
from corral.arrays.tree import map_tree
from corral.errors import (
    EnvError,
    EnvRestartWarning,
    InvalidActionError,
    VectorStateError,
    WorkerTimeoutError,
)
from corral.groups import GroupMap, checked_group_map
from corral.registry import batched_ids, spec
from corral.returned_values import debug_mode, describe
from corral.spaces import action_rule, group_problem
from corral.vector.backend import (
    BACKENDS,
    EnvFn,
    backend_class,
    backend_options,
    check_options,
    check_timeout,
)
from corral.vector.deferred import DeferredChecks
from corral.vector.layout import ArraySpec, Layout, Role, array_tree, assemble, store
from corral.vector.sampling import sample_array
from corral.vector.sources import NativeSource, Source, as_source
from corral.vector.validation import clip_to_space


@dataclass
class Batch:
    """One vector step. Per-group fields are dicts ``{group: array}``.

    Shapes for a group of ``n`` agents over ``E`` envs: ``obs[g]`` and
    ``final_obs[g]`` ``[E, n, *obs_shape]`` (nested dicts/tuples for Dict/Tuple
    spaces); ``reward``, ``terminated``, ``truncated``, ``alive``, ``acting``,
    ``episode_return``, ``clipped_actions`` ``[E, n]``; ``action_mask[g]``
    ``[E, n, n_actions]`` for discrete groups; ``state``/``final_state``
    ``[E, *state_shape]`` or ``None``; ``done``, ``episode_length``,
    ``worker_restarts`` ``[E]``.

    ``done[e]`` means env ``e``'s episode ended in this step and the env was
    reset: ``obs`` already holds the new episode and ``final_obs``,
    ``final_state``, ``episode_return`` and ``episode_length`` the ended one.

    ``clipped_actions[g][e, j]`` counts the entries of agent ``j``'s action in
    this step that lay outside its ``Box`` and were clipped into it (with
    ``clip_actions=True``; always 0 otherwise).

    ``decision[g][e, j]`` (``[E, n]`` int64) is the index, in its episode, of the
    decision agent ``j`` makes if it acts at this batch: the decisions it made so far
    there (0 at an episode's start, including where ``done``; one more after each step
    in which it acted). ``episode_decisions[g]`` (where ``done``): the decisions each
    agent made in the episode that ended.

    ``worker_restarts[e]`` counts the restarts of env ``e`` after any fault: its
    worker died or missed the timeout, or the env itself raised.

    ``episode_cut[e]`` (where ``done``): the episode that ended was cut by a fault
    (its env raised or returned a bad value, its worker died or missed the timeout),
    not ended by the env; its stats are those up to the cut. An episode that ended in
    the step of a fault, as the env ended it, is not cut.
    """

    obs: dict[str, Any]
    reward: dict[str, Array]
    terminated: dict[str, Array]
    truncated: dict[str, Array]
    alive: dict[str, Array]
    acting: dict[str, Array]
    action_mask: dict[str, Array]
    state: Any
    done: Array
    final_obs: dict[str, Any]
    final_state: Any
    episode_return: dict[str, Array]
    episode_length: Array
    worker_restarts: Array
    clipped_actions: dict[str, Array]
    episode_cut: Array
    decision: dict[str, Array]
    episode_decisions: dict[str, Array]


class _Pending(enum.Enum):
    NONE = "none"
    RESET = "reset"
    STEP = "step"
    CALL = "call"
    CLOSED = "closed"


def checked_seed(seed: Any) -> int | None:
    """``seed`` as a Python ``int`` (``None`` stays ``None``); anything but a non-negative
    integer (numpy's included) is a ``ValueError`` naming it."""
    if seed is None:
        return None
    if isinstance(seed, (bool, np.bool_)) or not isinstance(seed, numbers.Integral) or seed < 0:
        raise ValueError(f"seed must be a non-negative integer or None, got {seed!r}")
    return int(seed)


class VectorEnv:
    """``num_envs`` copies of a multi-agent env, stepped as one batch.

    Args:
        env_fns: one constructor per env; each returns a corral env or any env
            :func:`corral.adapt` accepts. All must share agents and spaces. Or a
            source of natively batched copies
            (:class:`~corral.vector.sources.NativeSource`, as
            :func:`make_vec` builds with ``native=True``).
        backend: ``"sync"`` (in-process), ``"subproc"`` (worker processes over
            shared memory) or ``"ray"`` (Ray actors).
        seed: seed of the first ``reset()`` called without one.
        group_map: how agents form groups; see :func:`corral.group_agents`.
        state: fill ``Batch.state`` and ``final_state`` from the envs' ``state()``
            (a centralised critic needs it). Off by default: it costs one
            ``state()`` call per env step, a fifth of an MPE step.
        copy: return arrays the caller owns (``True``) or views into the
            backend's buffers, valid until the next step (``False``, faster).
        clip_actions: clip continuous (``Box``) actions into their bounds and
            count the clipped entries in ``Batch.clipped_actions``, instead of
            raising :class:`InvalidActionError` (the default). NaN still raises.
        on_env_error: what a step or reset does when an env fails (raises, or its
            worker misses the timeout), once the other envs' step is complete and
            the failed env restarted (its episode ends truncated): ``"raise"`` the
            :class:`EnvError` (or :class:`WorkerTimeoutError`) with that batch as
            ``err.batch`` (the next step goes on from it), or ``"restart"``: warn
            (:class:`~corral.errors.EnvRestartWarning`) and return the batch. An env
            that cannot be restarted raises either way.
        check_finite: raise :class:`~corral.errors.EnvError` (naming the env, agent
            and field) for NaN or inf in an observation, ``final_obs``, reward or
            state. (A value that its array's dtype cannot hold, ``1e300`` as
            ``float32``, always raises.) ``None`` (the default): on in debug mode
            (:func:`corral.returned_values.debug_mode`: ``CORRAL_DEBUG=1`` or
            ``python -X dev``), off otherwise, as it costs time in every step.
        array: ``"numpy"`` or ``"torch"``: what the batch's fields are.
        device: where torch fields live (``"cpu"``, ``"cuda"``); not ``"cpu"`` only
            on ``backend="sync"``.
        deferred_checks: on a device (a natively batched env on ``device="cuda"``),
            check ``Discrete`` and ``Box`` actions there without reading them back: an
            invalid entry of an acting agent is replaced by a legal stand-in and the
            first problem is raised by :meth:`raise_deferred` (which ``reset()`` and
            ``close()`` call too) instead of by ``step()``. Wrong shapes and dtypes,
            a missing group and other spaces still raise in ``step()``. Where the
            layer computes on the host (numpy, torch on the CPU) checks stay
            immediate.
        **options: backend options (``num_workers``, ``envs_per_worker``,
            ``start_method``, ``timeout``, ``ray_address``...); an option the
            backend does not take raises ``ValueError``.

    ``native`` says whether the copies are one natively batched env (``True``) or
    packed dict envs.

    Examples:
        >>> import corral
        >>> venv = corral.VectorEnv([lambda: corral.make("corral/rps")] * 2)
        >>> batch = venv.reset(seed=0)
        >>> batch.acting["player"].tolist()
        [[True, False], [True, False]]
        >>> venv.close()
    """

    def __init__(
        self,
        env_fns: Sequence[EnvFn] | Source,
        backend: str = "sync",
        *,
        seed: int | None = None,
        group_map: GroupMap = None,
        state: bool = False,
        copy: bool = True,
        clip_actions: bool = False,
        on_env_error: Literal["raise", "restart"] = "raise",
        check_finite: bool | None = None,
        array: str = "numpy",
        device: str = "cpu",
        deferred_checks: bool = False,
        **options: Any,
    ) -> None:
        if on_env_error not in ("raise", "restart"):
            raise ValueError(f"on_env_error must be 'raise' or 'restart', got {on_env_error!r}")
        flags: dict[str, Any] = {"state": state, "copy": copy, "clip_actions": clip_actions}
        flags["deferred_checks"] = deferred_checks
        if check_finite is not None:  # None: debug_mode() decides
            flags["check_finite"] = check_finite
        for name, value in flags.items():
            if not isinstance(value, (bool, np.bool_)):
                raise TypeError(f"{name} must be True or False, got {value!r}")
        seed = checked_seed(seed)
        group_map = checked_group_map(group_map)
        self.place = Place(array, device)
        check_options(backend, options)
        self.check_finite = debug_mode() if check_finite is None else bool(check_finite)
        source = as_source(
            env_fns, group_map=group_map, state=state, check_finite=self.check_finite
        )
        if source.num_envs == 0:
            raise ValueError("a VectorEnv needs at least one env constructor")
        self.native = isinstance(source, NativeSource)
        if isinstance(source, NativeSource) and group_map is not None:
            raise ValueError(
                "a natively batched env has its own groups; group_map needs native=False"
            )
        if self.place.device != "cpu" and backend != "sync":
            raise ValueError(
                f"device={device!r} runs only on backend='sync' (one process holds the GPU); "
                f"backend {backend!r} shares CPU memory"
            )
        self.backend_name = backend
        self.copy = copy
        self.clip_actions = clip_actions
        self.on_env_error = on_env_error
        self._pending = _Pending.CLOSED
        self._backend = backend_class(backend)(source, **options)
        try:
            self._lay_out(source.num_envs, state, deferred_checks)
        except BaseException:  # nothing the backend started outlives a failed start
            self._backend.close(terminate=True)
            raise
        self._first_seed = seed

    def _lay_out(self, num_envs: int, state: bool, deferred_checks: bool) -> None:
        """Lay the batch out from what the backend's envs are, and start the backend."""
        info = self._backend.env_info()
        self.metadata = info.metadata
        self._max_episode_steps = info.max_episode_steps
        self.possible_agents = info.possible_agents
        self.layout = Layout(
            info.groups,
            info.observation_spaces.__getitem__,
            info.action_spaces.__getitem__,
            info.state_space if state else None,
            num_envs,
            check_finite=self.check_finite,
            place=info.place,
        )
        inner = self.layout.place
        if (inner.array, inner.device) == (self.place.array, self.place.device):
            self.place = inner  # the env's own: how it computes (host_views) included
        self._clipped = {
            name: inner.zeros((self.num_envs, len(g.agents)), np.dtype(np.int64))
            for name, g in self.layout.groups.items()
        }
        # The counts live in the parent, beside the backend's arrays: clipping precedes the step.
        self._arrays = {
            **self._backend.start(self.layout),
            **{f"clipped_actions/{name}": a for name, a in self._clipped.items()},
        }
        self._batch_paths = [
            *self.layout.paths(Role.STEP, Role.EPISODE),
            *(f"clipped_actions/{name}" for name in self._clipped),
        ]
        # The checks of actions read acting and masks of CPU tensors through numpy views of
        # their memory (numpy's calls cost less at these sizes).
        self._host_actions = inner.is_torch and inner.computes_on_host
        view = to_numpy if self._host_actions else (lambda a: a)
        self._action_arrays = {p: view(self._arrays[p]) for p in self.layout.paths(Role.ACTION)}
        # An action array given as numpy is checked and stored as it is (else converted).
        self._numpy_actions = not inner.is_torch or self._host_actions
        # Per group: its name, the group, its acting and mask arrays (as the checks read
        # them), the action array it is stored in where its actions are one array, and a
        # cheaper first look at its actions where there is one.
        self._action_plan = []
        for name, g in self.layout.groups.items():
            acting = view(self._arrays[f"acting/{name}"])
            mask = None if g.num_actions is None else view(self._arrays[f"action_mask/{name}"])
            target = (
                self._action_arrays[f"action/{name}"]
                if isinstance(g.action_tree, ArraySpec)
                else None
            )
            host = isinstance(acting, np.ndarray) and isinstance(mask, (np.ndarray, type(None)))
            rule = action_rule(g.action_space)
            fine = rule.few_check(acting.shape) if host else None
            self._action_plan.append((name, g, rule, acting, mask, target, fine))
        self._views: Batch | None = None  # with copy=False every batch is the same views
        self.deferred_checks = bool(deferred_checks)
        self._deferred = None
        if deferred_checks and not inner.computes_on_host:
            self._deferred = DeferredChecks(self.layout, self.clip_actions)
        space = self.layout.state_space
        self._state_tree = None if space is None else array_tree(space)
        self._pending = _Pending.NONE
        self._started = False

    # -- description ----------------------------------------------------------

    @property
    def num_envs(self) -> int:
        return self.layout.num_envs

    @property
    def groups(self) -> dict[str, tuple[str, ...]]:
        """Group name -> its agents, in array order."""
        return {name: g.agents for name, g in self.layout.groups.items()}

    def observation_space(self, key: str) -> Any:
        """The observation space of one agent of the group ``key``, or of the agent ``key``
        (not batched: a batch holds ``[E, n, *shape]`` of it per group). Another key raises
        :class:`~corral.errors.UnknownAgentError`, listing the groups and their agents."""
        return self.layout.group(key).observation_space

    def action_space(self, key: str) -> Any:
        """The action space of one agent of the group ``key``, or of the agent ``key``
        (not batched: actions go in as ``[E, n, *shape]`` of it per group). Another key
        raises :class:`~corral.errors.UnknownAgentError`, listing the groups and their agents."""
        return self.layout.group(key).action_space

    def single_observation_space(self, key: str) -> Any:
        """:meth:`observation_space`, under the name AgileRL's vector envs use."""
        return self.observation_space(key)

    def single_action_space(self, key: str) -> Any:
        """:meth:`action_space`, under the name AgileRL's vector envs use."""
        return self.action_space(key)

    @property
    def state_space(self) -> Any:
        return self.layout.state_space

    @property
    def max_episode_steps(self) -> int | None:
        """The first env's ``max_episode_steps``: the most steps an episode lasts, or ``None``."""
        return self._max_episode_steps

    # -- reset and step -----------------------------------------------------------

    def reset(self, seed: int | None = None, options: dict[str, Any] | None = None) -> Batch:
        """Reset every env (env ``i`` with ``seed + i``) and return the first batch."""
        self.reset_async(seed, options)
        return self.reset_wait()

    def reset_async(self, seed: int | None = None, options: dict[str, Any] | None = None) -> None:
        self._expect(_Pending.NONE, "reset_async")
        self.raise_deferred()  # before the reset: a problem of the steps before it
        seed = checked_seed(seed)
        if seed is None and not self._started:
            seed = self._first_seed
        seeds = [None if seed is None else seed + i for i in range(self.num_envs)]
        for clipped in self._clipped.values():
            clipped[...] = 0
        self._backend.reset_async(seeds, options)
        self._pending = _Pending.RESET

    def reset_wait(self, timeout: float | None = None) -> Batch:
        self._expect(_Pending.RESET, "reset_wait")
        check_timeout(self.backend_name, timeout)
        self._pending = _Pending.NONE
        try:
            self._backend.reset_wait(timeout)
        except (EnvError, WorkerTimeoutError) as err:
            self._started = True
            return self._faulty_batch(err)
        self._started = True
        return self._batch()

    def step(self, actions: Mapping[str, Any]) -> Batch:
        """Apply ``actions[g]`` (``[E, n, *action_shape]``) and return the next batch.

        Entries of agents that are not acting are ignored.
        """
        self.step_async(actions)
        return self.step_wait()

    def step_async(self, actions: Mapping[str, Any]) -> None:
        if self._pending is not _Pending.NONE:
            self._expect(_Pending.NONE, "step_async")
        if not self._started:
            raise VectorStateError("step_async() before reset(): call reset() first")
        self._write_actions(actions)
        self._backend.step_async()
        self._pending = _Pending.STEP

    def step_wait(self, timeout: float | None = None) -> Batch:
        if self._pending is not _Pending.STEP:
            self._expect(_Pending.STEP, "step_wait")
        if timeout is not None:
            check_timeout(self.backend_name, timeout)
        self._pending = _Pending.NONE
        try:
            self._backend.step_wait(timeout)
        except (EnvError, WorkerTimeoutError) as err:
            return self._faulty_batch(err)
        return self._batch()

    def sample_actions(self, batch: Batch, rng: np.random.Generator | None = None) -> dict:
        """Uniformly random actions for every group, legal under ``batch.action_mask``, as
        arrays of the batch's place (drawn on the host)."""
        rng = np.random.default_rng() if rng is None else rng
        lead = (self.num_envs,)
        out = {}
        for name, g in self.layout.groups.items():
            mask = batch.action_mask.get(name)
            mask = None if mask is None else to_numpy(mask)
            out[name] = sample_array(g.action_space, (*lead, len(g.agents)), rng, mask)
        if self.place.is_torch:
            out = {name: _in(self.place, value) for name, value in out.items()}
        return out

    # -- other calls ------------------------------------------------------------------

    def call(self, name: str, *args: Any, timeout: float | None = None, **kwargs: Any) -> list:
        """Call method ``name`` (or read attribute ``name``) on every env."""
        check_timeout(self.backend_name, timeout)
        self.call_async(name, *args, **kwargs)
        return self.call_wait(timeout)

    def call_async(self, name: str, *args: Any, **kwargs: Any) -> None:
        """Start :meth:`call` on every env; :meth:`call_wait` returns the values. Worker
        backends send it at once, so the caller may work meanwhile."""
        self._expect(_Pending.NONE, "call_async")
        self._backend.call_async(name, args, kwargs)
        self._pending = _Pending.CALL

    def call_wait(self, timeout: float | None = None) -> list:
        """The values of the call started by :meth:`call_async`, one per env, in order."""
        self._expect(_Pending.CALL, "call_wait")
        check_timeout(self.backend_name, timeout)
        self._pending = _Pending.NONE
        return self._backend.call_wait(timeout)

    def get_attr(self, name: str, timeout: float | None = None) -> list:
        """Attribute ``name`` of every env (an adapter's, else its source env's)."""
        self._expect(_Pending.NONE, "get_attr")
        check_timeout(self.backend_name, timeout)
        return self._backend.call(name, None, {}, timeout)

    def set_attr(self, name: str, values: Any, timeout: float | None = None) -> None:
        """Set attribute ``name`` of env ``i`` to ``values[i]`` (or every env to ``values``),
        on the object :meth:`get_attr` reads it from: an adapter's source env, where it
        holds ``name``. A natively batched env takes one value for all its copies, for the
        attributes it lists in ``settable_attributes``."""
        self._expect(_Pending.NONE, "set_attr")
        check_timeout(self.backend_name, timeout)
        if not isinstance(values, (list, tuple)):
            values = [values] * self.num_envs
        if len(values) != self.num_envs:
            raise ValueError(f"set_attr needs {self.num_envs} values, got {len(values)}")
        if self.native:
            _one_value(name, values)
        self._max_episode_steps = self._backend.set_attr(name, values, timeout)

    def render(self) -> list:
        """Every env's frame, in env order."""
        return self.call("render")

    def raise_deferred(self) -> None:
        """With ``deferred_checks`` on a device: raise the
        :class:`~corral.errors.InvalidActionError` of the first invalid action since the
        last call (naming the step, counted from that call), reading the device once;
        nothing where there was none. Elsewhere it does nothing: ``step()`` raised."""
        if self._deferred is not None:
            self._deferred.raise_first()

    def close(self, *, terminate: bool = False) -> None:
        """Stop the envs and free their resources (then raise a deferred problem, see
        :meth:`raise_deferred`); calling it again does nothing. ``terminate``: kill the
        worker processes or actors at once, without letting them close their envs (on
        ``sync`` the envs are closed as usual)."""
        if self._pending is not _Pending.CLOSED:
            self._shut(terminate)
            self.raise_deferred()

    def _shut(self, terminate: bool = False) -> None:
        self._pending = _Pending.CLOSED
        self._backend.close(terminate)

    def __enter__(self) -> VectorEnv:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        if getattr(self, "_pending", _Pending.CLOSED) is not _Pending.CLOSED:
            self._shut()

    # -- internals ----------------------------------------------------------------------

    def _expect(self, state: _Pending, call: str) -> None:
        if self._pending is state:
            return
        if self._pending is _Pending.CLOSED:
            raise VectorStateError(f"{call}() on a closed VectorEnv")
        if state is _Pending.NONE:
            raise VectorStateError(
                f"{call}() while a {self._pending.value}_async() awaits its "
                f"{self._pending.value}_wait()"
            )
        raise VectorStateError(f"{call}() without a pending {state.value}_async()")

    def _faulty_batch(self, err: EnvError | WorkerTimeoutError) -> Batch:
        """The batch of a step or reset in which ``err`` (and ``err.faults``) happened: raised
        with the batch attached, or with ``on_env_error="restart"`` warned and returned."""
        batch = self._batch()
        err.batch = batch
        restarted = [
            f for f in err.faults if isinstance(f, (EnvError, WorkerTimeoutError)) and f.restarted
        ]
        unrecovered = [f for f in err.faults if f not in restarted]
        if unrecovered:  # an env that cannot be restarted: raised whatever on_env_error says
            first = unrecovered[0]
            first.batch, first.faults = batch, err.faults
            raise first
        if self.on_env_error == "raise":
            raise err
        for fault in restarted:
            warnings.warn(EnvRestartWarning(fault), stacklevel=4)  # the caller of step()
        return batch

    def _write_actions(self, actions: Mapping[str, Any]) -> None:
        if type(actions) is not dict and not isinstance(actions, Mapping):
            raise InvalidActionError(
                f"actions must be a dict keyed by group ({list(self.groups)}), "
                f"got {type(actions).__name__}"
            )
        groups = self.layout.groups
        for name in actions:
            if name not in groups:
                raise InvalidActionError(self._unknown_group(name))
        checked = {}
        deferred = self._deferred
        if deferred is not None:
            deferred.next_step()
        for name, group, rule, acting, mask, target, fine in self._action_plan:
            if name not in actions:
                if acting.any():
                    env, j = (int(x) for x in np.argwhere(to_numpy(acting))[0])
                    raise InvalidActionError(
                        f"group {name!r} is missing from the actions, but env {env}, "
                        f"agent {group.agents[j]!r} must act"
                    )
                continue
            action, clipped = actions[name], None
            if type(action) is not np.ndarray or not self._numpy_actions:
                action = self._in_place(name, group.action_tree, action)
            safe = None if deferred is None else deferred.check(name, action, acting, mask)
            if safe is not None:  # checked on the device, problems kept there
                checked[name] = (group, *safe, target)
                continue
            if self.clip_actions:
                action, clipped = self._clip(group.action_space, action, acting)
            if fine is not None and fine(action, mask):
                checked[name] = (group, action, clipped, target)
                continue
            problem = group_problem(
                rule, action, acting, mask, host_views=self.layout.place.host_views
            )
            if problem is not None:
                env, j, text = problem
                where = f"group {name!r}" + (
                    f", env {env}, agent {group.agents[j]!r}" if env >= 0 else ""
                )
                if env >= 0 and mask is not None and not to_numpy(mask)[env, j].any():
                    text += (
                        ", but its action mask forbids every action: the env asks an agent to "
                        "act and leaves it no legal action (corral check finds such envs)"
                    )
                raise InvalidActionError(f"{where}: expected {text}")
            checked[name] = (group, action, clipped, target)
        for name, (group, action, _, target) in checked.items():
            if self._host_actions:
                action = tree_to_numpy(action)
            if target is None:
                store(group.action_tree, f"action/{name}", self._action_arrays, action)
            else:
                target[...] = action
        if self.clip_actions:
            for name, counts in self._clipped.items():
                counts[...] = checked[name][2] if name in checked else 0

    def _unknown_group(self, key: Any) -> str:
        """Why ``actions[key]`` is refused: no such group (an agent's actions go into its
        group's array)."""
        text = f"actions for unknown group {key!r}"
        if key in self.layout.position:
            group, j = self.layout.position[key]
            text += (
                f": {key!r} is an agent, and actions are keyed by group, one array "
                f"[env, agent, *action_shape] per group; its actions go in "
                f"actions[{group!r}][:, {j}]"
            )
        return f"{text}; {self.layout.describe_groups()}"

    def _in_place(self, group: str, tree: Any, action: Any) -> Any:
        """``action``, nested as the action tree ``tree``, as arrays of the layout's place
        (a nested list where the tree has one array: that array); a value that does not
        follow the tree is left for the checks to name."""
        if isinstance(tree, dict):
            if not isinstance(action, dict):
                return action
            return {
                k: self._in_place(group, tree[k], v) if k in tree else v for k, v in action.items()
            }
        if isinstance(tree, tuple):
            if not isinstance(action, (tuple, list)) or len(action) != len(tree):
                return action
            return type(action)(
                self._in_place(group, t, v) for t, v in zip(tree, action, strict=True)
            )
        try:
            if self.layout.place.is_torch and not self._host_actions:
                return self.layout.place.asarray(action)
            return to_numpy(action)  # on the CPU, checked and stored through numpy views
        except (TypeError, ValueError) as err:
            raise InvalidActionError(
                f"group {group!r}: expected an array [env, agent, *action_shape], got "
                f"{describe(action)} ({err})"
            ) from None

    def _clip(self, space: Any, action: Any, acting: Any) -> tuple[Any, Any]:
        if not self.layout.place.is_torch:
            return clip_to_space(space, action, acting)
        clipped, counts = clip_to_space(space, to_numpy(action), to_numpy(acting))
        place = self.layout.place
        return place.asarray(clipped), place.asarray(counts)

    def _batch(self) -> Batch:
        if not self.copy:
            if self._views is None:
                self._views = self._assemble(self._outputs(self._arrays, copy=False))
            return self._views
        return self._assemble(self._outputs(self._arrays, copy=True))

    def _outputs(self, arrays: Mapping[str, Any], copy: bool) -> dict[str, Any]:
        """The batch's arrays in the place asked for (``array``, ``device``)."""
        convert = self.place != self.layout.place
        out = {}
        for path in self._batch_paths:
            value = arrays[path]
            if convert:
                value = self.place.from_host(value)  # dict envs pack into numpy
            out[path] = _copy_of(value) if copy else value
        return out

    def _assemble(self, arrays: Mapping[str, np.ndarray]) -> Batch:
        groups = self.layout.groups

        def per_group(field: str) -> dict[str, np.ndarray]:
            return {g: arrays[f"{field}/{g}"] for g in groups}

        state_tree = self._state_tree
        return Batch(
            obs={g: assemble(group.obs_tree, f"obs/{g}", arrays) for g, group in groups.items()},
            reward=per_group("reward"),
            terminated=per_group("terminated"),
            truncated=per_group("truncated"),
            alive=per_group("alive"),
            acting=per_group("acting"),
            action_mask={
                g: arrays[f"action_mask/{g}"] for g in groups if f"action_mask/{g}" in arrays
            },
            state=None if state_tree is None else assemble(state_tree, "state", arrays),
            done=arrays["done"],
            final_obs={
                g: assemble(group.obs_tree, f"final_obs/{g}", arrays) for g, group in groups.items()
            },
            final_state=None if state_tree is None else assemble(state_tree, "final_state", arrays),
            episode_return=per_group("episode_return"),
            episode_length=arrays["episode_length"],
            worker_restarts=arrays["worker_restarts"],
            clipped_actions=per_group("clipped_actions"),
            episode_cut=arrays["episode_cut"],
            decision=per_group("decision"),
            episode_decisions=per_group("episode_decisions"),
        )


def make_vec(
    id: str,
    num_envs: int,
    backend: str = "sync",
    *,
    native: bool | None = None,
    array: str = "numpy",
    device: str = "cpu",
    dtype: str | None = None,
    seed: int | None = None,
    group_map: GroupMap = None,
    state: bool = False,
    copy: bool = True,
    clip_actions: bool = False,
    on_env_error: Literal["raise", "restart"] = "raise",
    check_finite: bool | None = None,
    deferred_checks: bool = False,
    env_kwargs: Mapping[str, Any] | None = None,
    **options: Any,
) -> VectorEnv:
    """``num_envs`` copies of the registered env ``id`` as one :class:`VectorEnv`.

    ``native``: step all copies as one natively batched env (the default where ``id``
    has one, see :func:`corral.batched_ids`, and no ``group_map`` is given); ``False``
    packs one dict env per copy.
    ``array`` (``"numpy"`` or ``"torch"``) and ``device`` say where the batch's arrays
    live; a native env computes there, in ``dtype`` where it takes one (natively batched
    MPE: ``"float64"``, the default on the CPU, or ``"float32"``). ``seed`` seeds the
    first ``reset()`` (env ``i`` gets ``seed + i``); the env's keyword arguments go in
    ``env_kwargs``, backend options in ``**options``; the other arguments are
    :class:`VectorEnv`'s.
    """
    if not isinstance(num_envs, numbers.Integral) or isinstance(num_envs, bool) or num_envs < 1:
        raise ValueError(f"num_envs must be an int of at least 1, got {num_envs!r}")
    num_envs = int(num_envs)
    env_spec = spec(id)
    kwargs = dict(env_kwargs or {})
    known = _all_backend_options() if options else set()
    # an option that no backend takes, nor spells nearly: an env keyword argument, likely
    strangers = {k: v for k, v in options.items() if not difflib.get_close_matches(k, known)}
    if strangers:
        raise ValueError(
            f"make_vec takes no argument {', '.join(map(repr, strangers))}, and no backend "
            f"takes such an option; the env's keyword arguments go in env_kwargs, e.g. "
            f"make_vec({id!r}, {num_envs}, env_kwargs={strangers!r})"
        )
    group_map = checked_group_map(group_map)  # "prefix", the default, is a native env's too
    if native is None:
        native = env_spec.batched is not None and group_map is None
    source: Any
    if native:
        if env_spec.batched is None:
            raise ValueError(
                f"env {id!r} has no natively batched implementation (native=True); the ids "
                f"that have one: {', '.join(batched_ids()) or 'none'}"
            )
        if dtype is not None:
            kwargs["dtype"] = dtype
        # The spec travels to the workers, so ids registered at run time work there too.
        source = NativeSource(_BatchedFactory(env_spec, array, device, kwargs), num_envs)
    else:
        if env_spec.entry_point is None:
            why = "native=False" if group_map is None else f"group_map={group_map!r}"
            raise ValueError(
                f"env {id!r} is registered only natively batched, with its own groups: "
                f"{why} needs its dict env, which it has not; leave native and group_map unset"
            )
        if dtype is not None:
            raise ValueError(
                f"dtype={dtype!r} sets what a natively batched env computes in; the dict envs "
                f"of {id!r} (native=False) compute as their library does: leave dtype out"
            )
        source = [_EnvFactory(env_spec, kwargs)] * num_envs
    return VectorEnv(
        source,
        backend,
        array=array,
        device=device,
        seed=seed,
        group_map=group_map,
        state=state,
        copy=copy,
        clip_actions=clip_actions,
        on_env_error=on_env_error,
        check_finite=check_finite,
        deferred_checks=deferred_checks,
        **options,
    )


def _all_backend_options() -> set[str]:
    """The options that some backend takes."""
    return {option for name in BACKENDS for option in backend_options(name)}


@dataclass(frozen=True)
class _BatchedFactory:
    """A picklable ``lambda n: spec.make_batched(n, array, device, **kwargs)``."""

    spec: Any
    array: str
    device: str
    kwargs: dict[str, Any]

    def __call__(self, num_envs: int) -> Any:
        return self.spec.make_batched(num_envs, self.array, self.device, **self.kwargs)


def _in(place: Place, value: Any) -> Any:
    """A nested value of numpy arrays as arrays of ``place``."""
    return map_tree(place.asarray, value, lists=True)


def _one_value(name: str, values: Sequence[Any]) -> None:
    """Raise a ``ValueError`` unless every entry of ``values`` is the same value: a natively
    batched env has one of each attribute for all its copies."""
    first = values[0]
    for i, value in enumerate(values):
        try:
            same = value is first or bool(value == first)
        except (TypeError, ValueError):  # an array's comparison has no single truth
            same = False
        if not same:
            raise ValueError(
                f"set_attr({name!r}): a natively batched env has one value of {name!r} for "
                f"all its copies, but env {i} got {describe(value)} and env 0 "
                f"{describe(first)}; give one value, or use native=False for one per env"
            )


def _copy_of(value: Any) -> Any:
    return value.copy() if isinstance(value, np.ndarray) else value.clone()


@dataclass(frozen=True)
class _EnvFactory:
    """A picklable ``lambda: corral.make(id, **kwargs)`` for worker processes."""

    spec: Any
    kwargs: dict[str, Any]

    def __call__(self) -> Any:
        return adapt(self.spec.make(**self.kwargs))
