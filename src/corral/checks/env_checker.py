"""The conformance checker of dict envs: plays an env and lists every way it breaks the env
contract.

:func:`check_env` plays a few seeded episodes with a random legal policy (the
first one to its end, within a cap) and checks every reset and step against
the rules of the contract (:mod:`corral.checks.env_rules`). It then replays the same seed
to check that the env is deterministic, and replays it once more after
sending bad actions to check that they are rejected with a ``ValueError`` and
change nothing. A batched env (:class:`corral.BatchedEnv`) is handed to
:func:`corral.checks.batched_checker.check_batched_env`.
"""

from __future__ import annotations

import copy
import hashlib
import math
import numbers
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from gymnasium import spaces

from corral.arrays.tree import map_tree
from corral.checks.batched_checker import check_batched_env
from corral.checks.engine import (
    STEP_CAP,
    CheckReport,
    EnvFailed,
    Findings,
    attempt,
    concluded,
    mask_of,
    reset_env,
    spaces_of,
    step_env,
)
from corral.checks.env_rules import (
    FRAME_RULES,
    STEP_RULES,
    Frame,
    max_episode_steps_is_a_step_count,
    possible_agents_are_unique_ids,
    spaces_are_fixed_gymnasium_spaces,
    spaces_are_methods,
)

_NOT_AN_AGENT = "__not_an_agent__"


def check_env(
    env: Any,
    *,
    seed: int = 0,
    max_steps: int = 300,
    episodes: int = 2,
    step_cap: int = STEP_CAP,
    env_kwargs: Mapping[str, Any] | None = None,
    raise_on_error: bool = True,
    dict_env: Callable[[], Any] | None = None,
) -> CheckReport:
    """Check ``env`` (an env, or an id for :func:`corral.make`) against the env contract.

    A :class:`corral.BatchedEnv`, or an id registered only natively batched, is checked by
    :func:`corral.checks.batched_checker.check_batched_env` (with ``dict_env``, the dict env it
    implements, if given).

    Plays up to ``episodes`` episodes and ``max_steps`` steps in all, starting
    with ``reset(seed=seed)``, and reports every violation found (at most
    :data:`MAX_REPEATS` messages per rule). The first episode, though, plays
    on past ``max_steps`` until it ends, up to ``step_cap`` steps, so that the
    rules about how episodes end are checked; if it does not end, the report
    is not :attr:`~CheckReport.complete` and a :class:`CheckIncompleteWarning`
    says so. ``env_kwargs`` go to :func:`corral.make` when ``env`` is an id;
    an env built from an id is closed at the end. Raises
    :class:`~corral.errors.EnvContractError` listing the violations if there
    are any and ``raise_on_error`` is true.
    """
    from corral.adapters import adapt
    from corral.batched_env import BatchedEnv
    from corral.registry import make, spec

    if isinstance(env, BatchedEnv) or (isinstance(env, str) and spec(env).entry_point is None):
        return check_batched_env(
            env,
            seed=seed,
            max_steps=max_steps,
            episodes=episodes,
            step_cap=step_cap,
            dict_env=dict_env,
            env_kwargs=env_kwargs,
            raise_on_error=raise_on_error,
        )
    built = isinstance(env, str)
    name = env if built else type(env).__name__
    env = make(env, **(env_kwargs or {})) if built else adapt(env)
    try:
        report = _Checker(env, seed).run(name, max_steps, episodes, step_cap)
    finally:
        if built:
            env.close()
    return concluded(report, name, raise_on_error)


class RandomPolicy:
    """Seeded, uniformly random actions for the agents in a dict env's ``obs``, legal under
    their masks: a dict of one action per agent.

    Samples from copies of the env's action spaces, so the env's own spaces
    and their random generators are left untouched. (The runner's ``fixed:random``,
    :class:`corral.training.runner.RandomGroupPolicy`, acts for a vector env's group.)
    """

    def __init__(self, env: Any, seed: int | None = None) -> None:
        self._env = env
        self._seed = seed
        self._spaces: dict[Any, spaces.Space] = {}

    def sample(self, agent: Any, mask: Any = None) -> Any:
        """A random action of ``agent``; a valid Discrete ``mask`` restricts it."""
        space = self._spaces.get(agent)
        if space is None:
            space = copy.deepcopy(self._env.action_space(agent))
            space.seed(None if self._seed is None else self._seed + len(self._spaces))
            self._spaces[agent] = space
        if isinstance(space, spaces.Discrete) and _usable_mask(mask, int(space.n)):
            return space.sample(mask=np.asarray(mask, dtype=np.int8))
        return space.sample()

    def __call__(self, obs: Mapping[Any, Any], infos: Mapping[Any, Any]) -> dict[Any, Any]:
        """Actions for exactly the agents in ``obs``."""
        return {agent: self.sample(agent, mask_of(infos, agent)) for agent in obs}


def _usable_mask(mask: Any, n: int) -> bool:
    return isinstance(mask, np.ndarray) and mask.shape == (n,) and bool(np.any(mask))


def _where(episode: int, step: int | None) -> str:
    call = "reset" if step is None else f"step {step}"
    return call if episode == 0 else f"episode {episode}, {call}"


# --------------------------------------------------------------------------- fingerprints


@dataclass(frozen=True)
class _Digest:
    """An array, by shape, dtype and a hash of its bytes."""

    shape: tuple[int, ...]
    dtype: str
    digest: str


def _fingerprint(value: Any) -> Any:
    """``value`` with arrays replaced by digests: equal for equal values, small to keep."""
    return map_tree(_leaf_fingerprint, value, mappings=True, lists=True)


def _leaf_fingerprint(value: Any) -> Any:
    if isinstance(value, np.ndarray):
        data = value.tobytes() if value.dtype != object else repr(value.tolist()).encode()
        return _Digest(value.shape, value.dtype.str, hashlib.blake2b(data).hexdigest())
    if isinstance(value, (numbers.Number, str, bytes, type(None), np.generic)):
        return value
    return repr(value)


def _difference(a: Any, b: Any, path: str) -> str | None:
    """The path of the first place where two fingerprints differ, or ``None``."""
    if isinstance(a, Mapping) and isinstance(b, Mapping):
        if list(a) != list(b):
            return f"{path} keys ({list(a)} vs {list(b)})"
        for key in a:
            found = _difference(a[key], b[key], f"{path}[{key!r}]")
            if found:
                return found
        return None
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)) and len(a) == len(b):
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            found = _difference(x, y, f"{path}[{i}]")
            if found:
                return found
        return None
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return None
    try:
        same = bool(a == b)
    except (TypeError, ValueError):
        same = False
    return None if same else path


@dataclass
class _Record:
    where: str
    data: dict[str, Any]


# --------------------------------------------------------------------------- rollouts


@dataclass
class _Rollout:
    records: list[_Record] = field(default_factory=list)
    steps: int = 0
    episodes: int = 0


class _Checker(Findings):
    def __init__(self, env: Any, seed: int) -> None:
        super().__init__()
        self.env = env
        self.seed = seed

    def run(self, name: str, max_steps: int, episodes: int, step_cap: int) -> CheckReport:
        self.apply((possible_agents_are_unique_ids, spaces_are_methods), self.env)
        if self._messages:
            return CheckReport(name, self.seed, violations=self.violations())
        try:
            spaces_before = attempt("before reset", "getting the spaces", spaces_of, self.env)
            self.apply((spaces_are_fixed_gymnasium_spaces,), self.env)
            self.apply((max_episode_steps_is_a_step_count,), self.env)
        except EnvFailed as err:
            self.add("env_does_not_raise", str(err))
            return CheckReport(name, self.seed, violations=self.violations())
        if not all(isinstance(space, spaces.Space) for space in spaces_before.values()):
            return CheckReport(name, self.seed, violations=self.violations())

        main = self._play(max_steps, episodes, step_cap, check=True)
        try:
            self.check_spaces_unchanged(self.env, spaces_before)
        except EnvFailed as err:
            self.add("env_does_not_raise", str(err))
        replay = self._play(max_steps, episodes, step_cap)
        differs = self._compare(
            main,
            replay,
            "{where}: {what} differs between two runs that both call reset(seed={seed}) and take "
            "the same actions; the env must be deterministic given the seed",
        )
        if main.records:  # bad actions must raise even where the env is not deterministic
            probed = self._play(min(main.steps, 20), 1, 0, probe=True)
        if main.records and not differs:  # what they changed shows only in a deterministic env
            self._compare(
                main,
                probed,
                "{where}: {what} differs from a run without the bad actions that env.step "
                "rejected at step 0; env.step must check actions before changing any state",
                prefix_only=True,
            )
        return CheckReport(name, self.seed, main.steps, main.episodes, self.violations())

    def _compare(self, a: _Rollout, b: _Rollout, message: str, prefix_only: bool = False) -> bool:
        """Report the first record where ``b`` differs from ``a``; whether there was one.

        ``message`` is formatted with ``where``, ``what`` (what differs) and ``seed``.
        """
        for ra, rb in zip(a.records, b.records, strict=False):
            what = _record_difference(ra, rb)
            if what:
                self.add(
                    "same_seed_same_trajectory",
                    message.format(where=ra.where, what=what, seed=self.seed),
                )
                return True
        if not prefix_only and len(a.records) != len(b.records):
            self.add(
                "same_seed_same_trajectory",
                message.format(
                    where=f"after {len(a.records)} resets and steps",
                    what=f"the length of the run ({len(b.records)} resets and steps)",
                    seed=self.seed,
                ),
            )
            return True
        return False

    def _play(
        self,
        max_steps: int,
        episodes: int,
        step_cap: int,
        *,
        check: bool = False,
        probe: bool = False,
    ) -> _Rollout:
        """Play from ``reset(seed)``, checking the rules if ``check``, probing if ``probe``.

        The first episode plays on past ``max_steps``, up to ``step_cap`` steps, until it ends.
        """
        rollout = _Rollout()
        policy = RandomPolicy(self.env, self.seed)
        try:
            for episode in range(episodes):
                if episode and rollout.steps >= max_steps:
                    break
                limit = max(max_steps, step_cap) if episode == 0 else max_steps
                self._play_episode(rollout, policy, episode, limit, check, probe)
        except EnvFailed as err:
            rollout.records.append(_Record(err.where, {"error": err.message}))
            if check:
                self.add("env_does_not_raise", str(err))
        return rollout

    def _play_episode(
        self,
        rollout: _Rollout,
        policy: RandomPolicy,
        episode: int,
        max_steps: int,
        check: bool,
        probe: bool,
    ) -> None:
        seed = self.seed + episode
        where = _where(episode, None)
        obs, infos = reset_env(self.env, seed, where)
        frame = Frame(where, obs, infos, list(self.env.agents))
        rollout.records.append(_Record(where, {"obs": _fingerprint(obs)}))
        if check:
            self.apply(FRAME_RULES, self.env, frame)
        if probe:
            obs, infos = self._probe_bad_actions(obs, infos, seed)
        gone: dict[Any, str] = {}
        step = 0
        while self.env.agents and obs and rollout.steps < max_steps:
            where = _where(episode, step)
            alive = list(self.env.agents)
            actions = attempt(where, "sampling actions from env.action_space", policy, obs, infos)
            obs, rewards, terms, truncs, infos = step_env(self.env, actions, where)
            rollout.steps += 1
            frame = Frame(
                where,
                obs,
                infos,
                list(self.env.agents),
                dict(gone),
                alive,
                rewards,
                terms,
                truncs,
                step + 1,
            )
            data = {"obs": obs, "rewards": rewards, "terminations": terms, "truncations": truncs}
            rollout.records.append(_Record(where, _fingerprint(data)))
            if check:
                self.apply(FRAME_RULES + STEP_RULES, self.env, frame)
            for agent in list(gone):
                if agent in frame.agents or agent in obs:
                    del gone[agent]  # revived: reported once, then treated as alive
            gone.update((agent, where) for agent in frame.ended)
            step += 1
        if not self.env.agents:
            rollout.episodes += 1

    def _probe_bad_actions(self, obs: dict, infos: dict, seed: int) -> tuple[dict, dict]:
        """Send bad actions at step 0; each must raise a ValueError and change nothing."""
        sampler = RandomPolicy(self.env, self.seed + 1)
        good = attempt("step 0", "sampling actions from env.action_space", sampler, obs, infos)
        if not good:
            return obs, infos
        idle = next((a for a in self.env.possible_agents if a not in obs), None)
        extra = idle if idle is not None else _NOT_AN_AGENT
        dropped = next(iter(good))
        extra_action = attempt(
            "step 0", "sampling actions", sampler.sample, extra if idle is not None else dropped
        )
        probes = {
            f"an action for {extra!r} (not an acting agent)": {**good, extra: extra_action},
            f"no action for {dropped!r} (an acting agent)": {
                a: v for a, v in good.items() if a != dropped
            },
        }
        outside = _outside(self.env.action_space(dropped))
        if outside is not None:
            probes[f"an action outside the space of {dropped!r} ({outside!r})"] = {
                **good,
                dropped: outside,
            }
        forbidden = _forbidden(self.env.action_space(dropped), infos.get(dropped, {}))
        if forbidden is not None:
            probes[f"an action that the mask of {dropped!r} forbids ({forbidden})"] = {
                **good,
                dropped: forbidden,
            }
        for what, actions in probes.items():
            try:
                self.env.step(actions)
            except ValueError:
                continue
            except Exception as err:  # the wrong exception type is the finding
                self.add(
                    "rejects_bad_actions",
                    f"step 0: given {what}, env.step raised {type(err).__name__} instead of a "
                    "ValueError (use corral.env.validate_actions)",
                )
            else:
                self.add(
                    "rejects_bad_actions",
                    f"step 0: env.step accepted {what} instead of raising a ValueError; call "
                    "corral.env.validate_actions before changing any state",
                )
            obs, infos = reset_env(self.env, seed, "reset")
        return obs, infos


def _outside(space: spaces.Space) -> Any:
    """An action that ``space`` does not hold (``None`` for the spaces not probed)."""
    if isinstance(space, spaces.Discrete):
        return int(space.start + space.n)
    if isinstance(space, spaces.MultiDiscrete):
        return np.asarray(space.start + space.nvec)
    if isinstance(space, spaces.Box):
        return np.zeros((*space.shape, 2), dtype=space.dtype)  # a shape it does not have
    return None


def _forbidden(space: spaces.Space, info: Mapping[str, Any]) -> int | None:
    """A discrete action that the agent's mask in ``info`` forbids, if any."""
    mask = info.get("action_mask") if isinstance(info, Mapping) else None
    if not isinstance(space, spaces.Discrete) or mask is None:
        return None
    zeros = np.flatnonzero(np.asarray(mask) == 0)
    return int(space.start + zeros[0]) if len(zeros) else None


def _record_difference(a: _Record, b: _Record) -> str | None:
    """What differs between two records of the same point of two runs, or ``None``."""
    if a.where != b.where:
        return f"where the run is ({b.where} in the other run)"
    if "error" in a.data or "error" in b.data:
        if a.data == b.data:
            return None
        first = a.data.get("error", "nothing")
        second = b.data.get("error", "nothing")
        return f"what the env raised ({first!r} vs {second!r})"
    for key in a.data:
        path = _difference(a.data[key], b.data.get(key), key)
        if path:
            return path
    return None
