"""DQN and MADDPG learn from rollouts through replay memories where the batches live.

On torch batches (``make_vec(..., array="torch")``) the rows are written and
sampled on the batches' device and nothing is read back per step: the reads
are per rollout (the metrics, the episodes that ended), counted as in
``tests/training/test_rollout_device.py``. With exploration switched off, torch batches fill the
memory with the same rows as NumPy batches.
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from support.devices import DEVICES, HOST_SIDE, counting_reads  # noqa: E402
from support.host_reads import counting_transfers  # noqa: E402
from support.marks import needs_cuda  # noqa: E402
from support.runs import run_settings  # noqa: E402

import corral  # noqa: E402
from corral.algos.dqn import DQN  # noqa: E402
from corral.algos.maddpg import MADDPG  # noqa: E402
from corral.arrays import to_numpy  # noqa: E402
from corral.training.collector import Collector  # noqa: E402
from corral.training.self_play import OPPONENT, self_play  # noqa: E402

SPREAD = "mpe2/simple_spread_v3"


def spread(num_envs, array, device="cpu", continuous=False, state=False, deferred=False):
    return corral.make_vec(
        SPREAD,
        num_envs,
        seed=0,
        native=True,
        array=array,
        device=device,
        dtype="float64",
        state=state,
        env_kwargs={"continuous_actions": continuous},
        deferred_checks=deferred,
    )


def dqn(venv, device, **settings):
    config = DQN.Config(hidden=(16,), batch_size=8, seed=0, **settings)
    return DQN(venv, config, device=device)


def maddpg(venv, device, **settings):
    config = MADDPG.Config(hidden=(16,), batch_size=8, seed=0, **settings)
    return MADDPG(venv, config, device=device)


LEARNERS = {
    "dqn": (dqn, {"learning_starts": 0}, {}),
    "maddpg": (maddpg, {"learning_starts": 0}, {"continuous": True, "state": True}),
    "maddpg-discrete": (maddpg, {"learning_starts": 0}, {"state": True}),
}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", list(LEARNERS))
def test_a_rollout_and_its_gradient_steps_read_the_host_a_constant_number_of_times(name, device):
    make, settings, env = LEARNERS[name]
    reads = {}
    for train_freq in (4 * 13, 4 * 40):  # rollouts of 13 and 40 vector steps of 4 envs
        venv = spread(4, "torch", device, **env)
        algo = make(venv, device, train_freq=train_freq, **settings)
        assert algo.rollout_steps == train_freq // 4
        collector = Collector(venv, algo, seed=0)
        with counting_reads() as counts:
            progress = collector.run(2 * train_freq)
        venv.close()
        assert len(progress.updates) == 2 and progress.episode_returns
        memory = algo.buffer["agent"] if name == "dqn" else algo.buffer
        assert torch.is_tensor(memory.size) and memory.size.device.type == device
        reads[train_freq] = counts
    # the same reads whatever the steps per rollout: none of them is per step
    assert reads[4 * 13] == reads[4 * 40], (reads[4 * 13], reads[4 * 40])
    assert sum(reads[4 * 40].values()) <= 10 * 2, reads[4 * 40]


@pytest.mark.parametrize("name", list(LEARNERS))
def test_as_on_a_gpu_replay_learners_copy_nothing_from_the_host_per_step(name, as_on_a_gpu):
    # the vector layer on its device path too (corral.device_path()): copies from the
    # host are per run at most (an action space's bounds, once), never per step or rollout
    make, settings, env = LEARNERS[name]
    copies = {}
    for train_freq in (4 * 13, 4 * 40):
        venv = spread(4, "torch", deferred=True, **env)
        algo = make(venv, "cpu", train_freq=train_freq, **settings)
        collector = Collector(venv, algo, seed=0)
        with counting_transfers(host_side=HOST_SIDE) as counts:
            progress = collector.run(2 * train_freq)
        venv.close()
        assert len(progress.updates) == 2 and progress.episode_returns
        copies[train_freq] = counts
    assert copies[4 * 13] == copies[4 * 40], (copies[4 * 13], copies[4 * 40])
    assert sum(copies[4 * 40].values()) <= 2, copies[4 * 40]


@needs_cuda
@pytest.mark.parametrize("name", list(LEARNERS))
def test_on_cuda_replay_learners_synchronise_a_constant_number_of_times(name):
    import warnings
    from collections import Counter

    make, settings, env = LEARNERS[name]
    syncs = {}
    for train_freq in (4 * 13, 4 * 40):
        venv = spread(4, "torch", "cuda", deferred=True, **env)
        algo = make(venv, "cuda", train_freq=train_freq, **settings)
        collector = Collector(venv, algo, seed=0)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode("warn")
            try:
                collector.run(2 * train_freq)
            finally:
                torch.cuda.set_sync_debug_mode("default")
        venv.close()
        # a synchronising call (a read back, or a copy from the host that is not
        # asynchronous) warns from the Python line that made it
        lines = [f"{w.filename}:{w.lineno}" for w in caught if "synchroniz" in str(w.message)]
        syncs[train_freq] = Counter(lines)
    assert syncs[4 * 13] == syncs[4 * 40], (syncs[4 * 13], syncs[4 * 40])


def filled(name, array):
    """The replay rows after 60 vector steps without exploration (deterministic acting)."""
    make, _, env = LEARNERS[name]
    venv = spread(3, array, **env)
    quiet = (
        {"epsilon_start": 0.0, "epsilon_end": 0.0}
        if name == "dqn"
        else {"noise_std": 0.0, "noise_std_final": 0.0}
    )
    algo = make(venv, "cpu", learning_starts=10**6, train_freq=5, **quiet)
    Collector(venv, algo, seed=0).run(3 * 60)
    venv.close()
    state = algo.replay_state_dict()
    data = state["agent"]["data"] if name == "dqn" else state["data"]
    return algo, {k: to_numpy(v) for k, v in data.items()}


@pytest.mark.parametrize("name", ["dqn", "maddpg"])
def test_torch_batches_fill_the_memory_with_the_rows_of_numpy_batches(name):
    numpy_algo, on_numpy = filled(name, "numpy")
    torch_algo, on_torch = filled(name, "torch")
    assert on_numpy.keys() == on_torch.keys()
    assert len(on_numpy["reward"]) == 180 * (3 if name == "dqn" else 1)
    for field in on_numpy:
        # MADDPG's continuous actions are scaled in float32 on torch, float64 on NumPy
        np.testing.assert_allclose(
            on_torch[field], on_numpy[field], rtol=1e-5, atol=1e-6, err_msg=field
        )
    if name == "dqn":
        assert on_numpy["terminated"].dtype == bool
    else:
        assert on_numpy["agent/terminated"].dtype == bool
        assert not np.array_equal(on_numpy["next_state"], on_numpy["state"])
    assert numpy_algo.env_steps == torch_algo.env_steps == 180  # counted from the rollouts


def test_dqn_counts_env_steps_from_the_rollouts_it_learns_not_from_acting():
    venv = spread(4, "numpy")
    algo = dqn(venv, "cpu", train_freq=8, epsilon_decay_steps=100)
    batch = venv.reset(seed=0)
    for _ in range(5):
        algo.policy.act(batch)
    assert algo.env_steps == 0 and algo.epsilon() == 1.0
    Collector(venv, algo, seed=0).run(40)
    venv.close()
    assert algo.rollout_steps == 2 and algo.env_steps == 40
    assert algo.epsilon() == pytest.approx(1.0 - 0.4 * 0.95)


def test_dqn_takes_its_gradient_steps_per_train_freq_env_steps():
    venv = spread(3, "numpy")
    algo = dqn(venv, "cpu", train_freq=7, gradient_steps=2, learning_starts=0)
    assert algo.rollout_steps == 3  # 9 env steps per rollout
    progress = Collector(venv, algo, seed=0).run(9 * 7)
    venv.close()
    # 63 env steps pay for 9 rounds of 2 gradient steps; every rollout (9 env steps, more
    # than train_freq) completes at least one round, so each of the 7 reports an update
    assert algo.gradient_step == 18 and algo.pending_steps == 0
    assert len(progress.updates) == 7


def test_dqn_self_play_refuses_torch_batches():
    venv = corral.make_vec("pettingzoo/classic/tictactoe_v3", 2, array="torch", seed=0)
    algo = DQN(venv, DQN.Config(self_play=True, seed=0))
    pool = self_play(venv, algo)["fixed"][OPPONENT].policy
    with pytest.raises(ValueError, match="self_play plays numpy batches only"):
        pool.act(venv.reset(seed=0))
    venv.close()


def test_maddpg_on_torch_batches_refuses_an_agent_that_does_not_act():
    from corral.errors import UnsupportedEnvError

    venv = spread(2, "torch", continuous=True)
    algo = maddpg(venv, "cpu", train_freq=2)
    collector = Collector(venv, algo, seed=0)
    step = venv.step

    def one_idle(actions):
        batch = step(actions)
        batch.acting["agent"][1, 2] = False
        return batch

    venv.step = one_idle
    with pytest.raises(UnsupportedEnvError, match="in env 1 agent 'agent_2'"):
        collector.run(6)  # the second rollout acts on a stepped batch
    venv.close()


@pytest.mark.parametrize("algo", ["dqn", "maddpg"])
def test_the_runner_trains_replay_learners_on_torch_batches(tmp_path, algo):
    from corral.training import Runner, load_config

    settings = {"learning_starts": 40, "batch_size": 16, "array": "torch"}
    if algo == "maddpg":
        settings["env_kwargs.continuous_actions"] = True
    config = load_config(algo, SPREAD, run_settings(tmp_path, algo, **settings))
    with Runner(config, progress=False) as runner:
        assert isinstance(runner.collector.batch.done, torch.Tensor)
        results = runner.train()
    losses = [r for r in results.metrics if any(k.startswith(("loss", "critic_loss")) for k in r)]
    assert losses and all(np.isfinite(v) for r in losses for v in r.values() if v is not None)


@pytest.mark.parametrize("name", ["dqn", "maddpg"])
def test_exploring_actions_on_torch_batches_are_legal_and_stay_tensors(name):
    from types import SimpleNamespace

    venv = corral.make_vec("mdp/penalty", 2, seed=0)
    algo = (dqn if name == "dqn" else maddpg)(venv, "cpu")
    if name == "dqn":
        algo.config.epsilon_start = 1.0  # every action explores
    else:
        algo.config.epsilon = 1.0
    venv.close()
    mask = torch.zeros((50, 2, 3), dtype=torch.bool)
    mask[..., 1] = True
    mask[:25, :, 2] = True
    batch = SimpleNamespace(
        obs={"player": torch.zeros((50, 2, 1))},
        acting={"player": torch.ones((50, 2), dtype=torch.bool)},
        action_mask={"player": mask},
        done=torch.zeros(50, dtype=torch.bool),
    )
    for explore in (True, False):
        actions = algo.policy.act(batch, explore=explore)[0]["player"]
        assert torch.is_tensor(actions) and actions.shape == (50, 2)
        assert mask.gather(-1, actions[..., None]).all()
    explored = algo.policy.act(batch, explore=True)[0]["player"]
    assert set(explored[:25].flatten().tolist()) == {1, 2}
