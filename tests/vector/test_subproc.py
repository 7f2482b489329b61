"""The ``subproc`` backend: same batches as ``sync``, faults, shutdown and start methods."""

from __future__ import annotations

import dataclasses
import gc
import multiprocessing as mp
import os
import signal
import subprocess
import sys
import threading
import time
from functools import partial

import cloudpickle
import numpy as np
import pytest
from gymnasium import spaces
from support.paths import SRC

import corral
from corral.errors import (
    EnvError,
    VectorStateError,
    WorkerRestartWarning,
    WorkerTimeoutError,
)
from corral.vector import VectorEnv

# Workers started by spawn or forkserver cannot import this module (tests/ is
# not a package): send the classes below to them by value.
cloudpickle.register_pickle_by_value(sys.modules[__name__])


class CountEnv(corral.MultiAgentEnv):
    """One agent counting its steps; an episode lasts ``length`` steps.

    At step ``fault_at`` the env raises (``fault="raise"``) or hangs
    (``fault="hang"``). ``label`` identifies the env in calls and frames.
    """

    metadata = {"render_modes": ["rgb_array"]}

    def __init__(self, label: int = 0, length: int = 4, fault: str | None = None, fault_at=2):
        self.label = label
        self.length = length
        self.fault = fault
        self.fault_at = fault_at
        self.possible_agents = ["a"]
        self.agents: list[str] = []
        self.t = 0

    def observation_space(self, agent: str) -> spaces.Box:
        return spaces.Box(0.0, 100.0, (1,), np.float32)

    def action_space(self, agent: str) -> spaces.Discrete:
        return spaces.Discrete(2)

    def reset(self, seed=None, options=None):
        self.agents, self.t = ["a"], 0
        return {"a": self._obs()}, {"a": {}}

    def step(self, actions):
        self.t += 1
        if self.t == self.fault_at and self.fault == "raise":
            self.explode_on_purpose()
        if self.t == self.fault_at and self.fault == "hang":
            time.sleep(60)
        done = self.t >= self.length
        infos = {"a": {"final_obs": self._obs()} if done else {}}
        obs = {} if done else {"a": self._obs()}
        self.agents = [] if done else ["a"]
        return obs, {"a": 1.0}, {"a": done}, {"a": False}, infos

    def explode_on_purpose(self) -> None:
        raise ValueError("boom")

    def scaled_label(self, factor: int) -> int:
        return self.label * factor

    def render(self) -> np.ndarray:
        return np.full((2, 2, 3), self.label, np.uint8)

    def _obs(self) -> np.ndarray:
        return np.array([self.t], np.float32)


def count_envs(num_envs: int = 5, **faulty) -> list:
    """Constructors of ``num_envs`` CountEnvs; ``faulty`` maps an env index to its fault."""
    return [partial(CountEnv, label=i, fault=faulty.get(f"env{i}")) for i in range(num_envs)]


def subproc(env_fns, **options) -> VectorEnv:
    """A subproc vector env with two workers, started the default way (forkserver)."""
    return VectorEnv(env_fns, backend="subproc", **{"num_workers": 2, **options})


def zero_actions(venv: VectorEnv) -> dict:
    return {g: np.zeros((venv.num_envs, len(ids)), np.int64) for g, ids in venv.groups.items()}


def assert_same_batch(got, want) -> None:
    for field in dataclasses.fields(want):
        assert_same_tree(getattr(got, field.name), getattr(want, field.name), field.name)


def assert_same_tree(a, b, name: str) -> None:
    if isinstance(b, dict):
        assert a.keys() == b.keys(), name
        for key in b:
            assert_same_tree(a[key], b[key], f"{name}/{key}")
    elif b is None:
        assert a is None, name
    else:
        assert a.dtype == b.dtype, name
        np.testing.assert_array_equal(a, b, err_msg=name)


def process_gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


# -- the same batches as sync ---------------------------------------------------------

CASES = {
    "rps": ("corral/rps", {}),
    "tag": ("corral/tag", {}),
    "mpe2": ("mpe2/simple_spread_v3", {"N": 3, "max_cycles": 10}),
}


@pytest.mark.parametrize("case", CASES)
def test_batches_equal_sync_batches(case: str) -> None:
    id, kwargs = CASES[case]
    if id.startswith("mpe2"):
        pytest.importorskip("mpe2")
    fns = [partial(corral.make, id, **kwargs)] * 5
    sync = VectorEnv(fns, backend="sync")
    with VectorEnv(fns, backend="subproc", num_workers=2) as venv:  # 3 + 2 envs
        want, got = sync.reset(seed=7), venv.reset(seed=7)
        assert_same_batch(got, want)
        rng = np.random.default_rng(0)
        for _ in range(50):
            actions = sync.sample_actions(want, rng)
            want, got = sync.step(actions), venv.step(actions)
            assert_same_batch(got, want)
    sync.close()


# -- calls --------------------------------------------------------------------------------


def test_call_get_attr_set_attr_and_render_span_every_worker() -> None:
    with subproc(count_envs(5)) as venv:
        venv.reset(seed=0)
        assert venv.get_attr("label") == [0, 1, 2, 3, 4]
        assert venv.call("scaled_label", 10) == [0, 10, 20, 30, 40]
        venv.set_attr("label", [5, 6, 7, 8, 9])
        assert venv.get_attr("label") == [5, 6, 7, 8, 9]
        frames = venv.render()
        assert [int(frame[0, 0, 0]) for frame in frames] == [5, 6, 7, 8, 9]


def test_wait_without_async_is_a_state_error() -> None:
    with subproc(count_envs(2)) as venv:
        venv.reset()
        with pytest.raises(VectorStateError):
            venv.step_wait()
    with pytest.raises(VectorStateError):
        venv.reset()


# -- faults -------------------------------------------------------------------------------


def test_env_exception_is_raised_with_env_index_and_worker_traceback() -> None:
    with subproc(count_envs(5, env3="raise")) as venv:
        venv.reset(seed=0)
        venv.step(zero_actions(venv))
        with pytest.raises(EnvError) as info:
            venv.step(zero_actions(venv))
        assert info.value.env_index == 3
        assert "env 3" in str(info.value)
        assert "explode_on_purpose" in str(info.value)  # the worker's traceback
        assert "ValueError: boom" in str(info.value)
        batch = venv.reset(seed=1)
        assert batch.acting["a"].all()
        batch = venv.step(zero_actions(venv))
        assert batch.reward["a"].tolist() == [[1.0]] * 5


def test_env_that_cannot_be_built_fails_construction_without_leftovers() -> None:
    def broken():
        raise RuntimeError("no env today")

    before = set(mp.active_children())
    with pytest.raises(EnvError, match=r"env 4: .* no env today"):
        subproc([partial(CountEnv)] * 4 + [broken])
    assert set(mp.active_children()) <= before


def test_killed_worker_is_restarted_and_its_envs_reported_truncated() -> None:
    with subproc(count_envs(5)) as venv:
        venv.reset(seed=0)
        venv.step(zero_actions(venv))
        old = venv._backend.worker_pids
        os.kill(old[1], signal.SIGKILL)
        with pytest.warns(WorkerRestartWarning, match="worker 1"):
            batch = venv.step(zero_actions(venv))
        new = venv._backend.worker_pids
        assert new[0] == old[0] and new[1] != old[1]
        assert batch.done.tolist() == [False, False, False, True, True]
        assert batch.truncated["a"][:, 0].tolist() == [False, False, False, True, True]
        assert batch.worker_restarts.tolist() == [0, 0, 0, 1, 1]
        assert batch.reward["a"][:, 0].tolist() == [1.0, 1.0, 1.0, 0.0, 0.0]
        assert batch.final_obs["a"][3:, 0, 0].tolist() == [1.0, 1.0]  # the killed episodes
        # their totals outlive the worker: one step, paid 1.0, before it died
        assert batch.episode_return["a"][3:, 0].tolist() == [1.0, 1.0]
        assert batch.episode_length[3:].tolist() == [1, 1]
        assert batch.obs["a"][:, 0, 0].tolist() == [2.0, 2.0, 2.0, 0.0, 0.0]
        batch = venv.step(zero_actions(venv))
        assert batch.obs["a"][:, 0, 0].tolist() == [3.0, 3.0, 3.0, 1.0, 1.0]
        assert batch.worker_restarts.tolist() == [0, 0, 0, 1, 1]


def test_restarted_envs_start_a_new_turn() -> None:
    with subproc([partial(corral.make, "corral/rps")] * 4) as venv:
        venv.reset(seed=0)
        batch = venv.step({"player": np.zeros((4, 2), np.int64)})
        assert batch.acting["player"].tolist() == [[False, True]] * 4
        os.kill(venv._backend.worker_pids[1], signal.SIGKILL)
        with pytest.warns(WorkerRestartWarning):
            batch = venv.step({"player": np.zeros((4, 2), np.int64)})
        assert batch.acting["player"].tolist() == [[True, False]] * 4
        assert batch.truncated["player"].tolist() == [[False, False]] * 2 + [[True, True]] * 2
        assert batch.alive["player"].all()


def test_hanging_worker_times_out_and_is_replaced_within_the_step() -> None:
    with subproc(count_envs(5, env4="hang"), timeout=0.5) as venv:
        venv.reset(seed=0)
        venv.step(zero_actions(venv))
        hung = venv._backend.worker_pids[1]
        start = time.monotonic()
        with pytest.raises(WorkerTimeoutError, match="worker 1") as info:
            venv.step(zero_actions(venv))
        assert time.monotonic() - start < 5
        assert process_gone(hung)
        assert info.value.env_indices == [3, 4]
        batch = info.value.batch  # the healthy envs stepped; the late ones restarted
        assert batch.worker_restarts.tolist() == [0, 0, 0, 1, 1]
        assert batch.obs["a"][:, 0, 0].tolist() == [2.0, 2.0, 2.0, 0.0, 0.0]
        assert batch.done.tolist() == [False, False, False, True, True]
        # env 3 stepped before env 4 hung in the same worker, but a worker's shard reports
        # its step whole or not at all: both cut episodes end before this step
        assert batch.episode_length[3:].tolist() == [1, 1]
        assert batch.reward["a"][:, 0].tolist() == [1.0, 1.0, 1.0, 0.0, 0.0]
        batch = venv.reset(seed=3)  # no restart left to do: no warning
        assert batch.worker_restarts.tolist() == [0, 0, 0, 1, 1]
        batch = venv.step(zero_actions(venv))
        assert batch.obs["a"][:, 0, 0].tolist() == [1.0] * 5


def test_keyboard_interrupt_while_waiting_closes_the_workers(ctrl_c) -> None:
    venv = subproc(count_envs(3, env2="hang"))
    venv.reset(seed=0)
    venv.step(zero_actions(venv))
    pids = venv._backend.worker_pids
    timer = threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGINT))
    timer.start()
    with pytest.raises(KeyboardInterrupt):
        venv.step(zero_actions(venv))
    timer.join()
    assert all(process_gone(pid) for pid in pids)
    venv.close()


# -- shutdown -------------------------------------------------------------------------------


def corral_shm() -> set[str]:
    """corral's files in /dev/shm (blocks where ``memfd_create`` is missing, Python's
    shared memory): other processes' files (another test process, Ray) are not ours."""
    if not os.path.isdir("/dev/shm"):
        return set()
    return {n for n in os.listdir("/dev/shm") if n.startswith(("corral-", "psm_"))}


def test_close_is_idempotent_and_leaves_no_process_or_shared_memory() -> None:
    shm_before = corral_shm()
    venv = subproc(count_envs(5))
    venv.reset(seed=0)
    venv.step(zero_actions(venv))
    pids = venv._backend.worker_pids
    assert {p.pid for p in mp.active_children()} >= set(pids)
    venv.close()
    venv.close()
    assert all(process_gone(pid) for pid in pids)
    assert not {p.pid for p in mp.active_children()} & set(pids)
    assert corral_shm() <= shm_before
    with pytest.raises(VectorStateError):
        venv.step(zero_actions(venv))


class ClosingEnv(CountEnv):
    """A CountEnv that leaves a file ``closed_<label>`` in ``where`` when it is closed; the
    env labelled ``fails`` raises in its close() after that."""

    def __init__(self, label: int, where: str, fails: int) -> None:
        super().__init__(label)
        self.where, self.fails = where, fails

    def close(self) -> None:
        open(os.path.join(self.where, f"closed_{self.label}"), "w").close()
        if self.label == self.fails:
            raise RuntimeError(f"env {self.label} cannot close")


@pytest.mark.parametrize("backend", ["sync", "subproc"])
def test_an_env_failing_to_close_stops_no_other_env_closing_and_is_raised(
    backend: str, tmp_path
) -> None:
    fns = [partial(ClosingEnv, i, str(tmp_path), fails=1) for i in range(4)]
    venv = VectorEnv(fns, backend=backend, **({"num_workers": 2} if backend == "subproc" else {}))
    venv.reset(seed=0)
    with pytest.raises(EnvError, match=r"env 1: close\(\) raised RuntimeError: env 1 cannot close"):
        venv.close()
    assert sorted(os.listdir(tmp_path)) == [f"closed_{i}" for i in range(4)]
    venv.close()  # closed: nothing left to raise


def test_a_vector_env_never_closed_stops_its_workers_when_collected() -> None:
    venv = subproc(count_envs(2))
    venv.reset(seed=0)
    pids = venv._backend.worker_pids
    del venv
    gc.collect()
    assert all(process_gone(pid) for pid in pids)


def test_close_after_faults_stops_every_worker() -> None:
    venv = subproc(count_envs(5, env1="raise", env4="hang"), timeout=0.5)
    venv.reset(seed=0)
    venv.step(zero_actions(venv))
    pids = venv._backend.worker_pids
    with pytest.raises(EnvError) as info:  # the first fault by env index: env 1's error
        venv.step(zero_actions(venv))
    assert [type(f) for f in info.value.faults] == [EnvError, WorkerTimeoutError]
    venv.close()
    venv.close()
    assert all(process_gone(pid) for pid in pids)


# -- start methods --------------------------------------------------------------------------


START_METHOD_SCRIPT = """
import sys
import numpy as np
import corral
from corral.vector import VectorEnv

fns = [lambda: corral.make("corral/rps")] * 3
with VectorEnv(fns, backend="subproc", num_workers=2, start_method=sys.argv[1]) as venv:
    venv.reset(seed=0)
    batch = venv.step({"player": np.zeros((3, 2), np.int64)})
    print(batch.acting["player"].tolist())
"""


@pytest.mark.parametrize("method", ["fork", "spawn", "forkserver"])
def test_every_start_method_builds_and_steps(method: str) -> None:
    """In an interpreter of its own: threads that earlier tests leave in this one (Ray's gRPC,
    torch's) make fork's children crash, as they would a user's."""
    if method not in mp.get_all_start_methods():
        pytest.skip(f"{method} is not available here")
    done = subprocess.run(
        [sys.executable, "-c", START_METHOD_SCRIPT, method],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str([[False, True]] * 3)


# -- a script without a __main__ guard --------------------------------------------------------

UNGUARDED_SCRIPT = """
import corral

venv = corral.make_vec("corral/rps", 2, backend="subproc", num_workers=2)
venv.close()
"""


def processes_in_group(pgid: int) -> list[int]:
    """The live (not zombie) processes of process group ``pgid``."""
    found = []
    for entry in os.listdir("/proc"):
        try:
            with open(f"/proc/{entry}/stat") as f:
                # the fields after the command name (in parentheses): state, ppid, pgrp, ...
                state, _, group = f.read().rsplit(")", 1)[1].split()[:3]
        except (OSError, ValueError):  # not a process, or it ended while being read
            continue
        if int(group) == pgid and state != "Z":
            found.append(int(entry))
    return found


@pytest.mark.skipif(not os.path.isdir("/proc"), reason="reads the process table from /proc")
def test_script_without_main_guard_gets_a_clear_error_and_leaves_no_process(tmp_path) -> None:
    script = tmp_path / "train_script.py"
    script.write_text(UNGUARDED_SCRIPT)
    src = str(SRC)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([src, os.environ.get("PYTHONPATH", "")])}
    # its own session: its processes (fork server and workers too) form one group to look for
    proc = subprocess.Popen(
        [sys.executable, str(script)],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        _, stderr = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode != 0
    last_line = stderr.strip().splitlines()[-1]
    assert last_line.startswith("corral.errors.WorkerStartError: 2 worker(s) died while starting")
    assert "exit code 1" in last_line
    assert 'if __name__ == "__main__":' in last_line and 'backend="sync"' in last_line
    assert "KeyError" not in stderr
    deadline = time.monotonic() + 10
    while processes_in_group(proc.pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert processes_in_group(proc.pid) == []


def test_a_worker_dead_before_the_step_is_sent_is_replaced_with_a_warning() -> None:
    with subproc(count_envs(4)) as venv:
        venv.reset(seed=0)
        worker = venv._backend.shards[1]
        os.kill(worker.process.pid, signal.SIGKILL)
        worker.process.join(10)  # gone: the step's command then meets a broken pipe
        assert worker.process.exitcode == -signal.SIGKILL
        with pytest.warns(WorkerRestartWarning, match="worker 1"):
            batch = venv.step(zero_actions(venv))
        assert batch.worker_restarts.tolist() == [0, 0, 1, 1]
        assert batch.truncated["a"][:, 0].tolist() == [False, False, True, True]


# -- how commands reach a worker ----------------------------------------------------------


def test_a_worker_inbox_hands_over_messages_in_order_then_the_parents_end() -> None:
    from corral.vector.subproc import _Inbox

    parent, child = mp.Pipe()
    inbox = _Inbox(child)
    parent.send(("reset", [0, 1], None))
    parent.send(("step",))
    assert inbox.receive() == ("reset", [0, 1], None)  # already there: no watch
    assert inbox.receive() == ("step",)
    threading.Timer(0.01, parent.send, (("call", "render", (), {}),)).start()
    assert inbox.receive() == ("call", "render", (), {})  # sent while it watched or blocked
    parent.close()
    with pytest.raises(EOFError):  # an idle worker learns that its parent is gone
        inbox.receive()


@pytest.mark.skipif(not hasattr(os, "sched_yield"), reason="watches only where it can yield")
def test_an_idle_worker_stops_watching_its_pipe_while_the_parent_is_busy() -> None:
    """After LONG_WAITS waits in a row longer than SPIN_S, a worker blocks at once: a parent
    that computes between steps does not share its cores with spinning workers."""
    from corral.vector import subproc as sp

    parent, child = mp.Pipe()
    inbox = sp._Inbox(child)

    def cpu_of_a_wait(delay: float) -> float:
        """CPU seconds this thread spends receiving a message sent ``delay`` s later."""
        timer = threading.Timer(delay, parent.send, (("step",),))
        timer.start()
        start = time.thread_time()
        assert inbox.receive() == ("step",)
        spent = time.thread_time() - start
        timer.join()
        return spent

    for _ in range(sp.LONG_WAITS):
        cpu_of_a_wait(20 * sp.SPIN_S)
    # A watch would spend about SPIN_S of CPU here (less on a loaded machine); blocking at
    # once spends a few microseconds.
    assert cpu_of_a_wait(20 * sp.SPIN_S) < sp.SPIN_S / 4
    parent.send(("step",))
    inbox.receive()  # a short wait: it watches again next time
    assert inbox._long_waits == 0
