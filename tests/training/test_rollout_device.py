"""MAPPO/IPPO collecting and learning on torch batches: no host read per step.

With a natively batched env on torch (``make_vec(..., array="torch")``) the
learner acts, builds rollouts and learns on the batches' device; the only
reads back to the host are per rollout (the PPO metrics, the episodes that
ended, the decisions' indices), never per step. On the CPU a read is a call
that turns a tensor into host values (``.item()``, ``.numpy()``, ``bool()``...);
the test counts those made from the learning side. On a device the vector
layer and the envs read nothing per step either (``vector/episodes.py``,
``deferred_checks``): with the vector layer taking its device path on the CPU
(inside ``corral.device_path()``, as on a GPU) every read is counted, the calls
that would synchronise a GPU without reading a value included
(tests/support/host_reads.py), and so is every copy from the host to the device. CUDA
variants run where a GPU is present.
"""

from __future__ import annotations

import contextlib
from collections import Counter

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from oracles.decisions import DecisionCounter  # noqa: E402
from support import host_reads  # noqa: E402
from support.devices import DEVICES, HOST_SIDE, counting_reads  # noqa: E402
from support.marks import needs_cuda  # noqa: E402
from support.runs import run_settings  # noqa: E402

import corral  # noqa: E402
from corral.algos.mappo import IPPO, MAPPO  # noqa: E402
from corral.errors import InvalidActionError  # noqa: E402
from corral.training.collector import Collector  # noqa: E402
from corral.training.self_play import OPPONENT, self_play  # noqa: E402


def torch_collector(
    algo_cls,
    device,
    num_envs=4,
    rollout_steps=10,
    deferred=False,
    env=("mpe2/simple_spread_v3", {}),
    **settings,
):
    env_id, env_kwargs = env
    venv = corral.make_vec(
        env_id,
        num_envs,
        array="torch",
        device=device,
        seed=0,
        state=algo_cls.uses_state,
        deferred_checks=deferred,
        env_kwargs=env_kwargs,
    )
    config = algo_cls.Config(rollout_steps=rollout_steps, epochs=2, seed=0, **settings)
    algo = algo_cls(venv, config, device=device)
    return venv, algo, Collector(venv, algo, seed=0)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("algo_cls", [MAPPO, IPPO], ids=["mappo", "ippo"])
def test_a_rollout_and_update_read_the_host_a_constant_number_of_times(algo_cls, device):
    reads = {}
    for steps in (13, 40):  # episodes of 25 steps end in both runs
        venv, algo, collector = torch_collector(algo_cls, device, rollout_steps=steps)
        with counting_reads() as counts:
            progress = collector.run(2 * steps * venv.num_envs)
        venv.close()
        assert algo.updates == 2 and progress.episode_returns
        reads[steps] = counts
    # the same reads whatever the steps per rollout: none of them is per step
    assert reads[13] == reads[40], (reads[13], reads[40])
    assert sum(reads[40].values()) <= 10 * 2, reads[40]


# Natively batched envs of each kind: MPE; dying agents and resets that place agents at
# random (tag); chance drawn per step (a tabular mdp). Episodes end in every rollout.
DEVICE_ENVS = {
    "spread": ("mpe2/simple_spread_v3", {}),
    "tag": ("corral/tag", {"size": 4, "max_cycles": 12}),
    "nmdp": ("mdp/multi_round_nmdp", {}),
}


@pytest.mark.parametrize("env", list(DEVICE_ENVS.values()), ids=list(DEVICE_ENVS))
@pytest.mark.parametrize("algo_cls", [MAPPO, IPPO], ids=["mappo", "ippo"])
def test_as_on_a_gpu_everything_reads_the_host_a_constant_number_of_times_per_rollout(
    algo_cls, env, as_on_a_gpu
):
    # the vector layer and the envs counted too: nothing of theirs is per step
    reads = {}
    for steps in (13, 40):
        venv, algo, collector = torch_collector(
            algo_cls, "cpu", rollout_steps=steps, deferred=True, env=env
        )
        with (
            host_reads.counting_reads(host_side=HOST_SIDE) as counts,
            host_reads.counting_transfers(host_side=HOST_SIDE) as copies,
        ):
            progress = collector.run(2 * steps * venv.num_envs)
        venv.close()
        assert algo.updates == 2 and progress.episode_returns
        reads[steps] = counts
        # nor a copy from the host: constants made on the device once, the policy's draws
        # (from a CPU generator) copied asynchronously
        assert copies == {}, copies
    assert reads[13] == reads[40], (reads[13], reads[40])
    assert sum(reads[40].values()) <= 12 * 2, reads[40]
    # the one read of the vector layer: the actions' problems, once per rollout
    assert reads[40]["corral.vector.deferred:raise_first:tolist"] == 2, reads[40]


def test_the_rollout_collector_raises_a_bad_action_checked_on_the_device(as_on_a_gpu):
    venv, algo, collector = torch_collector(MAPPO, "cpu", deferred=True)
    act, calls = algo.policy.act, []

    def act_badly(batch, **kwargs):
        actions, extras = act(batch, **kwargs)
        calls.append(None)
        if len(calls) == 4:
            actions["agent"] = actions["agent"].clone()
            actions["agent"][1, 2] = 7
        return actions, extras

    algo.policy.act = act_badly
    with pytest.raises(InvalidActionError, match=r"env 1, agent 'agent_2'.*in step 4 of the 10"):
        collector.run(40 * venv.num_envs)
    assert algo.updates == 0  # found before learning from the rollout
    venv.close()


@needs_cuda
def test_on_cuda_a_rollout_and_update_synchronise_a_constant_number_of_times():
    import warnings

    syncs = {}
    for steps in (13, 40):
        venv, _, collector = torch_collector(MAPPO, "cuda", rollout_steps=steps, deferred=True)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode("warn")
            try:
                collector.run(2 * steps * venv.num_envs)
            finally:
                torch.cuda.set_sync_debug_mode("default")
        venv.close()
        # a synchronising call warns from the Python line that made it (vector layer and
        # envs included: on a device they synchronise nothing per step either)
        lines = [f"{w.filename}:{w.lineno}" for w in caught if "synchroniz" in str(w.message)]
        syncs[steps] = Counter(lines)
    assert syncs[13] == syncs[40], (syncs[13], syncs[40])


def test_the_counter_sees_reads_made_per_step():
    # the check above would fail on a learner that reads a value back in every step
    venv, algo, collector = torch_collector(MAPPO, "cpu")
    act = algo.policy.act

    def reading_act(batch, **kwargs):
        batch.done.any().item()
        return act(batch, **kwargs)

    algo.policy.act = reading_act
    with counting_reads() as counts:
        collector.run(10 * venv.num_envs)
    venv.close()
    assert sum(counts.values()) >= 10


def trained(array, device, algo_cls, updates=3, env_kwargs=None, **settings):
    """Networks after ``updates`` rollouts of 10 steps of 4 native simple_spread envs, and
    what each ``run`` of 7 vector steps reported."""
    venv = corral.make_vec(
        "mpe2/simple_spread_v3",
        4,
        array=array,
        device=device,
        dtype="float64",
        seed=0,
        state=algo_cls.uses_state,
        env_kwargs=env_kwargs,
    )
    config = algo_cls.Config(rollout_steps=10, epochs=2, seed=0, **settings)
    algo = algo_cls(venv, config, device=device)
    collector = Collector(venv, algo, seed=0)
    reported = []
    while algo.updates < updates:
        progress = collector.run(7 * venv.num_envs)
        reported.append((progress.env_steps, progress.episode_returns, progress.episode_lengths))
        reported.append(sorted(progress.agent_returns.items()))
    venv.close()
    nets = {
        f"{g}/{name}": value.detach().cpu().double().clone()
        for g, nets in algo.policy.nets.items()
        for name, value in nets.state_dict().items()
    }
    return nets, reported


RETURN_RTOL = 1e-12
"""How far apart two float64 returns of the same simple_spread episode may lie when numpy
computes one and torch the other. A reward sums each landmark's distance to its nearest
agent, a square root; torch's ``sqrt`` on the CPU is not always numpy's correctly rounded
one (on an AMD EPYC with MKL, 1 ulp off for about 1 value in 70), so a reward may differ in
its last bit. An agent's return adds 25 rewards of 3 such distances each, all of one sign:
about 100 terms and roundings, each at most an ulp (2.2e-16) apart, a relative bound of
2.2e-14 (measured: at most 6e-16 over 7,680 episodes). The bound leaves room for the
rewards' last bits reaching the networks and, through them, later actions."""


def assert_same_episodes(got: list, want: list) -> None:
    """The same episodes reported in the same order (what each ``run`` of :func:`trained`
    reported): steps, lengths and agents equal, returns within :data:`RETURN_RTOL`."""
    assert len(got) == len(want)
    for ours, theirs in zip(got, want, strict=True):
        if isinstance(ours, tuple):  # (env steps, returns, lengths)
            assert (ours[0], ours[2]) == (theirs[0], theirs[2])
            np.testing.assert_allclose(ours[1], theirs[1], rtol=RETURN_RTOL, atol=0)
        else:  # [(agent, returns)], sorted by agent
            assert [agent for agent, _ in ours] == [agent for agent, _ in theirs]
            for (agent, mine), (_, other) in zip(ours, theirs, strict=True):
                np.testing.assert_allclose(mine, other, rtol=RETURN_RTOL, atol=0, err_msg=agent)


CASES = [
    (MAPPO, {}, {}),
    (IPPO, {}, {}),
    (MAPPO, {"bootstrap_truncated": True}, {}),
    (MAPPO, {}, {"continuous_actions": True}),
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(
    ("algo_cls", "settings", "env_kwargs"),
    CASES,
    ids=["mappo", "ippo", "bootstrap", "continuous"],
)
def test_torch_batches_train_the_networks_numpy_batches_train(
    algo_cls, settings, env_kwargs, device
):
    on_numpy, numpy_reports = trained("numpy", "cpu", algo_cls, env_kwargs=env_kwargs, **settings)
    on_torch, torch_reports = trained("torch", device, algo_cls, env_kwargs=env_kwargs, **settings)
    initial, _ = trained("numpy", "cpu", algo_cls, 0, env_kwargs=env_kwargs, **settings)
    assert on_numpy.keys() == on_torch.keys()
    assert max(float((on_numpy[k] - initial[k]).abs().max()) for k in on_numpy) > 1e-3
    tolerance = 1e-6 if device == "cpu" else 1e-3
    assert max(float((on_numpy[k] - on_torch[k]).abs().max()) for k in on_numpy) < tolerance
    if device == "cpu":  # the same episodes, reported in the same order
        assert_same_episodes(torch_reports, numpy_reports)


@pytest.mark.parametrize("device", DEVICES)
def test_torch_batches_get_actions_and_extras_on_their_device(device):
    venv, algo, _ = torch_collector(MAPPO, device)
    batch = venv.reset(seed=0)
    actions, extras = algo.policy.act(batch, decisions=DecisionCounter().index(batch))
    for value in [*actions.values(), *(v for per in extras.values() for v in per.values())]:
        assert isinstance(value, torch.Tensor) and value.device.type == device
    venv.close()


def test_self_play_refuses_torch_batches():
    venv = corral.make_vec("pettingzoo/classic/tictactoe_v3", 2, array="torch", seed=0)
    algo = MAPPO(venv, MAPPO.Config(self_play=True, seed=0))
    pool = self_play(venv, algo)["fixed"][OPPONENT].policy
    with pytest.raises(ValueError, match="self_play plays numpy batches only"):
        pool.act(venv.reset(seed=0))
    venv.close()


def test_the_runner_checks_actions_on_a_device_without_reading_them_back(tmp_path):
    from corral.training import Runner, load_config

    for device_path in (False, True):
        settings = run_settings(tmp_path, str(device_path), array="torch", rollout_steps=10)
        config = load_config("mappo", "mpe2/simple_spread_v3", settings)
        with (
            corral.device_path() if device_path else contextlib.nullcontext(),
            Runner(config, progress=False) as runner,
        ):
            assert (runner.venv._deferred is not None) == device_path
            assert runner.venv.deferred_checks == device_path


def test_closing_the_runner_closes_everything_then_raises_a_pending_bad_action(
    tmp_path, as_on_a_gpu
):
    from corral.errors import VectorStateError
    from corral.training import Runner, load_config

    settings = run_settings(tmp_path, "run", array="torch", rollout_steps=10, eval_every=120)
    runner = Runner(load_config("mappo", "mpe2/simple_spread_v3", settings), progress=False)
    runner.evaluate(1)  # builds the evaluation envs
    runner.venv.step({"agent": torch.full((4, 3), 9)})  # out of range, found on the device
    with pytest.raises(InvalidActionError, match=r"env 0, agent 'agent_0'.*in step 1 of the 1"):
        runner.close()
    for venv in (runner.eval_venv, runner.venv):
        with pytest.raises(VectorStateError, match="closed"):
            venv.reset()


def test_the_runner_trains_on_torch_batches_as_on_numpy(tmp_path):
    from corral.training import Runner, load_config

    results = {}
    for array in ("numpy", "torch"):
        config = load_config(
            "mappo",
            "mpe2/simple_spread_v3",
            run_settings(tmp_path, array, array=array, rollout_steps=10),
        )
        with Runner(config, progress=False) as runner:
            batch = runner.collector.batch
            assert isinstance(batch.done, torch.Tensor) == (array == "torch")
            results[array] = runner.train()
            assert runner.eval_venv is None or not runner.eval_venv.place.is_torch
    columns = ("env_steps", "train_episodes")
    rows = {a: [{c: r.get(c) for c in columns} for r in res.metrics] for a, res in results.items()}
    assert rows["torch"] == rows["numpy"]
    # returns summed from rewards that numpy and torch round apart (see RETURN_RTOL); the
    # evaluations play numpy envs in both, with networks trained on those rewards
    for column in ("train_return", "eval_return"):
        want, got = ([r.get(column, np.nan) for r in res.metrics] for res in results.values())
        assert not np.isnan(got).all(), column
        np.testing.assert_allclose(got, want, rtol=RETURN_RTOL, atol=0, err_msg=column)


@pytest.mark.parametrize(
    ("algo", "settings", "message"),
    [
        ("mappo", {"self_play": True}, "self_play plays on numpy batches only"),
        ("dqn", {"self_play": True}, "self_play plays on numpy batches only"),
    ],
)
def test_the_runner_refuses_torch_batches_where_they_cannot_train(
    tmp_path, algo, settings, message
):
    from corral.training import ConfigError, Runner, load_config

    env = "pettingzoo/classic/tictactoe_v3" if settings else "mpe2/simple_spread_v3"
    with pytest.raises(ConfigError, match=message):
        config = load_config(algo, env, run_settings(tmp_path, algo, array="torch", **settings))
        Runner(config, progress=False)


def test_fixed_policies_of_groups_not_learned_play_torch_batches_as_numpy_ones(tmp_path):
    # corral/tag learning the predators: the prey plays random legal actions (a FixedPolicy,
    # numpy by contract) drawn from the same generator on both
    from corral.training import Runner, load_config

    results, placed = {}, {}
    for array in ("numpy", "torch"):
        settings = run_settings(
            tmp_path, array, array=array, rollout_steps=10, learn_groups=["predator"]
        )
        settings = {k: v for k, v in settings.items() if k != "dtype"}  # an MPE setting
        config = load_config("mappo", "corral/tag", {**settings, "total_steps": 480})
        with Runner(config, progress=False) as runner:
            actions, _ = runner.collector.actions(runner.collector.batch, explore=True)
            placed[array] = type(actions["prey"])
            results[array] = runner.train()
    assert placed == {"numpy": np.ndarray, "torch": torch.Tensor}
    columns = ("env_steps", "train_return", "train_episodes")
    rows = {a: [{c: r.get(c) for c in columns} for r in res.metrics] for a, res in results.items()}
    assert rows["torch"] == rows["numpy"] and len(rows["numpy"]) == 4


@pytest.mark.parametrize(
    ("settings", "expected"),
    [
        ({}, "torch"),  # natively batched, sync, on the GPU: the whole loop there
        ({"array": "numpy"}, "numpy"),  # said so
        ({"native": False}, "numpy"),  # dict envs step on the host
        ({"backend": "subproc"}, "numpy"),  # shards share host memory
        ({"env": "corral/rps"}, "numpy"),  # no natively batched implementation
    ],
)
def test_on_a_gpu_a_native_run_plays_torch_batches_unless_told(settings, expected, monkeypatch):
    from corral.training import runner as runner_module
    from corral.training.config import RunConfig

    monkeypatch.setattr(runner_module, "_device", lambda device: device)  # no GPU needed
    run = RunConfig(**{"env": "mpe2/simple_spread_v3", "device": "cuda", **settings})
    assert runner_module.training_array(run) == expected
    assert runner_module.training_array(RunConfig(**{**settings, "device": "cpu"})) == (
        settings.get("array", "numpy")
    )
