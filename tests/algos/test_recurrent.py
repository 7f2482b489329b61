"""Recurrent MAPPO/IPPO: per-agent memory while acting, truncated BPTT, and the memory env."""

from __future__ import annotations

import copy
import os
import time
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from support.learners import textbook_metrics, textbook_step  # noqa: E402
from support.runs import Killed, kill_after_checkpoint, train, without_time  # noqa: E402
from support.runs import config as run_config  # noqa: E402

import corral  # noqa: E402
from corral.algos.mappo import IPPO, MAPPO, Config, actor_loss, critic_loss  # noqa: E402
from corral.algos.recurrent import chunk_rows  # noqa: E402
from corral.data.rollouts import RolloutBuilder, masked_gae  # noqa: E402
from corral.errors import ConfigError  # noqa: E402
from corral.training import Runner  # noqa: E402
from corral.training import checkpoint as ckpt  # noqa: E402
from corral.training.collector import Collector, evaluate  # noqa: E402
from corral.training.runner import LATEST  # noqa: E402

torch.set_num_threads(1)

RNN = Config(recurrent=True, rnn_hidden=16, hidden=(32, 32), rollout_steps=8, epochs=2)
G = "agent"


def collect(venv, algo, steps: int):
    """One rollout of ``steps`` vector steps acted by ``algo``'s policy, and the batches."""
    builder = RolloutBuilder(venv, steps)
    batch = venv.reset(seed=0)
    batches = []
    for _ in range(steps):
        batches.append(batch)
        actions, extras = algo.policy.act(batch)
        value = extras.pop("value")
        builder.act(batch, actions, value, **extras)
        batch = venv.step(actions)
        builder.observe(batch, algo.policy.final_values(batch))
    return builder.finish(algo.policy.bootstrap_values(batch))[G], batches


def reference_hidden(algo, batches, core: str) -> list[np.ndarray]:
    """The hidden states ``[E, n, H]`` before each step's decisions, stepped agent by agent:
    zero at each agent's first decision of an episode, advanced only where it acts."""
    policy = algo.policy
    nets = policy.nets[G]
    net = getattr(nets, core)
    out = []
    h = None
    for batch in batches:
        obs = batch.obs[G]
        E, n = batch.acting[G].shape
        if h is None:
            h = torch.zeros(E, n, policy.config.rnn_hidden)
        if core == "actor_core":
            x = policy.actor_input(G, obs, None)
        else:
            x = policy.critic_input(G, obs, batch.state, batch.decision[G], None)
        before = h.clone()
        for e in range(E):
            for i in range(n):
                if batch.decision[G][e, i] == 0:
                    before[e, i] = 0
                if batch.acting[G][e, i]:
                    with torch.no_grad():
                        h[e, i] = net(x[e, i][None], before[e, i][None])[0]
                else:
                    h[e, i] = before[e, i]
        out.append(before.numpy())
    return out


@pytest.mark.parametrize("env_id", ["corral/memory-turns", "corral/memory"])
def test_stored_hidden_states_reset_at_each_episode_and_hold_where_the_agent_waits(
    env_id: str,
) -> None:
    venv = corral.make_vec(env_id, 3, seed=0, state=True, env_kwargs={"delay": 1})
    algo = MAPPO(venv, RNN)
    steps = 14  # two whole episodes of the turn-based variant (6 steps) and a part
    rollout, batches = collect(venv, algo, steps)
    for name, core in (("actor_hidden", "actor_core"), ("critic_hidden", "critic_core")):
        stored = rollout.extras[name]
        expected = reference_hidden(algo, batches, core)
        for t in range(steps):
            np.testing.assert_allclose(stored[t], expected[t], atol=1e-6, err_msg=f"{name} t={t}")
    acting, decision = rollout.acting, rollout.decision
    hidden = rollout.extras["actor_hidden"]
    assert (hidden[decision == 0] == 0).all()
    assert (np.abs(hidden[decision > 0]).sum(-1) > 0).all()
    if env_id == "corral/memory-turns":
        # across a step where an agent waited (within an episode), its state did not change
        waited = ~acting[:-1] & (decision[1:] > 0)
        assert waited.any()
        np.testing.assert_array_equal(hidden[1:][waited], hidden[:-1][waited])


def test_torch_batches_store_and_learn_from_the_same_hidden_states_as_numpy_ones() -> None:
    stored, metrics = [], []
    for array in ("numpy", "torch"):
        venv = corral.make_vec("corral/memory-turns", 3, seed=0, state=True, array=array)
        algo = MAPPO(venv, RNN.replace(bptt=3))
        rollout, _ = collect(venv, algo, 8)
        stored.append(np.asarray(rollout.extras["actor_hidden"]))
        metrics.append(algo.learn({G: rollout}))
    np.testing.assert_allclose(stored[0], stored[1], atol=1e-6)
    assert metrics[0] == pytest.approx(metrics[1], abs=1e-5)


def test_greedy_acting_keeps_a_memory_of_its_own() -> None:
    venv = corral.make_vec("corral/memory", 2, seed=0, state=True)
    policy = MAPPO(venv, RNN).policy
    batch = venv.reset(seed=0)
    policy.act(batch)
    batch = venv.step(policy.act(batch)[0])
    exploring = [h.clone() for h in policy.memory[True][G]]
    for _ in range(3):
        policy.act(batch, explore=False)
    assert all(h.equal(k) for h, k in zip(policy.memory[True][G], exploring, strict=True))
    assert set(policy.memory) == {True, False}


def full_sequence_features(algo, rollout, core: str, rows_at) -> torch.Tensor:
    """Each row's hidden state from an unroll of its agent's whole sequence in the rollout,
    from zero, reset where an episode starts (with gradients)."""
    policy = algo.policy
    net = getattr(policy.nets[G], core)
    T, E, n = rollout.acting.shape
    features = {}
    for e in range(E):
        for i in range(n):
            h = torch.zeros(1, policy.config.rnn_hidden)
            for t in range(T):
                if not rollout.acting[t, e, i]:
                    continue
                if rollout.decision[t, e, i] == 0:
                    h = torch.zeros_like(h)
                if core == "actor_core":
                    x = policy.actor_input(G, rollout.obs[t, e, i][None], np.array([i]))
                else:
                    x = policy.critic_input(
                        G,
                        rollout.obs[t, e, i][None],
                        rollout.state[t, e][None],
                        rollout.decision[t, e, i][None],
                        np.array([i]),
                    )
                h = net(x, h)
                features[t, e, i] = h[0]
    return torch.stack([features[tuple(int(k) for k in at)] for at in rows_at])


@pytest.mark.parametrize(("bptt", "equal"), [(16, True), (2, False)])
def test_chunked_bptt_gradient_equals_the_full_sequence_one_when_chunks_hold_episodes(
    bptt: int, equal: bool
) -> None:
    """Episodes of 4 decisions in rollouts of 8 steps: chunks of 16 hold whole episodes and
    give the full-sequence gradient; chunks of 2 give the same loss, another gradient."""
    venv = corral.make_vec("corral/memory", 4, seed=0, state=True, env_kwargs={"delay": 2})
    algo = MAPPO(venv, RNN.replace(bptt=bptt))
    rollout, _ = collect(venv, algo, 8)
    rows = algo.rollout_rows(G, rollout)
    inputs = algo.ppo_inputs(G, **rows)
    nets = algo.policy.nets[G]
    params = list(nets.parameters())

    loss, _ = algo.chunk_loss(G, inputs)
    chunked = torch.autograd.grad(loss, params, allow_unused=True)

    _, _, complete = masked_gae(rollout, algo.config.gamma, algo.config.gae_lambda)
    made = np.stack(np.nonzero(complete), axis=1)  # rows in rollout_rows' order
    chunks = inputs["chunks"]
    at = chunks.index[chunks.valid]
    actor = full_sequence_features(algo, rollout, "actor_core", made[at.numpy()])
    critic = full_sequence_features(algo, rollout, "critic_core", made[at.numpy()])
    policy, _ = actor_loss(
        algo.config,
        nets.actor(actor, None),
        inputs["sample"][at],
        inputs["old_log_prob"][at],
        inputs["advantage"][at],
    )
    value = nets.critic(critic).squeeze(-1)
    value_part, _ = critic_loss(algo.config, value, inputs["target"][at], inputs["old_value"][at])
    reference = policy + value_part
    full = torch.autograd.grad(reference, params, allow_unused=True)
    torch.testing.assert_close(loss, reference)
    close = [
        torch.allclose(a, b, atol=1e-6, rtol=1e-5)
        for a, b in zip(chunked, full, strict=True)
        if a is not None
    ]
    assert all(close) if equal else not all(close)


def textbook_chunk_ppo(learner, inputs: dict) -> dict[str, float]:
    """Recurrent PPO epochs written plainly: each minibatch of chunks unrolled from its stored
    hidden states, one loss, the optimiser's ``zero_grad``, one backward pass and torch's
    ``clip_grad_norm_``; what :meth:`MAPPOLearner.ppo_chunks` must equal."""
    cfg, nets = learner.config, learner.policy.nets[G]
    chunks, optimizer, history = inputs["chunks"], learner.optimizers[G], []
    size = -(-len(chunks) // cfg.minibatches)
    for _ in range(cfg.epochs):
        for take in torch.randperm(len(chunks), generator=learner.policy.generator).split(size):
            index, valid, first = chunks.index[take], chunks.valid[take], chunks.first[take]
            at = index[valid]
            h_actor, h_critic = inputs["actor_hidden"][first], inputs["critic_hidden"][first]
            actor = nets.actor_core.unroll(inputs["actor_in"][index], h_actor)[valid]
            critic = nets.critic_core.unroll(inputs["critic_in"][index], h_critic)[valid]
            mask = inputs["mask"]
            dist = nets.actor(actor, None if mask is None else mask[at])
            value = nets.critic(critic).squeeze(-1)
            names = ("sample", "old_log_prob", "advantage", "target", "old_value")
            minibatch = {name: inputs[name][at] for name in names}
            params = nets.actor_parameters(), nets.critic_parameters()
            history.append(textbook_step(cfg, optimizer, dist, value, minibatch, *params))
    return textbook_metrics(history)


@pytest.mark.parametrize("helper", [False, True], ids=["one-thread", "critic-thread"])
def test_the_recurrent_update_gives_the_numbers_of_the_textbook_chunk_loop(
    helper: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Bit for bit, with the critic's half of each step in a thread of its own or not."""
    from support.learners import CountingExecutor, assert_same_state

    from corral.algos import mappo

    pool = CountingExecutor() if helper else None
    monkeypatch.setattr(mappo, "critic_helper", lambda device: pool)
    venv = corral.make_vec("corral/memory", 4, seed=0, state=True, env_kwargs={"delay": 2})
    algo = MAPPO(venv, RNN.replace(bptt=3, minibatches=2, max_grad_norm=0.05))  # clips
    rollout, _ = collect(venv, algo, 8)
    rows = algo.rollout_rows(G, rollout)
    twin = copy.deepcopy(algo)
    metrics = algo.ppo_chunks(G, **rows)
    assert pool is None or pool.submitted == ["MainThread"] * 2 * 2  # epochs x minibatches
    assert metrics == textbook_chunk_ppo(twin, twin.ppo_inputs(G, **rows))
    assert_same_state(algo.state_dict(), twin.state_dict(), G)


def test_chunks_hold_one_agent_s_consecutive_decisions_of_one_episode_up_to_bptt() -> None:
    # env 0 agent 0: decisions 0..4 at steps 0..4 (one episode), env 0 agent 1: an episode
    # ending at step 1 and another starting at step 2; rows given in (t, e, i) order
    step = np.array([0, 0, 1, 1, 2, 2, 3, 4])
    agent = np.array([0, 1, 0, 1, 0, 1, 0, 0])
    decision = np.array([0, 0, 1, 1, 2, 0, 3, 4])
    chunks = chunk_rows(step, np.zeros(8), agent, decision, agents=2, bptt=3, device="cpu")
    rows = [chunks.index[c][chunks.valid[c]].tolist() for c in range(len(chunks))]
    assert rows == [[0, 2, 4], [6, 7], [1, 3], [5]]
    assert chunks.first.tolist() == [0, 6, 1, 5]


def test_recurrent_mappo_and_ippo_update_with_finite_losses_on_the_turn_based_env() -> None:
    venv = corral.make_vec("corral/memory-turns", 4, seed=0, state=True)
    for cls in (MAPPO, IPPO):
        algo = cls(venv, RNN.replace(minibatches=3))
        progress = Collector(venv, algo, seed=0).run(4 * 8 * 3)
        assert len(progress.updates) == 3
        assert all(np.isfinite(v) for row in progress.updates for v in row.values())
        saved = algo.state_dict()["nets"][G]
        assert {"actor_core.gru.weight_ih", "critic_core.gru.weight_hh"} <= set(saved)


def test_bad_recurrent_settings_and_batches_are_named() -> None:
    with pytest.raises(ConfigError, match="at least one hidden layer"):
        Config(recurrent=True, hidden=())
    with pytest.raises(ConfigError, match="bptt"):
        Config(recurrent=True, bptt=0)
    venv = corral.make_vec("corral/memory", 2, seed=0, state=True)
    batch = venv.reset(seed=0)
    batch.decision = None
    with pytest.raises(ValueError, match=r"Batch\.decision"):
        MAPPO(venv, RNN).policy.act(batch)


def test_a_resumed_recurrent_run_equals_an_uninterrupted_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The GRUs and their optimiser state come back; memories restart at zero, as the resumed
    run's episodes do (a one-step game has none in flight at a checkpoint)."""
    settings = {"algo": "mappo", "recurrent": True, "rollout_steps": 4, "epochs": 1}
    whole = train(run_config(tmp_path, "whole", env="mdp/climbing", **settings))
    with monkeypatch.context() as patch:
        kill_after_checkpoint(patch, 160)
        with pytest.raises(Killed):
            train(run_config(tmp_path, "killed", env="mdp/climbing", **settings))
    assert ckpt.load(tmp_path / "killed" / LATEST)["env_steps"] == 160
    with Runner.resume(tmp_path / "killed", progress=False) as runner:
        resumed = runner.train()
    assert without_time(resumed.metrics) == without_time(whole.metrics)


# -- the memory env: only a policy with memory solves it ------------------------------------


def success(env_id: str, recurrent: bool, env_steps: int, **env_kwargs) -> float:
    """Greedy success rate (the mean return) over 400 episodes after ``env_steps``."""
    venv = corral.make_vec(env_id, 16, seed=0, state=True, env_kwargs=env_kwargs)
    algo = MAPPO(venv, Config(recurrent=recurrent, rollout_steps=32))
    Collector(venv, algo, seed=0).run(env_steps)
    return float(np.mean(evaluate(venv, algo, 400, seed=1000).episode_returns))


def test_recurrent_mappo_learns_to_remember_a_cue_over_one_blank_step() -> None:
    assert success("corral/memory", True, 6_000, delay=1, num_agents=1) >= 0.95


@pytest.mark.skipif(os.environ.get("CI") == "true", reason="slow learning run (~30 s each)")
@pytest.mark.parametrize("env_id", ["corral/memory", "corral/memory-turns"])
def test_recurrent_mappo_solves_the_memory_env_and_the_mlp_stays_at_chance(env_id) -> None:
    """Four cues, three blank decisions: chance is 0.25; 400 episodes put the MLP's
    success within 0.07 of it (over 3 standard errors)."""
    start = time.perf_counter()
    assert success(env_id, True, 40_000, num_cues=4) >= 0.95
    assert abs(success(env_id, False, 40_000, num_cues=4) - 0.25) <= 0.07
    print(f"{env_id}: {time.perf_counter() - start:.0f} s")  # shows with pytest -s
