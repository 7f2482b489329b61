"""``set_attr`` reaches the env that ``get_attr`` reads, for every adapter and backend, and
survives the env's restart; and the names of AgileRL's vector API
(``call_async``/``call_wait``, ``close(terminate=...)``, spaces per agent) with errors that
show the groups."""

from __future__ import annotations

import os
import sys
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from gymnasium import spaces
from support.backends import BACKENDS, kill_worker

import corral
from corral.adapters import set_env_attr
from corral.envs.mdp import climbing_game
from corral.envs.mdp_batched import BatchedMatrixGame
from corral.errors import (
    EnvError,
    EnvRestartWarning,
    InvalidActionError,
    MissingDependencyError,
    UnknownAgentError,
    VectorStateError,
    WorkerRestartWarning,
)
from corral.vector import VectorEnv, make_vec
from corral.vector.sources import NativeSource

WORKER_BACKENDS = BACKENDS[1:]


@pytest.fixture
def options(request: pytest.FixtureRequest, ray_session) -> Any:
    """The backend options of each backend (two workers); for ``ray``, a local Ray that can
    unpickle the envs defined in this module."""
    registered = []

    def of(backend: str) -> dict[str, Any]:
        if backend == "sync":
            return {}
        if backend == "ray":
            import ray

            ray_session()
            ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
            registered.append(ray)
            return {"num_workers": 2, "num_cpus_per_worker": 0.5}
        return {"num_workers": 2}

    yield of
    for ray in registered:
        ray.cloudpickle.unregister_pickle_by_value(sys.modules[__name__])


def _make_vec(id: str, num_envs: int, backend: str, options: Any, **kwargs: Any) -> VectorEnv:
    try:
        return make_vec(id, num_envs, backend, seed=0, **kwargs, **options(backend))
    except MissingDependencyError as err:
        pytest.skip(str(err))


def _steps(venv: VectorEnv, count: int) -> Any:
    """The batch after ``count`` steps of random legal actions from a seeded reset."""
    batch = venv.reset(seed=0)
    rng = np.random.default_rng(0)
    for _ in range(count):
        batch = venv.step(venv.sample_actions(batch, rng))
    return batch


class Paying:
    """A PettingZoo ``ParallelEnv`` (without PettingZoo's base class, as some are) whose
    rewards are its curriculum knob ``level``; episodes of three steps."""

    metadata = {"name": "paying_v0"}
    possible_agents = ["a_0", "a_1"]

    def __init__(self) -> None:
        self.level = 1.0
        self.agents: list[str] = []
        self.t = 0

    def observation_space(self, agent: str) -> spaces.Space:
        return spaces.Box(0.0, 10.0, (1,), np.float32)

    def action_space(self, agent: str) -> spaces.Space:
        return spaces.Discrete(2)

    def reset(self, seed: int | None = None, options: dict | None = None) -> tuple[dict, dict]:
        self.agents, self.t = list(self.possible_agents), 0
        return {a: np.zeros(1, np.float32) for a in self.agents}, {a: {} for a in self.agents}

    def step(self, actions: dict) -> tuple[dict, ...]:
        self.t += 1
        agents, end = self.agents, self.t >= 3
        if end:
            self.agents = []
        obs = {a: np.full(1, self.t, np.float32) for a in agents}
        return (
            obs,
            dict.fromkeys(agents, self.level),
            dict.fromkeys(agents, end),
            dict.fromkeys(agents, False),
            {a: {} for a in agents},
        )

    def close(self) -> None:
        pass


def wrapped_paying() -> Any:
    """``Paying`` as a PettingZoo ``ParallelEnv`` inside one of PettingZoo's wrappers, whose
    ``__getattr__`` hands ``level`` down from the raw env."""
    from pettingzoo import ParallelEnv
    from pettingzoo.utils import BaseParallelWrapper

    class PayingParallel(Paying, ParallelEnv):
        pass

    return BaseParallelWrapper(PayingParallel())


class PayingCorral(Paying, corral.MultiAgentEnv):
    """``Paying`` written as a corral env (no adapter around it)."""

    simultaneous = True


class Closing(PayingCorral):
    """Writes a file named ``marker`` when closed."""

    marker = ""

    def close(self) -> None:
        Path(self.marker).write_text("closed")


# -- set_attr reaches the env: one case per adapter, on every backend -------------------


@pytest.mark.parametrize("backend", BACKENDS)
def test_set_attr_reaches_a_pettingzoo_parallel_env_inside_its_wrappers(
    backend: str, options: Any
) -> None:
    pytest.importorskip("pettingzoo")
    with VectorEnv([wrapped_paying] * 3, backend, **options(backend)) as venv:
        venv.set_attr("level", [7.0, 8.0, 9.0])
        assert venv.get_attr("level") == [7.0, 8.0, 9.0]
        batch = _steps(venv, 1)
        np.testing.assert_array_equal(batch.reward["a"], [[7.0, 7.0], [8.0, 8.0], [9.0, 9.0]])


@pytest.mark.parametrize("backend", BACKENDS)
def test_set_attr_reaches_a_pettingzoo_aec_env(backend: str, options: Any) -> None:
    venv = _make_vec("pettingzoo/classic/rps_v2", 2, backend, options)
    with venv:
        assert venv.max_episode_steps == 30  # 15 rounds of two turns
        venv.set_attr("max_cycles", 2)
        assert venv.get_attr("max_cycles") == [2, 2]
        assert venv.max_episode_steps == 4  # the adapter's limit follows its env's
        batch = _steps(venv, 3)
        assert not batch.done.any()
        batch = venv.step(venv.sample_actions(batch, np.random.default_rng(1)))
        assert batch.done.all() and batch.episode_length.tolist() == [4, 4]


@pytest.mark.parametrize("backend", BACKENDS)
def test_set_attr_reaches_an_mpe2_env_under_its_adapter(backend: str, options: Any) -> None:
    venv = _make_vec("mpe2/simple_spread_v3", 2, backend, options, native=False)
    with venv:
        venv.set_attr("max_cycles", 3)
        assert venv.get_attr("max_cycles") == [3, 3] and venv.max_episode_steps == 3
        assert venv.get_attr("max_episode_steps") == [3, 3]
        batch = _steps(venv, 3)
        assert batch.done.all() and batch.episode_length.tolist() == [3, 3]
        assert batch.truncated["agent"].all()


@pytest.mark.parametrize("backend", BACKENDS)
def test_set_attr_reaches_a_gymnasium_env_inside_its_wrappers(backend: str, options: Any) -> None:
    with _make_vec("gym/CartPole-v1", 2, backend, options) as venv:
        venv.set_attr("theta_threshold_radians", 0.0)  # of CartPoleEnv, under three wrappers
        assert venv.get_attr("theta_threshold_radians") == [0.0, 0.0]
        batch = _steps(venv, 1)  # any tilt now ends the episode
        assert batch.done.all() and batch.terminated["agent"].all()
        assert batch.episode_length.tolist() == [1, 1]


@pytest.mark.parametrize("backend", BACKENDS)
def test_set_attr_reaches_an_openspiel_env(backend: str, options: Any) -> None:
    with _make_vec("openspiel/kuhn_poker", 2, backend, options) as venv:
        venv.reset(seed=0)
        assert venv.render() == [None, None]
        venv.set_attr("render_mode", "ansi")
        frames = venv.render()
        assert all(isinstance(frame, str) and frame for frame in frames)


@pytest.mark.parametrize("backend", BACKENDS)
def test_set_attr_reaches_a_corral_env(backend: str, options: Any) -> None:
    with VectorEnv([PayingCorral] * 2, backend, **options(backend)) as venv:
        venv.set_attr("level", 5.0)
        np.testing.assert_array_equal(_steps(venv, 1).reward["a"], [[5.0, 5.0], [5.0, 5.0]])


@pytest.mark.parametrize("id", ["mpe2/simple_spread_v3", "corral/tag"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_set_attr_of_a_natively_batched_env_takes_effect(
    backend: str, id: str, options: Any
) -> None:
    """``max_cycles`` is settable, one value for all copies; other attributes, several
    values and a value that is no step count are refused, naming what can be set."""
    kwargs = {"size": 15} if id == "corral/tag" else {}  # no prey caught in two steps
    with _make_vec(id, 4, backend, options, env_kwargs=kwargs) as venv:
        assert venv.native
        venv.set_attr("max_cycles", 2)
        assert venv.get_attr("max_cycles") == [2] * 4 and venv.max_episode_steps == 2
        batch = _steps(venv, 2)
        assert batch.done.all() and batch.episode_length.tolist() == [2] * 4
        with pytest.raises(EnvError, match=r"declares settable \('max_cycles'\)") as refused:
            venv.set_attr("num_envs", 3)
        assert refused.value.env_index == 0 and "native=False" in str(refused.value)
        with pytest.raises(ValueError, match="one value of 'max_cycles' for all its copies"):
            venv.set_attr("max_cycles", [2, 2, 3, 2])
        for wrong in (2.5, 0, True):  # what building the env refuses, set_attr refuses too
            with pytest.raises(
                EnvError, match=rf"max_cycles must be an int of at least 1.*{wrong}"
            ):
                venv.set_attr("max_cycles", wrong)
        assert venv.get_attr("max_cycles") == [2] * 4 and venv.max_episode_steps == 2


def test_a_write_goes_where_the_read_comes_from() -> None:
    """The raw env's attribute is written there; a name nobody holds, and a private one,
    on the adapter."""
    pytest.importorskip("pettingzoo")
    env = corral.adapt(wrapped_paying())
    raw = env.unwrapped
    set_env_attr(env, "level", 3.0)
    assert raw.level == 3.0 and "level" not in vars(env) and "level" not in vars(env.env)
    assert env.level == 3.0
    set_env_attr(env, "marker", 1)  # held by nobody yet: the outermost env's, as in Gymnasium
    assert vars(env)["marker"] == 1 and not hasattr(raw, "marker") and env.marker == 1
    set_env_attr(env, "_step", 9)
    assert vars(env)["_step"] == 9
    set_env_attr(env, "check_actions", False)  # the adapter's own
    assert vars(env)["check_actions"] is False and not hasattr(raw, "check_actions")


# -- set_attr's writes survive a restart ------------------------------------------------

FAULTY = 2  # the env that fails; worker 1 runs envs 2 and 3
LEVELS = [6.0, 7.0, 8.0, 9.0]
STAY = {"a": np.zeros((4, 2), np.int64)}


class Fragile(Paying):
    """``Paying`` whose env ``FAULTY`` raises in its second step, once: the first of its
    builds to get there creates the file ``flag`` (which outlives worker processes)."""

    def __init__(self, index: int, flag: str) -> None:
        super().__init__()
        self.index, self.flag = index, flag

    def step(self, actions: dict) -> tuple[dict, ...]:
        if self.index == FAULTY and self.t == 1:
            try:
                os.close(os.open(self.flag, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
            except FileExistsError:
                return super().step(actions)
            raise RuntimeError("injected fault")
        return super().step(actions)


def _set_levels(venv: VectorEnv) -> None:
    """Set ``level`` twice, the latest per env; and another attribute between."""
    venv.set_attr("level", 5.0)
    venv.set_attr("marker", "set")
    venv.set_attr("level", LEVELS)


def _assert_pays_the_levels(venv: VectorEnv, restarted: list[int]) -> None:
    """The second step restarted the envs ``restarted``; in the third, each env pays the
    level set for it (a restarted one in its first step, the others in their last)."""
    assert venv.get_attr("level") == LEVELS and venv.get_attr("marker") == ["set"] * 4
    batch = venv.step(STAY)
    assert batch.worker_restarts.tolist() == [int(i in restarted) for i in range(4)]
    assert batch.done.tolist() == [i not in restarted for i in range(4)]
    np.testing.assert_array_equal(batch.reward["a"], np.repeat([LEVELS], 2, 0).T)


@pytest.mark.parametrize("backend", BACKENDS)
def test_an_env_rebuilt_after_a_fault_keeps_what_set_attr_wrote(
    backend: str, options: Any, tmp_path: Path
) -> None:
    """A curriculum's level is set again on the env that a fault rebuilt from its
    constructor (the adapter's source env, as ``set_attr`` set it), before its reset."""
    fns = [partial(Fragile, i, str(tmp_path / "flag")) for i in range(4)]
    venv = VectorEnv(fns, backend, on_env_error="restart", **options(backend))
    with venv:
        _set_levels(venv)
        venv.reset(seed=0)
        venv.step(STAY)
        with pytest.warns(EnvRestartWarning, match="env 2 failed and was restarted"):
            batch = venv.step(STAY)
        assert batch.worker_restarts.tolist() == [0, 0, 1, 0]
        np.testing.assert_array_equal(batch.reward["a"][[0, 1, 3], 0], [6.0, 7.0, 9.0])
        _assert_pays_the_levels(venv, [2])


@pytest.mark.parametrize("backend", WORKER_BACKENDS)
def test_a_replaced_worker_keeps_what_set_attr_wrote(backend: str, options: Any) -> None:
    """A worker killed from outside is replaced by one whose envs are built anew: they
    take the writes of the envs they replace before their first reset."""
    with VectorEnv([Paying] * 4, backend, **options(backend)) as venv:
        _set_levels(venv)
        venv.reset(seed=0)
        venv.step(STAY)
        kill_worker(venv, 1)
        with pytest.warns(WorkerRestartWarning, match=r"worker 1 \(envs 2-3\) died"):
            batch = venv.step(STAY)
        assert batch.worker_restarts.tolist() == [0, 0, 1, 1]
        _assert_pays_the_levels(venv, [2, 3])


class Picky(Paying):
    """``Paying`` whose ``level`` may not be negative."""

    @property
    def level(self) -> float:
        return self._level

    @level.setter
    def level(self, value: float) -> None:
        if value < 0:
            raise ValueError(f"a level of at least 0, got {value}")
        self._level = value


@pytest.mark.parametrize("backend", WORKER_BACKENDS)
def test_a_write_that_some_worker_refused_is_kept_by_the_workers_that_took_it(
    backend: str, options: Any
) -> None:
    with VectorEnv([Picky] * 4, backend, **options(backend)) as venv:
        with pytest.raises(EnvError, match="env 0: setting attribute 'level' raised ValueError"):
            venv.set_attr("level", [-1.0, 7.0, 8.0, 9.0])
        assert venv.get_attr("level") == [1.0, 1.0, 8.0, 9.0]  # worker 0 stopped at env 0
        venv.reset(seed=0)
        kill_worker(venv, 1)
        with pytest.warns(WorkerRestartWarning, match=r"worker 1 \(envs 2-3\) died"):
            venv.step(STAY)
        assert venv.get_attr("level") == [1.0, 1.0, 8.0, 9.0]


@pytest.mark.parametrize("backend", WORKER_BACKENDS)
def test_a_natively_batched_env_that_a_replaced_worker_rebuilds_keeps_its_attributes(
    backend: str, options: Any
) -> None:
    """A native shard is reset after a fault (the object stays); a replaced worker builds
    it anew, and sets what ``set_attr`` wrote on the one it replaces."""
    with _make_vec("mpe2/simple_spread_v3", 4, backend, options, native=True) as venv:
        venv.set_attr("max_cycles", 2)
        batch = _steps(venv, 1)
        kill_worker(venv, 1)
        with pytest.warns(WorkerRestartWarning, match=r"worker 1 \(envs 2-3\) died"):
            batch = venv.step(venv.sample_actions(batch))
        assert batch.done.all() and batch.episode_length.tolist() == [2, 2, 1, 1]
        assert venv.get_attr("max_cycles") == [2] * 4
        for _ in range(2):
            batch = venv.step(venv.sample_actions(batch))
        assert batch.done.all() and batch.episode_length.tolist() == [2] * 4


# -- AgileRL's names ---------------------------------------------------------------------


@pytest.mark.parametrize("backend", BACKENDS)
def test_call_async_and_call_wait(backend: str, options: Any) -> None:
    with VectorEnv([PayingCorral] * 3, backend, **options(backend)) as venv:
        venv.reset(seed=0)
        venv.call_async("observation_space", "a_1")
        with pytest.raises(VectorStateError, match=r"step_async\(\) while a call_async"):
            venv.step({"a": np.zeros((3, 2), np.int64)})
        with pytest.raises(VectorStateError, match=r"call_async\(\) while a call_async"):
            venv.call_async("observation_space", "a_1")
        assert venv.call_wait() == [spaces.Box(0.0, 10.0, (1,), np.float32)] * 3
        with pytest.raises(VectorStateError, match=r"call_wait\(\) without a pending call"):
            venv.call_wait()
        venv.call_async("level")  # an attribute: its value
        assert venv.call_wait() == [1.0] * 3
        venv.call_async("no_such_method")
        with pytest.raises(EnvError, match="no_such_method"):
            venv.call_wait()
        venv.step({"a": np.zeros((3, 2), np.int64)})  # usable after it


@pytest.mark.parametrize("terminate", [False, True])
@pytest.mark.parametrize("backend", BACKENDS)
def test_close_terminate_skips_closing_the_envs_of_workers(
    backend: str, terminate: bool, options: Any, tmp_path: Path
) -> None:
    markers = [tmp_path / f"env{i}" for i in range(2)]
    fns = [lambda m=m: _closing(str(m)) for m in markers]
    venv = VectorEnv(fns, backend, **options(backend))
    venv.reset(seed=0)
    pids = venv._backend.worker_pids if backend == "subproc" else []
    venv.close(terminate=terminate)
    venv.close(terminate=terminate)  # idempotent
    closed = [m.exists() for m in markers]
    assert closed == [not terminate or backend == "sync"] * 2  # sync closes its envs anyway
    for pid in pids:  # gone, and reaped
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
    with pytest.raises(VectorStateError, match="closed"):
        venv.reset()


def _closing(marker: str) -> Closing:
    env = Closing()
    env.marker = marker
    return env


def test_spaces_by_agent_or_group_and_errors_that_show_the_groups() -> None:
    venv = _make_vec("mpe2/simple_speaker_listener_v4", 2, "sync", lambda _: {})
    with venv:
        for key, group in (("speaker_0", "speaker"), ("listener_0", "listener")):
            assert venv.action_space(key) == venv.action_space(group)
            assert venv.single_action_space(key) == venv.action_space(group)
            assert venv.observation_space(key) == venv.observation_space(group)
            assert venv.single_observation_space(key) == venv.observation_space(group)
        assert venv.single_action_space("speaker_0") == spaces.Discrete(3)
        assert venv.single_observation_space("listener_0").shape == (11,)
        groups = "the groups, with their agents: 'speaker' (speaker_0), 'listener' (listener_0)"
        for lookup in (
            venv.action_space,
            venv.observation_space,
            venv.single_action_space,
            venv.single_observation_space,
        ):
            with pytest.raises(UnknownAgentError) as unknown:
                lookup("speaker_1")
            assert str(unknown.value) == f"no group or agent 'speaker_1'; {groups}"
            assert isinstance(unknown.value, KeyError)  # what a dict lookup raised before
        batch = venv.reset(seed=0)
        actions = venv.sample_actions(batch)
        with pytest.raises(InvalidActionError) as by_agent:
            venv.step({"speaker_0": actions["speaker"][:, 0], "listener": actions["listener"]})
        assert str(by_agent.value) == (
            "actions for unknown group 'speaker_0': 'speaker_0' is an agent, and actions are "
            "keyed by group, one array [env, agent, *action_shape] per group; its actions go "
            f"in actions['speaker'][:, 0]; {groups}"
        )
        with pytest.raises(InvalidActionError) as unknown_key:
            venv.step({"nobody": actions["speaker"], **actions})
        assert str(unknown_key.value) == f"actions for unknown group 'nobody'; {groups}"
        venv.step(actions)  # still usable


class _GameWithEnvs(BatchedMatrixGame):
    """A natively batched env that happens to have an attribute named ``envs``."""

    def __init__(self, num_envs: int) -> None:
        super().__init__(climbing_game(), num_envs, "numpy", "cpu")
        self.envs = ("not", "dict", "envs")


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_native_env_with_an_envs_attribute_is_not_taken_for_dict_envs(
    backend: str, options: Any
) -> None:
    with VectorEnv(NativeSource(_GameWithEnvs, 3), backend, seed=0, **options(backend)) as venv:
        assert venv.get_attr("envs") == [("not", "dict", "envs")] * 3
        with pytest.raises(TypeError, match="natively batched: it has no method 'st"):
            venv.call("step", {})
