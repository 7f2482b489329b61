"""Recurrent DQN, VDN and QMIX: memories while acting, the sequence replay, chunked learning."""

from __future__ import annotations

import os
import time
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from support.runs import Killed, kill_after_checkpoint, train, without_time  # noqa: E402
from support.runs import config as run_config  # noqa: E402

import corral  # noqa: E402
from corral.algos.dqn import DQN, Config, masked_huber  # noqa: E402
from corral.algos.value_decomposition import QMIX, VDN  # noqa: E402
from corral.data.sequence_replay import SequenceReplay  # noqa: E402
from corral.errors import ConfigError, UnsupportedEnvError  # noqa: E402
from corral.training import Runner  # noqa: E402
from corral.training import checkpoint as ckpt  # noqa: E402
from corral.training.collector import Collector, evaluate  # noqa: E402
from corral.training.runner import LATEST  # noqa: E402

torch.set_num_threads(1)

SETTINGS = {"recurrent": True, "rnn_hidden": 8, "hidden": (16,), "batch_size": 8, "bptt": 4}
RNN = Config(**SETTINGS)
G = "agent"


def test_dqn_memory_resets_at_each_episode_and_holds_where_the_agent_waits() -> None:
    """On the turn-based memory env, the extra ``hidden`` of each step is the state the agent's
    net reached over its own earlier decisions of the episode, stepped agent by agent."""
    venv = corral.make_vec("corral/memory-turns", 3, seed=0, env_kwargs={"delay": 1})
    policy = DQN(venv, RNN).policy
    net = policy.q[G]
    batch = venv.reset(seed=0)
    h = torch.zeros(3, 2, 8)
    waited = reset = 0
    for _ in range(20):
        actions, extras = policy.act(batch)
        expected = h.clone()
        for e in range(3):
            for i in range(2):
                if batch.decision[G][e, i] == 0:
                    expected[e, i] = 0
                    reset += 1
                elif not batch.acting[G][e, i]:
                    waited += 1
        np.testing.assert_allclose(extras["hidden"][G], expected.numpy(), atol=1e-6)
        with torch.no_grad():
            _, new = net.step(policy.q_input(G, batch.obs[G]), expected)
        acting = torch.as_tensor(batch.acting[G])[..., None]
        h = torch.where(acting, new, expected)
        batch = venv.step(actions)
    assert reset > 6 and waited > 6  # both cases were seen


def test_chunks_never_cross_an_episode_and_start_from_the_stored_state() -> None:
    """Stream 0: an episode of 3 decisions then one of 2; stream 1: one of 4 whose oldest row
    is overwritten (3 rows per stream); chunks of 3 from every start row."""
    replay = SequenceReplay(capacity=6, streams=2, seed=0)
    decision = np.array([[0, 0], [1, 1], [2, 2], [0, 3], [1, 0]])
    keep = np.array([[1, 1], [1, 1], [1, 1], [1, 1], [1, 0]], dtype=bool)
    ident = np.arange(10).reshape(5, 2)  # row t of stream s: 2 * t + s
    hidden = np.stack([ident, -ident], -1).astype(np.float32)
    replay.add({"decision": decision, "id": ident, "hidden": hidden}, keep)
    assert len(replay) == 6
    chunks = replay.sample(200, 3)
    starts = {}
    for c in range(200):
        ids = chunks["id"][c][chunks["valid"][c]].tolist()
        starts[ids[0]] = ids
        np.testing.assert_array_equal(chunks["hidden"][c, 0], [ids[0], -ids[0]])
    # stream 0 keeps its rows 2..4 (ids 4, 6, 8), stream 1 its rows 1..3 (ids 3, 5, 7)
    assert starts == {4: [4], 6: [6, 8], 8: [8], 3: [3, 5, 7], 5: [5, 7], 7: [7]}


def test_sequence_replay_round_trips_and_names_bad_rows() -> None:
    replay = SequenceReplay(capacity=8, streams=2, seed=3)
    rows = {"decision": np.zeros((2, 2), np.int64), "x": np.ones((2, 2, 3), np.float32)}
    replay.add(rows, np.ones((2, 2), bool))
    other = SequenceReplay(capacity=8, streams=2, seed=5)
    other.load_state_dict(replay.state_dict())
    for a, b in zip(replay.sample(4, 2).values(), other.sample(4, 2).values(), strict=True):
        torch.testing.assert_close(a, b)
    with pytest.raises(ValueError, match="'decision'"):
        replay.add({"x": rows["x"]}, np.ones((2, 2), bool))
    with pytest.raises(ValueError, match=r"\[T, streams=2\]"):
        replay.add(rows, np.ones((2, 3), bool))
    with pytest.raises(ValueError, match="3 streams"):
        SequenceReplay(capacity=9, streams=3).load_state_dict(replay.state_dict())


def _collected(cls: type, env_id: str, bptt: int, **env_kwargs):
    """A recurrent learner whose replay holds 64 env steps of 4 envs, none learned from."""
    venv = corral.make_vec(env_id, 4, seed=0, state=True, env_kwargs=env_kwargs)
    algo = cls(venv, cls.Config(**{**SETTINGS, "bptt": bptt, "learning_starts": 10_000}))
    Collector(venv, algo, seed=0).run(256)
    return algo


def _reference_loss(algo, t) -> torch.Tensor:
    """The DQN loss of chunks ``t`` row by row: each row's Q values from its own stored
    hidden state (what acting saw), the next observation's from the state that row left."""
    policy = algo.policy
    net, target = policy.q[G], algo.target[G]
    x, next_x = policy.q_input(G, t["obs"]), policy.q_input(G, t["next_obs"])
    h = t["hidden"]
    q, new = net.step(x, h)
    next_q, _ = net.step(next_x, new)
    _, new_target = target.step(x, h)
    next_target, _ = target.step(next_x, new_target)
    from corral.algos.dqn import double_q_target

    goal = double_q_target(
        t["reward"].float(), t["terminated"], next_q, next_target, t["next_action_mask"], 0.99
    )
    taken = q.gather(-1, t["action"].long()[..., None]).squeeze(-1)
    return masked_huber(taken, goal, t["valid"], algo.config.huber_delta)


@pytest.mark.parametrize("bptt", [2, 8])
def test_chunked_loss_equals_the_row_by_row_one_from_the_stored_states(bptt: int) -> None:
    """Episodes of 4 decisions: chunks of 8 hold whole episodes (from a zero state), chunks
    of 2 start mid-episode from the stored state; either way the unrolled loss is the one
    read row by row from the states acting stored (no weights changed since)."""
    algo = _collected(DQN, "corral/memory", bptt, delay=2)
    t = algo.buffer[G].sample(32, bptt)
    whole = t["valid"].all(-1) & (t["decision"][:, 0] == 0)
    if bptt == 8:
        assert t["valid"].sum(-1).max() == 4 and whole.sum() == 0  # episodes end within
        assert (t["valid"].sum(-1) == 4).any()
    loss, _ = algo.sequence_loss(G, t)
    torch.testing.assert_close(loss, _reference_loss(algo, t))


def test_vdn_chunks_hold_the_team_s_steps_and_give_finite_losses() -> None:
    algo = _collected(VDN, "corral/memory", 8, delay=2)
    t = algo.buffer[G].sample(16, 8)
    assert t["hidden"].shape == (16, 8, 2, 8) and t["valid"].sum(-1).max() == 4
    loss, q_tot = algo.sequence_loss(G, t)
    assert torch.isfinite(loss) and q_tot.shape == (16, 8)


@pytest.mark.parametrize(
    ("cls", "env_id"),
    [(DQN, "corral/memory-turns"), (VDN, "corral/memory"), (QMIX, "corral/memory")],
)
def test_recurrent_q_learners_update_with_finite_losses(cls: type, env_id: str) -> None:
    venv = corral.make_vec(env_id, 4, seed=0, state=True)
    algo = cls(venv, cls.Config(**{**SETTINGS, "learning_starts": 40}))
    progress = Collector(venv, algo, seed=0).run(200)
    losses = [row[f"loss/{G}"] for row in progress.updates if f"loss/{G}" in row]
    assert len(losses) > 10 and np.isfinite(losses).all()
    assert "core.gru.weight_hh" in algo.state_dict()["q"][G]
    returns = evaluate(venv, algo, 8, seed=3).episode_returns
    assert len(returns) == 8


def test_bad_recurrent_q_settings_and_batches_are_named() -> None:
    with pytest.raises(ConfigError, match="at least one hidden layer"):
        Config(recurrent=True, hidden=())
    venv = corral.make_vec("corral/memory", 2, seed=0)
    batch = venv.reset(seed=0)
    batch.decision = None
    with pytest.raises(ValueError, match=r"Batch\.decision"):
        DQN(venv, RNN).policy.act(batch)
    # the agents of corral/memory act together (VDN takes it), those of memory-turns do not
    with pytest.raises(UnsupportedEnvError, match="lockstep=False"):
        VDN(corral.make_vec("corral/memory-turns", 2, seed=0), VDN.Config(**SETTINGS))


@pytest.mark.parametrize("algo", ["dqn", "vdn"])
def test_a_resumed_recurrent_q_run_equals_an_uninterrupted_one(
    algo: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The GRU, its optimiser, target and sequence replay come back (a one-step game has no
    memory in flight at a checkpoint)."""
    settings = {"algo": algo, "recurrent": True, "learning_starts": 40, "batch_size": 8}
    whole = train(run_config(tmp_path, "whole", env="mdp/climbing", **settings))
    with monkeypatch.context() as patch:
        kill_after_checkpoint(patch, 160)
        with pytest.raises(Killed):
            train(run_config(tmp_path, "killed", env="mdp/climbing", **settings))
    assert ckpt.load(tmp_path / "killed" / LATEST)["env_steps"] == 160
    with Runner.resume(tmp_path / "killed", progress=False) as runner:
        resumed = runner.train()
    assert without_time(resumed.metrics) == without_time(whole.metrics)


# -- the memory env: only a learner with memory solves it -----------------------------------


def success(cls: type, recurrent: bool, env_steps: int, **env_kwargs) -> float:
    """Greedy success rate (the mean return) over 400 episodes after ``env_steps``."""
    venv = corral.make_vec("corral/memory", 8, seed=0, state=True, env_kwargs=env_kwargs)
    config = cls.Config(
        recurrent=recurrent,
        rnn_hidden=32,
        hidden=(64,),
        lr=1e-3,
        batch_size=32,
        bptt=8,
        train_freq=8,
        target_update_interval=100,
        epsilon_decay_steps=env_steps // 2,
    )
    algo = cls(venv, config)
    Collector(venv, algo, seed=0).run(env_steps)
    return float(np.mean(evaluate(venv, algo, 400, seed=1000).episode_returns))


@pytest.mark.skipif(os.environ.get("CI") == "true", reason="slow learning runs")
@pytest.mark.parametrize(("cls", "env_steps"), [(DQN, 20_000), (VDN, 20_000), (QMIX, 40_000)])
def test_recurrent_q_learners_solve_the_memory_env_and_the_mlp_stays_at_chance(
    cls, env_steps: int
) -> None:
    """Four cues, three blank decisions: chance is 0.25; 400 episodes put the MLP's success
    within 0.07 of it (over 3 standard errors). QMIX, whose mixer learns too, takes twice the
    env steps (0.75 at 20k, 1.00 at 40k)."""
    start = time.perf_counter()
    recurrent = success(cls, True, env_steps, num_cues=4)
    mlp = success(cls, False, 20_000, num_cues=4)
    took = time.perf_counter() - start
    print(f"{cls.__name__}: {recurrent:.2f} / {mlp:.2f} in {took:.0f} s")  # with pytest -s
    assert recurrent >= 0.95
    assert abs(mlp - 0.25) <= 0.07
