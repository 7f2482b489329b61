"""Fault injection on every backend: envs that raise, hang, die or return bad values at
seeded random steps, as dict envs and as a natively batched env.

A faulty env's fault costs only its own episode (cut, truncated, stats kept) and,
where it kills or stalls a worker, the episodes of that worker's other envs (for a
natively batched env that raises, which cannot say which copy failed: those of its
shard). Every other env's transitions must equal those of an undisturbed reference
run: the same seeds and actions, chosen as a function of (env index, step).
"""

from __future__ import annotations

import contextlib
import importlib.util
import multiprocessing as mp
import os
import sys
import time
import warnings
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import cloudpickle
import numpy as np
import pytest
from gymnasium import spaces
from oracles.decisions import DecisionCounter

import corral
from corral.batched_env import BatchedStep, CopyGenerators, copy_seeds, selected
from corral.errors import EnvError, WorkerRestartWarning, WorkerStartError, WorkerTimeoutError
from corral.vector import VectorEnv
from corral.vector.shards import split_envs
from corral.vector.sources import NativeSource

# Workers started by forkserver or Ray cannot import this module: send its classes by value.
cloudpickle.register_pickle_by_value(sys.modules[__name__])

SEED = 11
HANG_S = 60.0  # a hung env sleeps far past any timeout below; its worker is killed
NUM_ENVS = 5
AGENTS = ["a_0", "a_1"]


class Walk(corral.MultiAgentEnv):
    """Two agents walking; an episode lasts a seeded random number of steps.

    Every agent earns at least 1 in every step it is alive, so a zero reward row
    says that the env did not step. Episodes longer than ``max_episode_steps``
    are truncated, the others terminate.
    """

    simultaneous = True
    max_episode_steps = 9

    def __init__(self) -> None:
        self.possible_agents = list(AGENTS)
        self.agents: list[str] = []
        self.rng = np.random.default_rng()
        self.t, self.length, self.pos = 0, 0, np.zeros(2)

    def observation_space(self, agent: str) -> spaces.Box:
        return spaces.Box(-1e3, 1e3, (3,), np.float32)

    def action_space(self, agent: str) -> spaces.Discrete:
        return spaces.Discrete(3)

    def reset(self, seed=None, options=None):
        if seed is not None:
            self.rng = np.random.default_rng(seed)
        self.agents, self.t = list(AGENTS), 0
        self.length = int(self.rng.integers(3, 13))
        self.pos = self.rng.normal(size=2)
        return {a: self._obs(k) for k, a in enumerate(AGENTS)}, {a: {} for a in AGENTS}

    def step(self, actions):
        self.t += 1
        moves = np.array([actions[a] for a in AGENTS], np.float64) - 1.0
        self.pos = self.pos + moves + 0.1 * self.rng.normal(size=2)
        rewards = {a: 1.0 + 0.5 * actions[a] + 0.01 * self.t for a in AGENTS}
        terminated = self.t >= self.length
        truncated = not terminated and self.t >= self.max_episode_steps
        done = terminated or truncated
        obs = {a: self._obs(k) for k, a in enumerate(AGENTS)}
        infos = {a: {"final_obs": obs[a]} if done else {} for a in AGENTS}
        self.agents = [] if done else list(AGENTS)
        return (
            {} if done else obs,
            rewards,
            dict.fromkeys(AGENTS, terminated),
            dict.fromkeys(AGENTS, truncated),
            infos,
        )

    def _obs(self, k: int) -> np.ndarray:
        return np.array([self.pos[k], self.t, self.length], np.float32)


class Faulty(Walk):
    """A :class:`Walk` that fails once, at a seeded random step of its life.

    Each instance built for env ``index`` is its next generation (counted in a file
    under ``plan_dir``, which outlives worker processes): generation ``g`` draws its
    fault step from ``(SEED, index, g)`` and its kind as ``kinds[g % len(kinds)]``:
    ``"raise"``, ``"hang"`` (sleep past the timeout), ``"die"`` (end the process),
    ``"bad"`` (a wrong-shaped observation) or ``"nan"`` (a NaN reward; a fault with
    ``check_finite``).
    With ``at``, only the first generation fails, at step ``at``. The resets of the
    generations in ``reset_fails`` raise; the generations in ``build_hangs`` hang while
    they are built.
    """

    def __init__(
        self,
        index: int,
        plan_dir: Path,
        kinds: tuple[str, ...] = (),
        at: int | None = None,
        reset_fails: range = range(0),
        build_hangs: range = range(0),
    ) -> None:
        super().__init__()
        fd = os.open(plan_dir / f"env{index}", os.O_WRONLY | os.O_APPEND | os.O_CREAT)
        try:
            self.generation = os.write(fd, b"+") and os.fstat(fd).st_size - 1
        finally:
            os.close(fd)
        if self.generation in build_hangs:
            time.sleep(HANG_S)
        rng = np.random.default_rng([SEED, index, self.generation])
        self.fault_at = int(rng.integers(4, 13)) if at is None else at
        self.kind = kinds[self.generation % len(kinds)] if kinds else None
        if at is not None and self.generation > 0:
            self.kind = None
        self.reset_fails = self.generation in reset_fails
        self.calls = 0  # steps of this instance

    def reset(self, seed=None, options=None):
        if self.reset_fails:
            self.fail_in_reset()
        return super().reset(seed, options)

    def step(self, actions):
        self.calls += 1
        if self.kind is not None and self.calls == self.fault_at:
            if self.kind == "raise":
                self.fail_on_purpose()
            elif self.kind == "hang":
                time.sleep(HANG_S)
            elif self.kind == "die":
                os._exit(3)
            elif self.kind in ("bad", "nan"):
                return spoiled(self.kind, *super().step(actions))
        return super().step(actions)

    def fail_on_purpose(self) -> None:
        raise ValueError(f"injected fault at step {self.calls}")

    def fail_in_reset(self) -> None:
        raise OSError("injected reset fault")


def spoiled(kind: str, obs, rewards, terminations, truncations, infos) -> tuple:
    """A step's dicts with one bad value of agent ``a_1``: a wrong-shaped observation
    (``final_obs`` where its episode ended) for ``"bad"``, a NaN reward for ``"nan"``."""
    if kind == "nan":
        rewards["a_1"] = float("nan")
    elif "a_1" in obs:
        obs["a_1"] = np.zeros(5, np.float32)
    else:
        infos["a_1"] = {"final_obs": np.zeros(5, np.float32)}
    return obs, rewards, terminations, truncations, infos


def faulty_fns(plan_dir: Path, faults: dict[int, dict[str, Any]]) -> list:
    """Constructors of ``NUM_ENVS`` Faulty envs; ``faults`` maps an env index to its options."""
    return [partial(Faulty, i, plan_dir, **faults.get(i, {})) for i in range(NUM_ENVS)]


class NativeWalk(corral.BatchedEnv):
    """``num_envs`` copies of :class:`Walk` as one natively batched env: copy ``i`` draws
    what a Walk env seeded alike draws, so its rows equal those of the dict envs."""

    max_episode_steps = Walk.max_episode_steps

    def __init__(self, num_envs: int) -> None:
        self.num_envs = num_envs
        self.possible_agents = list(AGENTS)
        self.generators = CopyGenerators(num_envs)
        self.rngs: list[Any] = [None] * num_envs
        self.t = np.zeros(num_envs, np.int64)
        self.length = np.zeros(num_envs, np.int64)
        self.pos = np.zeros((num_envs, 2))

    def observation_space(self, agent: str) -> spaces.Box:
        return spaces.Box(-1e3, 1e3, (3,), np.float32)

    def action_space(self, agent: str) -> spaces.Discrete:
        return spaces.Discrete(3)

    def reset(self, seed=None, where=None, options=None) -> BatchedStep:
        rows = selected(where, self.num_envs)
        generators = self.generators.at_reset(copy_seeds(seed, self.num_envs), rows)
        for i, rng in zip(rows, generators, strict=True):
            self.rngs[i], self.t[i] = rng, 0
            self.length[i] = rng.integers(3, 13)
            self.pos[i] = rng.normal(size=2)
        return self._result(np.ones((self.num_envs, 2), bool))

    def step(self, actions) -> BatchedStep:
        action = np.asarray(actions["a"])
        self.t += 1
        for i, rng in enumerate(self.rngs):
            self.pos[i] = self.pos[i] + (action[i] - 1.0) + 0.1 * rng.normal(size=2)
        terminated = self.t >= self.length
        truncated = ~terminated & (self.t >= self.max_episode_steps)
        ended = np.repeat((terminated | truncated)[:, None], 2, 1)
        return self._result(
            ~ended,
            reward={"a": 1.0 + 0.5 * action + 0.01 * self.t[:, None]},
            terminated={"a": np.repeat(terminated[:, None], 2, 1)},
            truncated={"a": np.repeat(truncated[:, None], 2, 1)},
        )

    def _result(self, alive: np.ndarray, **step: Any) -> BatchedStep:
        obs = np.stack(
            [self.pos, np.repeat(self.t[:, None], 2, 1), np.repeat(self.length[:, None], 2, 1)],
            -1,
        ).astype(np.float32)
        return BatchedStep({"a": obs}, {"a": alive}, {"a": alive.copy()}, **step)


class FaultyNativeWalk(NativeWalk):
    """A :class:`NativeWalk` of copies ``offset`` on whose copies in ``faults`` (global
    index -> kinds) fail as :class:`Faulty` envs do, again and again: generation ``g``
    of copy ``i`` (its faults so far, counted in a file under ``plan_dir``) fails after
    the step drawn from ``(SEED, i, g)``, with ``kinds[g % len(kinds)]``: ``"raise"``
    (the whole env raises), ``"hang"``, ``"die"`` or ``"nan"`` (a NaN observation)."""

    def __init__(self, num_envs: int, offset: int, plan_dir: Path, faults: dict) -> None:
        super().__init__(num_envs)
        self.plan_dir = plan_dir
        self.kinds = {i - offset: k for i, k in faults.items() if i - offset in range(num_envs)}
        self.offset = offset
        self.plans = {c: self._plan(c) for c in self.kinds}

    def _plan(self, copy: int) -> list:
        """``[steps until the fault, its kind]`` of the copy's next generation."""
        generation = self._faults_file(copy).stat().st_size
        rng = np.random.default_rng([SEED, self.offset + copy, generation])
        kinds = self.kinds[copy]
        return [int(rng.integers(4, 13)), kinds[generation % len(kinds)]]

    def _faults_file(self, copy: int) -> Path:
        path = self.plan_dir / f"env{self.offset + copy}"
        path.touch()
        return path

    def step(self, actions) -> BatchedStep:
        now = []
        for copy, plan in self.plans.items():
            plan[0] -= 1
            if plan[0] == 0:
                now.append((copy, plan[1]))
                with open(self._faults_file(copy), "ab") as file:
                    file.write(b"+")
                self.plans[copy] = self._plan(copy)
        kinds = {kind for _, kind in now}
        if "raise" in kinds:
            raise ValueError("injected fault in a natively batched step")
        if "hang" in kinds:
            time.sleep(HANG_S)
        if "die" in kinds:
            os._exit(3)
        out = super().step(actions)
        for copy, _ in now:
            out.obs["a"][copy, 1, 0] = np.nan
        return out


@dataclass(frozen=True)
class ShardedNative(NativeSource):
    """A native source whose shards know their first copy."""

    def part(self, envs: range) -> ShardedNative:
        return ShardedNative(self.make, len(envs), self.state)

    def build(self, offset: int = 0) -> Any:
        return self.make(self.num_envs, offset)


def actions_at(t: int, num_envs: int = NUM_ENVS) -> dict[str, np.ndarray]:
    """The actions of step ``t``: a fixed function of (env, step, agent)."""
    e = np.arange(num_envs)[:, None]
    j = np.arange(len(AGENTS))[None, :]
    return {"a": (3 * e + 5 * t + j) % 3}


def reference_run(steps: int) -> list:
    """The batches of an undisturbed run: plain Walk envs, in process."""
    with VectorEnv([Walk] * NUM_ENVS, "sync", seed=SEED) as venv:
        return [venv.reset(), *(venv.step(actions_at(t)) for t in range(steps))]


def faulty_run(venv: VectorEnv, steps: int) -> list:
    """The batches of ``venv`` (``on_env_error="restart"``) over ``steps`` steps."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", WorkerRestartWarning)  # EnvRestartWarning too
        return [venv.reset(), *(venv.step(actions_at(t)) for t in range(steps))]


# -- backends -------------------------------------------------------------------------------------

HAS_RAY = importlib.util.find_spec("ray") is not None
needs_ray = pytest.mark.skipif(not HAS_RAY, reason="ray is not installed")


def backend_options(backend: str, ray_session, envs_per_worker: int = 1) -> dict:
    if backend == "sync":
        return {}
    if backend == "ray":
        ray_session()
        import ray

        ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
        return {"envs_per_worker": envs_per_worker, "num_cpus_per_worker": 0.25}
    return {"envs_per_worker": envs_per_worker}


BACKENDS = ["sync", "subproc", pytest.param("ray", marks=needs_ray)]
WORKER_BACKENDS = ["subproc", pytest.param("ray", marks=needs_ray)]


# -- what every run must satisfy ------------------------------------------------------------------


def assert_rows_equal(got, want, e: int, where: str) -> None:
    """Env ``e``'s transition in two batches: the same obs, rewards, ends and stats."""
    for name in ("obs", "reward", "terminated", "truncated", "alive", "acting"):
        np.testing.assert_array_equal(
            getattr(got, name)["a"][e], getattr(want, name)["a"][e], err_msg=f"{where} {name}"
        )
    assert got.done[e] == want.done[e], f"{where} done"
    if want.done[e]:
        np.testing.assert_array_equal(got.final_obs["a"][e], want.final_obs["a"][e], where)
        np.testing.assert_array_equal(
            got.episode_return["a"][e], want.episode_return["a"][e], where
        )
        assert got.episode_length[e] == want.episode_length[e], f"{where} episode_length"
    assert got.worker_restarts[e] == 0, f"{where}: a healthy env was restarted"
    assert not got.episode_cut[e], f"{where}: a healthy env's episode was cut"


def check_episodes(batches: list, e: int) -> tuple[int, int]:
    """Every episode of env ``e`` ends with stats equal to its rewards and steps in the
    batches; an episode cut by a fault ends truncated in its last observation. Returns
    the numbers of cut and of complete episodes."""
    ret, steps, cut, complete = np.zeros(len(AGENTS)), 0, 0, 0
    for t in range(1, len(batches)):
        b, prev = batches[t], batches[t - 1]
        reward = b.reward["a"][e].astype(np.float64)
        stepped = bool(reward.any())  # every alive agent earns at least 1 in a step
        ret, steps = ret + reward, steps + stepped
        restarted = b.worker_restarts[e] > prev.worker_restarts[e]
        where = f"env {e}, step {t}"
        if not b.done[e]:
            assert not restarted, f"{where}: restarted without ending its episode"
            continue
        assert b.episode_cut[e] == restarted, f"{where}: episode_cut says otherwise"
        np.testing.assert_allclose(b.episode_return["a"][e], ret, rtol=1e-6, err_msg=where)
        assert b.episode_length[e] == steps, where
        if restarted:
            cut += 1
            if not stepped:  # cut before it stepped: it ends in the last observation
                assert b.truncated["a"][e].all() and not b.terminated["a"][e].any(), where
                np.testing.assert_array_equal(b.final_obs["a"][e], prev.obs["a"][e], where)
            assert b.alive["a"][e].all() and b.obs["a"][e][:, 1].tolist() == [0, 0], where
        else:
            complete += 1
        ret, steps = np.zeros(len(AGENTS)), 0
    return cut, complete


def check_decisions(batches: list) -> None:
    """Every batch's decision indices are the collector's count of the batches before it
    (a restart starts it again), and where ``done`` ``episode_decisions`` that count of the
    episode that ended, less the decisions of a step that a fault stopped (which its
    ``episode_length`` leaves out too)."""
    oracle = DecisionCounter()
    for t, batch in enumerate(batches):
        if t:
            stepped = batch.reward["a"].astype(bool).any(1)  # see check_episodes
            lost = np.where(stepped[:, None], 0, batches[t - 1].acting["a"])
            made, done = oracle.made["a"] - lost, batch.done
            np.testing.assert_array_equal(
                batch.episode_decisions["a"][done], made[done], f"step {t}: episode_decisions"
            )
        want = oracle.step(batch)["a"]
        np.testing.assert_array_equal(batch.decision["a"], want, f"step {t}: decision")


# -- the suite ------------------------------------------------------------------------------------

# backend, source, envs per worker, kinds of the faults of env 1 and of env 4
SUITE = [
    pytest.param("sync", "dict", 1, ("raise", "bad", "nan"), ("raise",), id="sync"),
    pytest.param("subproc", "dict", 1, ("raise", "die", "hang"), ("bad",), id="subproc-1"),
    pytest.param("subproc", "dict", 3, ("raise", "nan", "bad"), ("die", "hang"), id="subproc-3"),
    pytest.param(
        "ray", "dict", 3, ("raise", "bad"), ("hang", "die", "raise"), id="ray-3", marks=needs_ray
    ),
    pytest.param("sync", "native", NUM_ENVS, ("nan",), ("nan",), id="sync-native"),
    pytest.param("subproc", "native", 3, ("nan",), ("raise", "die", "hang"), id="subproc-native"),
    pytest.param(
        "ray", "native", 2, ("hang", "nan", "die"), ("raise",), id="ray-native", marks=needs_ray
    ),
]
# The faults that cost every env of the worker (and of a native shard that raises, the shard).
SHARD_FAULTS = {"dict": {"die", "hang"}, "native": {"die", "hang", "raise"}}


@pytest.mark.parametrize(("backend", "source", "per_worker", "kinds_1", "kinds_4"), SUITE)
def test_healthy_envs_match_an_undisturbed_run(
    backend: str,
    source: str,
    per_worker: int,
    kinds_1: tuple,
    kinds_4: tuple,
    tmp_path: Path,
    ray_session,
) -> None:
    steps = 30 if backend == "ray" else 40
    faults = {1: kinds_1, 4: kinds_4}
    unhealthy = set(faults)
    for shard in split_envs(NUM_ENVS, envs_per_worker=per_worker):
        if any(SHARD_FAULTS[source] & set(faults.get(i, ())) for i in shard):
            unhealthy |= set(shard)
    healthy = [i for i in range(NUM_ENVS) if i not in unhealthy]
    options = backend_options(backend, ray_session, per_worker)
    if backend != "sync":
        options["timeout"] = 3.0 if backend == "ray" else 2.0
    if source == "dict":
        envs: Any = faulty_fns(tmp_path, {i: {"kinds": k} for i, k in faults.items()})
    else:
        make = partial(FaultyNativeWalk, plan_dir=tmp_path, faults=faults)
        envs = ShardedNative(make, NUM_ENVS)
    venv = VectorEnv(envs, backend, seed=SEED, on_env_error="restart", check_finite=True, **options)
    with venv:
        got = faulty_run(venv, steps)
    want = reference_run(steps)
    assert healthy and len(healthy) >= 2
    for t, (g, w) in enumerate(zip(got, want, strict=True)):
        for e in healthy:
            assert_rows_equal(g, w, e, f"env {e}, step {t}")
    episodes = [check_episodes(got, e) for e in range(NUM_ENVS)]
    check_decisions(got)
    assert episodes[1][0] >= 2 and episodes[4][0] >= 2, episodes  # cut episodes of each
    assert all(episodes[e][0] == 0 and episodes[e][1] >= 2 for e in healthy), episodes
    for e, kinds in faults.items():
        count = len((tmp_path / f"env{e}").read_bytes())
        if source == "dict":  # the file counts the env's generations: its faults and one
            count -= 1
        assert got[-1].worker_restarts[e] == count  # one restart per fault of the env
        assert count >= len(kinds)  # every kind of fault happened


def test_a_native_walk_is_the_walk_of_dict_envs() -> None:
    """What the suite's native runs are compared with: the dict envs' reference run."""
    want = reference_run(30)
    with VectorEnv(NativeSource(NativeWalk, NUM_ENVS), "sync", seed=SEED) as venv:
        got = [venv.reset(), *(venv.step(actions_at(t)) for t in range(30))]
    for t, (g, w) in enumerate(zip(got, want, strict=True)):
        for e in range(NUM_ENVS):
            assert_rows_equal(g, w, e, f"env {e}, step {t}")


# -- one step, one fault --------------------------------------------------------------------------


@pytest.mark.parametrize("backend", BACKENDS)
def test_one_env_raising_leaves_no_env_behind(backend: str, tmp_path: Path, ray_session) -> None:
    """The issue's case: env 2 raises in the third step; every other env still takes it."""
    fns = faulty_fns(tmp_path, {2: {"kinds": ("raise",), "at": 3}})
    with VectorEnv(fns, backend, seed=SEED, **backend_options(backend, ray_session, 2)) as venv:
        venv.reset()
        venv.step(actions_at(0))
        venv.step(actions_at(1))
        with pytest.raises(EnvError) as info:
            venv.step(actions_at(2))
        assert venv.get_attr("calls") == [3, 3, 0, 3, 3]  # env 2 was rebuilt
        assert info.value.batch.worker_restarts.tolist() == [0, 0, 1, 0, 0]
        venv.step(actions_at(3))
        assert venv.get_attr("calls") == [4, 4, 1, 4, 4]


@pytest.mark.parametrize("backend", BACKENDS)
def test_an_episode_ending_in_the_faulty_step_is_reported(
    backend: str, tmp_path: Path, ray_session
) -> None:
    want = reference_run(12)
    t = next(t for t in range(1, 13) if want[t].done[0] and not want[t].done[3])
    fns = faulty_fns(tmp_path, {3: {"kinds": ("raise",), "at": t}})
    with VectorEnv(fns, backend, seed=SEED, **backend_options(backend, ray_session)) as venv:
        venv.reset()
        for s in range(t - 1):
            venv.step(actions_at(s))
        with pytest.raises(EnvError) as info:
            venv.step(actions_at(t - 1))
    batch = info.value.batch
    for e in (0, 1, 2, 4):
        assert_rows_equal(batch, want[t], e, f"env {e}")
    assert batch.done[0] and batch.episode_length[0] == want[t].episode_length[0]
    assert batch.done[3] and batch.truncated["a"][3].all()  # the faulty env's episode is cut
    begun = max(s for s in range(t) if s == 0 or want[s].done[3])
    rewards = sum(want[s].reward["a"][3].astype(np.float64) for s in range(begun + 1, t))
    assert batch.episode_length[3] == t - 1 - begun  # the steps it completed, stats kept
    np.testing.assert_allclose(batch.episode_return["a"][3], rewards, rtol=1e-6)


@pytest.mark.parametrize("backend", BACKENDS)
def test_every_fault_is_reported_with_env_index_and_traceback(
    backend: str, tmp_path: Path, ray_session
) -> None:
    faults = {1: {"kinds": ("raise",), "at": 2}, 3: {"kinds": ("raise",), "at": 2}}
    fns = faulty_fns(tmp_path, faults)
    with VectorEnv(fns, backend, seed=SEED, **backend_options(backend, ray_session, 2)) as venv:
        venv.reset()
        venv.step(actions_at(0))
        with pytest.raises(EnvError) as info:
            venv.step(actions_at(1))
    err = info.value
    assert err.env_index == 1 and err.restarted
    assert [f.env_index for f in err.faults] == [1, 3]
    for fault in err.faults:
        assert str(fault).startswith(f"env {fault.env_index}: step() raised ValueError")
        assert "in fail_on_purpose" in fault.remote_traceback
        assert fault.remote_traceback.strip().endswith("ValueError: injected fault at step 2")


@pytest.mark.parametrize("backend", BACKENDS)
def test_on_env_error_restart_warns_and_returns_the_batch(
    backend: str, tmp_path: Path, ray_session
) -> None:
    fns = faulty_fns(tmp_path, {2: {"kinds": ("raise",), "at": 1}})
    options = backend_options(backend, ray_session)
    with VectorEnv(fns, backend, seed=SEED, on_env_error="restart", **options) as venv:
        venv.reset()
        with pytest.warns(corral.errors.EnvRestartWarning) as record:
            batch = venv.step(actions_at(0))
        batch = venv.step(actions_at(1))
    (warning,) = record
    assert "env 2 failed and was restarted" in str(warning.message)
    assert "ValueError: injected fault at step 1" in str(warning.message)
    assert warning.filename == __file__  # it points at the caller's step()
    assert batch.worker_restarts.tolist() == [0, 0, 1, 0, 0]
    assert batch.obs["a"][:, 0, 1].tolist() == [2, 2, 1, 2, 2]  # env 2: its new episode's step


def test_err_batch_under_raise_is_the_step_and_the_next_step_goes_on(tmp_path: Path) -> None:
    want = reference_run(4)
    fns = faulty_fns(tmp_path, {0: {"kinds": ("raise",), "at": 2}})
    with VectorEnv(fns, "subproc", seed=SEED, envs_per_worker=2) as venv:
        venv.reset()
        venv.step(actions_at(0))
        with pytest.raises(EnvError) as info:
            venv.step(actions_at(1))
        batch = info.value.batch
        for e in range(1, NUM_ENVS):  # env 1 shares env 0's worker and still stepped
            assert_rows_equal(batch, want[2], e, f"env {e}")
        assert batch.done[0] and batch.truncated["a"][0].all()
        np.testing.assert_array_equal(batch.episode_return["a"][0], want[1].reward["a"][0])
        assert batch.episode_length[0] == 1
        batch = venv.step(actions_at(2))
        for e in range(1, NUM_ENVS):
            assert_rows_equal(batch, want[3], e, f"env {e}")


# -- resets ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_failed_reset_restarts_the_env_and_the_others_reset(
    backend: str, tmp_path: Path, ray_session
) -> None:
    want = reference_run(0)[0]
    fns = faulty_fns(tmp_path, {1: {"reset_fails": range(1)}})  # its first generation only
    with VectorEnv(fns, backend, seed=SEED, **backend_options(backend, ray_session)) as venv:
        with pytest.raises(EnvError, match=r"env 1: reset\(\) raised OSError") as info:
            venv.reset()
        batch = info.value.batch
        assert batch.worker_restarts.tolist() == [0, 1, 0, 0, 0]
        # the rebuilt env was reset with env 1's seed: the same first observation
        np.testing.assert_array_equal(batch.obs["a"], want.obs["a"])
        venv.step(actions_at(0))


@pytest.mark.parametrize("backend", ["sync", "subproc"])
def test_an_env_that_cannot_restart_raises_even_with_restart(backend: str, tmp_path: Path) -> None:
    faults = {3: {"kinds": ("raise",), "at": 2, "reset_fails": range(1, 99)}}
    options = {} if backend == "sync" else {"num_workers": 2}
    fns = faulty_fns(tmp_path, faults)
    with VectorEnv(fns, backend, seed=SEED, on_env_error="restart", **options) as venv:
        venv.reset()
        venv.step(actions_at(0))
        with pytest.raises(EnvError, match="restarting the env failed") as info:
            venv.step(actions_at(1))
        assert not info.value.restarted
        batch = info.value.batch
        assert batch.done[3] and batch.truncated["a"][3].all()
        assert not batch.acting["a"][3].any()  # no episode: none of its agents acts
        assert venv.get_attr("calls") == [2, 2, 2, 0, 2]
        with pytest.raises(EnvError, match="env 3: restarting the env failed again"):
            venv.step(actions_at(2))  # tried again at every step
        assert [c for i, c in enumerate(venv.get_attr("calls")) if i != 3] == [3, 3, 3, 3]


class Unresettable(NativeWalk):
    """A :class:`NativeWalk` whose step raises at its second call, and whose resets raise
    while ``resets_fail``."""

    resets_fail = False

    def __init__(self, num_envs: int) -> None:
        super().__init__(num_envs)
        self.calls = 0

    def reset(self, seed=None, where=None, options=None) -> BatchedStep:
        if self.resets_fail:
            raise OSError("injected reset fault")
        return super().reset(seed, where, options)

    def step(self, actions) -> BatchedStep:
        self.calls += 1
        if self.calls == 2:
            self.resets_fail = True
            raise ValueError("injected fault in a natively batched step")
        return super().step(actions)


@pytest.mark.parametrize("on_env_error", ["raise", "restart"])
def test_a_native_env_that_cannot_restart_raises_and_is_tried_again(on_env_error: str) -> None:
    with VectorEnv(
        NativeSource(Unresettable, NUM_ENVS), seed=SEED, on_env_error=on_env_error
    ) as venv:
        venv.reset()
        venv.step(actions_at(0))
        with pytest.raises(
            EnvError, match="reset\\(\\) raised too: reset\\(\\) raised OSError"
        ) as info:
            venv.step(actions_at(1))
        assert not info.value.restarted
        batch = info.value.batch
        assert batch.done.all() and batch.truncated["a"].all()
        assert batch.episode_length.tolist() == [1] * NUM_ENVS  # the cut episodes' stats
        assert not batch.alive["a"].any() and not batch.acting["a"].any()
        with pytest.raises(EnvError, match="env 0: restarting the env failed again"):
            venv.step(actions_at(2))  # tried again at every step
        venv._backend.shard.resets_fail = False
        batch = venv.step(actions_at(3))  # the retry works: every copy begins an episode
        assert batch.alive["a"].all() and not batch.done.any()
        assert batch.obs["a"][:, :, 1].tolist() == [[0, 0]] * NUM_ENVS
        assert batch.worker_restarts.tolist() == [2] * NUM_ENVS
        batch = venv.step(actions_at(4))
        assert batch.obs["a"][:, :, 1].tolist() == [[1, 1]] * NUM_ENVS


# -- a worker that hangs while it starts -------------------------------------------------------

START_S = 4.0  # start_timeout of the tests below: a healthy worker starts well within it


def subproc_workers() -> list:
    """The subproc workers of this process still running."""
    return [p for p in mp.active_children() if p.name.startswith("corral-subproc")]


def test_a_worker_hanging_while_it_builds_its_envs_is_a_start_error(tmp_path: Path) -> None:
    fns = faulty_fns(tmp_path, {1: {"build_hangs": range(1)}})
    start = time.monotonic()
    with pytest.raises(WorkerStartError) as info:
        VectorEnv(fns, "subproc", seed=SEED, envs_per_worker=3, start_timeout=START_S)
    assert time.monotonic() - start < HANG_S / 2
    err = info.value
    assert err.env_indices == [0, 1, 2]
    assert str(err).startswith(f"worker 0 (envs 0-2) did not start within {START_S} s")
    assert not subproc_workers()  # the hung one killed, the other stopped


@pytest.mark.parametrize("on_env_error", ["raise", "restart"])
def test_a_replacement_hanging_while_it_starts_raises_and_is_tried_again(
    on_env_error: str, tmp_path: Path
) -> None:
    """Env 4's worker dies in the second step; its replacement hangs while it builds env 4
    (that env's second generation): the step raises within start_timeout, under either
    setting, and the next step starts it again."""
    want = reference_run(3)
    faults = {4: {"kinds": ("die",), "at": 2, "build_hangs": range(1, 2)}}
    options = {"envs_per_worker": 3, "start_timeout": START_S, "on_env_error": on_env_error}
    with VectorEnv(faulty_fns(tmp_path, faults), "subproc", seed=SEED, **options) as venv:
        venv.reset()
        venv.step(actions_at(0))
        start = time.monotonic()
        with pytest.raises(WorkerTimeoutError) as info:
            venv.step(actions_at(1))
        assert time.monotonic() - start < HANG_S / 2
        err = info.value
        assert err.env_indices == [3, 4] and not err.restarted
        assert str(err).startswith(
            f"worker 1 (envs 3-4) did not answer its start (building its envs) within {START_S} s"
        )
        for e in (0, 1, 2):
            assert_rows_equal(err.batch, want[2], e, f"env {e}")
        assert not err.batch.acting["a"][3:].any()  # no worker runs them
        with pytest.warns(WorkerRestartWarning, match=r"worker 1 \(envs 3-4\) did not start"):
            batch = venv.step(actions_at(2))
        for e in (0, 1, 2):
            assert_rows_equal(batch, want[3], e, f"env {e}")
        assert batch.worker_restarts.tolist() == [0, 0, 0, 1, 1]
        assert batch.done[3:].all() and batch.truncated["a"][3:].all()
        assert batch.episode_length[3:].tolist() == [1, 1]  # cut where they stood
        assert batch.alive["a"][3:].all() and batch.obs["a"][3:, :, 1].tolist() == [[0, 0]] * 2


# -- a worker that dies while its env writes into the batch ------------------------------------

LOST = 777.0  # the reward the dying env writes for the step it does not finish


class WritingWalk(NativeWalk):
    """A :class:`NativeWalk` (on ``array``) that writes every reset and step straight into
    the batch's arrays (``write_into``). The shard holding copy 4 ends its process in its
    ``die_at``-th step, once (the file ``flag``), having written part of that step:
    reward :data:`LOST`, every agent terminated and not alive."""

    keeps_masks = True
    FIELDS = ("obs", "alive", "acting", "reward", "terminated", "truncated")

    def __init__(self, num_envs: int, offset: int, flag: Path, die_at: int, array: str) -> None:
        super().__init__(num_envs)
        self.place = corral.Place(array)
        self.dies = 4 in range(offset, offset + num_envs)
        self.flag, self.die_at, self.calls = flag, die_at, 0

    def write_into(self, arrays) -> bool:
        self.given = {name: arrays[f"{name}/a"] for name in self.FIELDS}
        self.views = {name: np.asarray(a) for name, a in self.given.items()}  # CPU memory
        np.asarray(arrays["action_mask/a"])[...] = True  # every action legal, always
        return True

    def reset(self, seed=None, where=None, options=None) -> BatchedStep:
        return self._written(super().reset(seed, where, options))

    def step(self, actions) -> BatchedStep:
        self.calls += 1
        if self.dies and self.calls == self.die_at and not self.flag.exists():
            self.flag.touch()
            self.views["reward"][...] = LOST
            self.views["terminated"][...] = True
            self.views["alive"][...] = False
            os._exit(3)
        return self._written(super().step(actions))

    def _written(self, out: BatchedStep) -> BatchedStep:
        for name in self.FIELDS:
            value = getattr(out, name)
            if value is not None:
                self.views[name][...] = value["a"]
                setattr(out, name, {"a": self.given[name]})
        return out


@pytest.mark.parametrize("array", ["numpy", "torch"])
def test_a_worker_dying_while_its_env_writes_into_the_batch_loses_the_step(
    array: str, tmp_path: Path
) -> None:
    """What the env wrote of the step it did not finish is not reported: its worker's
    episodes end truncated where they stood before the step, as for any dead worker."""
    if array == "torch":
        pytest.importorskip("torch")
    want = reference_run(2)
    make = partial(WritingWalk, flag=tmp_path / "died", die_at=2, array=array)
    source = ShardedNative(make, NUM_ENVS)
    with VectorEnv(source, "subproc", seed=SEED, envs_per_worker=3, array=array) as venv:
        venv.reset()
        venv.step(actions_at(0))
        with pytest.warns(WorkerRestartWarning, match=r"worker 1 \(envs 3-4\) died during"):
            got = venv.step(actions_at(1))
    got = corral.vector.Batch(**{k: _numpy(v) for k, v in vars(got).items()})
    for e in (0, 1, 2):
        assert_rows_equal(got, want[2], e, f"env {e}")
    assert got.worker_restarts.tolist() == [0, 0, 0, 1, 1]
    assert got.done[3:].all()
    assert not got.reward["a"][3:].any()
    assert not got.terminated["a"][3:].any() and got.truncated["a"][3:].all()
    np.testing.assert_array_equal(got.episode_return["a"][3:], want[1].reward["a"][3:])
    assert got.episode_length[3:].tolist() == [1, 1]
    assert got.alive["a"][3:].all() and got.obs["a"][3:, :, 1].tolist() == [[0, 0], [0, 0]]


def _numpy(value: Any) -> Any:
    """A batch field as numpy (a dict of them per group)."""
    if isinstance(value, dict):
        return {k: _numpy(v) for k, v in value.items()}
    return None if value is None else np.asarray(value)


# -- timeouts -------------------------------------------------------------------------------------


@pytest.mark.parametrize("backend", WORKER_BACKENDS)
def test_a_timeout_keeps_the_healthy_step(backend: str, tmp_path: Path, ray_session) -> None:
    want = reference_run(3)
    fns = faulty_fns(tmp_path, {1: {"kinds": ("hang",), "at": 2}})
    options = {**backend_options(backend, ray_session, 2), "timeout": 2.0}
    with VectorEnv(fns, backend, seed=SEED, **options) as venv:
        venv.reset()
        venv.step(actions_at(0))
        start = time.monotonic()
        with pytest.raises(WorkerTimeoutError) as info:
            venv.step(actions_at(1))
        assert time.monotonic() - start < 30
        err = info.value
        assert err.env_indices == [0, 1] and err.restarted
        batch = err.batch
        for e in (2, 3, 4):
            assert_rows_equal(batch, want[2], e, f"env {e}")
        assert batch.done[:2].all() and batch.truncated["a"][1].all()
        assert batch.worker_restarts.tolist() == [1, 1, 0, 0, 0]
        batch = venv.step(actions_at(2))
        for e in (2, 3, 4):
            assert_rows_equal(batch, want[3], e, f"env {e}")


# -- episode_cut, where the arrays live -----------------------------------------------------------


class CutNative:
    """``mdp/two_round_dmdp`` natively batched (episodes of two steps with action 1), whose
    ``raise_at``-th step raises and whose ``nan_at``-th step returns NaN as copy 1's reward."""

    def __init__(self, num_envs: int, array: str, raise_at: int, nan_at: int) -> None:
        from corral.registry import spec

        self.env = spec("mdp/two_round_dmdp").make_batched(num_envs, array, "cpu")
        self.raise_at, self.nan_at, self.steps = raise_at, nan_at, 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.env, name)

    @property
    def groups(self) -> dict:
        return self.env.groups

    def reset(self, seed: Any = None, where: Any = None, options: Any = None) -> Any:
        return self.env.reset(seed=seed, where=where, options=options)

    def step(self, actions: dict) -> Any:
        self.steps += 1
        if self.steps == self.raise_at:
            raise RuntimeError("injected fault")
        out = self.env.step(actions)
        if self.steps == self.nan_at:
            out.reward["agent"][1, 0] = float("nan")
        return out


@pytest.mark.parametrize("device_path", [False, True], ids=["host", "device-path"])
@pytest.mark.parametrize("array", ["numpy", "torch"])
def test_episode_cut_marks_the_episodes_a_fault_cut_and_no_other(
    array: str, device_path: bool
) -> None:
    """A natively batched env that raises cuts every copy's episode (one that ended in
    that step as it ended: not cut); with check_finite, a NaN cuts its copy alone."""
    if array == "numpy" and device_path:
        pytest.skip("numpy has no device path")
    if array == "torch":
        pytest.importorskip("torch")
    make = partial(CutNative, array=array, raise_at=2, nan_at=5)
    ones = np.ones((3, 1), np.int64)
    path = corral.device_path() if device_path else contextlib.nullcontext()  # as on a GPU
    with (
        path,
        VectorEnv(
            NativeSource(make, 3), seed=SEED, on_env_error="restart", check_finite=True
        ) as venv,
    ):
        actions = {"agent": venv.layout.place.asarray(ones) if array == "torch" else ones}
        cuts, dones = [], []
        oracle = DecisionCounter()  # a cut episode's restart counts decisions from 0 again
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", WorkerRestartWarning)
            batch = venv.reset()
            for t in range(6):
                want = oracle.step(batch)["agent"].tolist()
                assert batch.decision["agent"].tolist() == want, t
                batch = venv.step(actions)
                cuts.append(np.asarray(batch.episode_cut.tolist()).tolist())
                dones.append(np.asarray(batch.done.tolist()).tolist())
    assert dones[1] == [True] * 3 and cuts[1] == [True] * 3  # step 2: every copy cut
    assert cuts[4] == [False, True, False] and dones[4][1]  # step 5: copy 1's NaN
    for t in (0, 2, 3, 5):
        assert cuts[t] == [False] * 3, (t, cuts)
    assert dones[3] == [True] * 3  # episodes ended by the env (steps 3-4) are not cut
