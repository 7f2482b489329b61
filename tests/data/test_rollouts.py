"""Time-major rollouts and masked GAE, against the row-wise assembler and ``gae`` (the oracle)."""

from __future__ import annotations

from collections import defaultdict
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from oracles.buffers import gae
from oracles.transitions import TransitionAssembler

from corral.data.rollouts import RolloutBuilder, masked_gae
from corral.vector import make_vec

GAMMA, LAM = 0.9, 0.8


class _Critic:
    """A fixed value function of an agent's observation and index (not learned)."""

    def __init__(self, venv, seed: int) -> None:
        rng = np.random.default_rng(seed)
        self.w = {
            g: rng.normal(size=int(np.prod(venv.observation_space(g).shape))) for g in venv.groups
        }

    def __call__(self, g: str, obs: np.ndarray, agent: np.ndarray) -> np.ndarray:
        flat = np.asarray(obs, dtype=np.float64).reshape(*np.shape(agent), -1)
        return flat @ self.w[g] + 0.25 * agent


def _torch_batch(batch):
    """``batch`` with every array as a torch tensor (same dtypes)."""

    def conv(x):
        return None if x is None else torch.as_tensor(np.asarray(x))

    per_group = ("obs", "reward", "terminated", "truncated", "acting", "alive", "action_mask")
    fields = {name: {g: conv(x) for g, x in getattr(batch, name).items()} for name in per_group}
    return SimpleNamespace(**fields, done=conv(batch.done), state=conv(batch.state))


def _per_group(values, as_torch):
    return {g: torch.as_tensor(v) if as_torch else v for g, v in values.items()}


def _run(env_id, num_envs, steps, rollouts, *, as_torch=False, seed=0, **env_kwargs):
    """Advantages and returns per (group, env, agent), decision by decision, from both paths."""
    venv = make_vec(env_id, num_envs, seed=seed, state=True, env_kwargs=env_kwargs)
    critic, rng = _Critic(venv, seed), np.random.default_rng(seed)
    agents = {
        g: np.broadcast_to(np.arange(len(a)), (num_envs, len(a))) for g, a in venv.groups.items()
    }
    assembler, builder = TransitionAssembler(venv), RolloutBuilder(venv, steps)
    old, new = defaultdict(list), defaultdict(list)
    batch = venv.reset(seed=seed)
    convert = _torch_batch if as_torch else (lambda b: b)
    counts = defaultdict(int)
    for _ in range(rollouts):
        rows = defaultdict(list)
        for _ in range(steps):
            actions = venv.sample_actions(batch, rng)
            value = {g: critic(g, batch.obs[g], agents[g]) for g in venv.groups}
            log_prob = {g: rng.normal(size=agents[g].shape) for g in venv.groups}  # an extra
            assembler.act(batch, actions, value=value, log_prob=log_prob)
            builder.act(
                convert(batch),
                _per_group(actions, as_torch),
                _per_group(value, as_torch),
                log_prob=_per_group(log_prob, as_torch),
            )
            batch = venv.step(actions)
            for g, t in assembler.observe(batch).items():
                rows[g].append(t)
            final = {}
            for g in venv.groups:
                done = batch.done.reshape(-1, *([1] * (batch.obs[g].ndim - 1)))
                final[g] = critic(g, np.where(done, batch.final_obs[g], batch.obs[g]), agents[g])
            builder.observe(convert(batch), final_value=_per_group(final, as_torch))
        next_value = {g: critic(g, batch.obs[g], agents[g]) for g in venv.groups}
        built = builder.finish(_per_group(next_value, as_torch))
        for g, chunks in rows.items():
            t = {name: np.concatenate([c[name] for c in chunks]) for name in chunks[0]}
            advantage, returns = gae(
                t, t["value"], critic(g, t["next_obs"], t["agent"]), GAMMA, LAM
            )
            for k in range(len(advantage)):
                key = g, int(t["env"][k]), int(t["agent"][k])
                fields = (t[f][k] for f in (*FIELDS, "state"))
                old[key].append(_decision(advantage[k], returns[k], *fields))
        for g, rollout in built.items():
            advantage, returns, complete = masked_gae(rollout, GAMMA, LAM)
            advantage, returns, complete = (np.asarray(x) for x in (advantage, returns, complete))
            fields = [np.asarray(getattr(rollout, f, rollout.extras.get(f))) for f in FIELDS]
            state, carried = np.asarray(rollout.state), np.asarray(rollout.carried)
            for step, e, i in np.argwhere(complete):
                at = step, e, i
                if step == 0 and carried[e, i]:  # decided in an earlier rollout
                    at_state = np.asarray(rollout.carried_state)[e, i]
                else:
                    at_state = state[step, e]
                new[g, int(e), int(i)].append(
                    _decision(advantage[at], returns[at], *(x[at] for x in fields), at_state)
                )
                counts[g] += 1
            counts["carried"] += int(np.asarray(rollout.carried).sum())
    venv.close()
    return old, new, counts


FIELDS = ("action", "log_prob", "value", "obs")
"""What each decision carries besides its advantage and return (and state), compared too."""


def _decision(*parts) -> np.ndarray:
    return np.concatenate([np.asarray(p, dtype=np.float64).reshape(-1) for p in parts])


def _assert_same(old, new) -> int:
    assert old.keys() == new.keys()
    decisions = 0
    for key in old:
        a, b = np.array(old[key]), np.array(new[key])
        assert a.shape == b.shape, f"{key}: {len(a)} decisions in the oracle, {len(b)} here"
        np.testing.assert_allclose(b, a, rtol=0, atol=1e-10, err_msg=str(key))
        decisions += len(a)
    return decisions


CASES = [
    # turn-based: the first mover's reward arrives with the second's move; 5 steps per
    # rollout cut decisions across rollouts (carried)
    ("corral/rps", 4, 5, 4, {"num_rounds": 3}),
    ("corral/rps4", 4, 5, 4, {"num_cycles": 2}),  # asynchronous: idle agents
    ("corral/tag", 6, 16, 3, {"max_cycles": 20}),  # dying agents
    ("mpe2/simple_spread_v3", 4, 32, 2, {}),  # truncated at 25 steps: bootstrap
    ("mdp/multi_round_nmdp", 8, 7, 3, {}),  # terminations at varying steps
    ("mdp/climbing", 3, 4, 2, {}),
]


@pytest.mark.parametrize("as_torch", [False, True], ids=["numpy", "torch"])
@pytest.mark.parametrize(("env_id", "num_envs", "steps", "rollouts", "kwargs"), CASES)
def test_masked_gae_matches_the_assembler_and_gae(
    env_id, num_envs, steps, rollouts, kwargs, as_torch
):
    old, new, _ = _run(env_id, num_envs, steps, rollouts, as_torch=as_torch, **kwargs)
    assert _assert_same(old, new) > 0


def test_decisions_cut_by_the_rollout_end_are_carried() -> None:
    """In turn-based rps a rollout of odd length leaves the next mover's decision open."""
    _, _, counts = _run("corral/rps", 2, 3, 3, num_rounds=3)
    assert counts["carried"] > 0


def test_reset_forgets_open_decisions() -> None:
    venv = make_vec("corral/rps", 2, seed=0)
    builder, rng = RolloutBuilder(venv, 3), np.random.default_rng(0)
    zeros = {"player": np.zeros((2, 2))}

    def rollout(batch):
        for _ in range(3):
            actions = venv.sample_actions(batch, rng)
            builder.act(batch, actions, zeros)
            batch = venv.step(actions)
            builder.observe(batch)
        return batch, builder.finish(zeros)["player"]

    batch, _ = rollout(venv.reset())
    batch, second = rollout(batch)
    assert second.carried.any()  # three moves of turn-based rps leave one open
    builder.act(batch, venv.sample_actions(batch, rng), zeros)
    builder.reset()  # also drops the partly recorded step
    _, after_reset = rollout(venv.reset())
    assert not after_reset.carried.any()
    venv.close()


def test_rewards_between_decisions_and_bootstraps_by_hand() -> None:
    """One env, one agent: decisions at 0 and 2, a truncation at 3, a decision at 4 left open."""
    acting = np.array([1, 0, 1, 0, 1], bool)[:, None, None]
    reward = np.array([1.0, 2.0, 3.0, 4.0, 5.0])[:, None, None]
    value = np.array([10.0, 0.0, 20.0, 0.0, 30.0])[:, None, None]
    truncated = np.array([0, 0, 0, 1, 0], bool)[:, None, None]
    final_value = np.array([0, 0, 0, 7.0, 0])[:, None, None]
    rollout = SimpleNamespace(
        acting=acting,
        reward=reward,
        value=value,
        terminated=np.zeros_like(truncated),
        truncated=truncated,
        final_value=final_value,
        next_value=np.array([[40.0]]),
        next_acting=np.array([[False]]),
        steps=5,
    )
    advantage, returns, complete = masked_gae(rollout, 0.5, 0.5)
    later = 3 + 4 + 0.5 * 7 - 20  # decision 2: rewards of steps 2-3, bootstraps step 3's end
    first = 1 + 2 + 0.5 * 20 - 10 + 0.25 * later  # decision 0: steps 0-1, then decision 2
    assert complete[:, 0, 0].tolist() == [True, False, True, False, False]  # 4 stays open
    assert advantage[[0, 2], 0, 0].tolist() == [first, later]
    assert returns[0, 0, 0] == first + 10
    assert advantage[4, 0, 0] == 5 + 0.5 * 40 - 30  # open: bootstrapped, not learned from


def test_builder_rejects_a_value_of_the_wrong_shape() -> None:
    venv = make_vec("corral/rps", 2, seed=0)
    builder = RolloutBuilder(venv, 4)
    batch = venv.reset()
    actions = venv.sample_actions(batch, np.random.default_rng(0))
    with pytest.raises(ValueError, match=r"group 'player': value has shape \(2,\)"):
        builder.act(batch, actions, {"player": np.zeros(2)})
    venv.close()


def test_a_torch_native_env_rolls_out_in_torch() -> None:
    """Batches of a native torch env build torch rollouts, equal to those of the same numbers."""
    venv = make_vec("corral/tag", 3, seed=1, array="torch", env_kwargs={"max_cycles": 6})
    critic, rng = _Critic(venv, 1), np.random.default_rng(1)
    agents = {g: np.broadcast_to(np.arange(len(a)), (3, len(a))) for g, a in venv.groups.items()}
    on_torch, on_numpy = RolloutBuilder(venv, 8), RolloutBuilder(venv, 8)

    def as_numpy(batch):
        per_group = ("obs", "reward", "terminated", "truncated", "acting", "alive", "action_mask")
        fields = {
            name: {g: x.numpy() for g, x in getattr(batch, name).items()} for name in per_group
        }
        return SimpleNamespace(**fields, done=batch.done.numpy(), state=None)

    def values(obs):
        return {g: critic(g, obs[g].numpy(), agents[g]) for g in venv.groups}

    batch = venv.reset()
    for _ in range(8):
        actions = venv.sample_actions(batch, rng)
        value = values(batch.obs)
        on_torch.act(batch, actions, _per_group(value, True))
        on_numpy.act(as_numpy(batch), {g: a.numpy() for g, a in actions.items()}, value)
        batch = venv.step(actions)
        on_torch.observe(batch)
        on_numpy.observe(as_numpy(batch))
    next_value = values(batch.obs)
    got, want = on_torch.finish(_per_group(next_value, True)), on_numpy.finish(next_value)
    venv.close()
    for g in venv.groups:
        assert isinstance(got[g].obs, torch.Tensor) and isinstance(got[g].reward, torch.Tensor)
        for a, b in zip(
            masked_gae(got[g], GAMMA, LAM), masked_gae(want[g], GAMMA, LAM), strict=True
        ):
            assert isinstance(a, torch.Tensor)
            np.testing.assert_allclose(a.numpy(), b, rtol=0, atol=1e-12)
    assert want["prey"].terminated.any()  # prey were caught: dying agents
    assert want["predator"].truncated.any()  # episodes ended at max_cycles


@pytest.mark.parametrize("array", ["numpy", "torch"])
def test_each_decision_keeps_its_index_from_the_batch_it_was_made_at(array: str) -> None:
    """``Rollout.decision`` holds ``Batch.decision`` where the agent acted, and a decision
    carried into the next rollout keeps the index it was made at."""
    venv = make_vec("corral/rps", 2, seed=0, array=array, env_kwargs={"num_rounds": 3})
    builder, rng = RolloutBuilder(venv, 3), np.random.default_rng(0)
    made_at = np.zeros((2, 2), np.int64)  # the index of each agent's last decision
    batch, checked, carried = venv.reset(seed=0), 0, 0
    for _ in range(5):
        indices = []
        for _ in range(3):
            actions = venv.sample_actions(batch, rng)
            builder.act(batch, actions)
            indices.append(np.asarray(batch.decision["player"]).copy())
            batch = venv.step(actions)
            builder.observe(batch)
        rollout = builder.finish()["player"]
        decision, acting = np.asarray(rollout.decision), np.asarray(rollout.acting)
        was_carried = np.asarray(rollout.carried)
        np.testing.assert_array_equal(decision[0][was_carried], made_at[was_carried])
        carried += int(was_carried.sum())
        for t, index in enumerate(indices):
            made = acting[t] & ~(was_carried if t == 0 else False)
            np.testing.assert_array_equal(decision[t][made], index[made], f"step {t}")
            checked += int(made.sum())
            made_at = np.where(made, index, made_at)
    assert carried and checked and made_at.max() >= 1
    venv.close()


def _rollouts_of(env_id, envs, steps, actions_of, seed):
    """The second rollout (``record_next``; decisions carried into it) of ``envs`` envs
    seeded from ``seed``, acting ``actions_of(t)`` (rows of those envs), valued by a function
    of the observations."""
    venv = make_vec(env_id, envs, seed=seed, state=True)
    builder = RolloutBuilder(venv, steps, record_next=True)
    batch = venv.reset(seed=seed)

    def value(b):
        return {
            g: np.asarray(o, dtype=np.float32).reshape(*o.shape[:2], -1).sum(-1)
            for g, o in b.obs.items()
        }

    for t in range(2 * steps):
        if t == steps:
            builder.finish(value(batch))
        actions = actions_of(t)
        builder.act(
            batch, actions, value(batch), log_prob={g: v * 0.5 for g, v in value(batch).items()}
        )
        batch = venv.step(actions)
        builder.observe(batch, final_value=value(batch))
    rollouts = builder.finish(value(batch))
    venv.close()
    return rollouts


def test_rollouts_of_parts_of_the_envs_joined_are_the_rollout_of_all() -> None:
    """A turn-based game (decisions carried over, states), two halves of four envs."""
    pytest.importorskip("pettingzoo")
    from corral.arrays.tree import map_tree
    from corral.data.rollouts import Rollout, concat_envs

    env_id, steps = "pettingzoo/classic/connect_four_v3", 5
    whole = make_vec(env_id, 4, seed=0)
    rng, batch, moves = np.random.default_rng(0), whole.reset(seed=0), []
    for _ in range(2 * steps):
        moves.append(whole.sample_actions(batch, rng))
        batch = whole.step(moves[-1])
    whole.close()

    def rows(lo, hi):
        return lambda t: {g: a[lo:hi] for g, a in moves[t].items()}

    want = _rollouts_of(env_id, 4, steps, rows(0, 4), seed=0)
    first, second = (_rollouts_of(env_id, 2, steps, rows(i, i + 2), seed=i) for i in (0, 2))
    for g in want:
        got = concat_envs([first[g], second[g]])
        assert np.asarray(want[g].carried).any()  # the per-env fields are exercised
        for name in Rollout.__dataclass_fields__:
            a, b = getattr(got, name), getattr(want[g], name)
            if isinstance(b, dict) and name in ("extras", "next"):
                assert a.keys() == b.keys()
                for key in b:
                    map_tree(np.testing.assert_array_equal, a[key], b[key])
            elif b is None:
                assert a is None, name
            else:
                map_tree(np.testing.assert_array_equal, a, b)
        for x, y in zip(masked_gae(got, GAMMA, LAM), masked_gae(want[g], GAMMA, LAM), strict=True):
            np.testing.assert_array_equal(x, y)
    with pytest.raises(ValueError, match="at least one"):
        concat_envs([])


def test_a_part_that_carried_no_decision_joins_one_that_did() -> None:
    """A rollout worker whose envs just started (a replacement) carried no decision over:
    its ``carried_state`` is ``None`` while the others' is not; joined, its rows are zeros,
    masked by its ``carried`` (all false)."""
    pytest.importorskip("pettingzoo")
    import dataclasses

    from corral.data.rollouts import concat_envs

    env_id, steps = "pettingzoo/classic/connect_four_v3", 5
    venv = make_vec(env_id, 4, seed=0)
    rng, batch, moves = np.random.default_rng(0), venv.reset(seed=0), []
    for _ in range(2 * steps):
        moves.append(venv.sample_actions(batch, rng))
        batch = venv.step(moves[-1])
    venv.close()
    whole = _rollouts_of(env_id, 4, steps, lambda t: moves[t], seed=0)
    for played in whole.values():
        carried = np.asarray(played.carried)
        assert carried.any()
        # a carried decision's env state (connect four has none: one of 3 numbers per env)
        states = np.arange(4 * 3, dtype=np.float32).reshape(4, 3) + 1
        rollout = dataclasses.replace(played, carried_state=states)
        fresh = dataclasses.replace(
            rollout, carried=np.zeros_like(rollout.carried), carried_state=None
        )
        for parts, rows in (([rollout, fresh], slice(4, 8)), ([fresh, rollout], slice(0, 4))):
            got = concat_envs(parts)
            assert got.carried_state.shape[0] == 8
            np.testing.assert_array_equal(got.carried_state[rows], 0)
            kept = slice(0, 4) if rows.start else slice(4, 8)
            np.testing.assert_array_equal(got.carried_state[kept], rollout.carried_state)
        assert concat_envs([fresh, fresh]).carried_state is None
