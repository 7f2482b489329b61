"""Replay rows made from rollouts against the transition assembler's rows.

The off-policy learners write the complete decisions of each rollout
(:func:`corral.data.rollouts.decisions`) into their replay memory; the
:class:`~corral.data.transitions.TransitionAssembler` is the oracle. Over
many steps with autoresets, every agent's sequence of rows must be the
assembler's, every field equal, for rollouts of several lengths (1, 3 and 7,
which cut turn-based decisions), on NumPy and torch batches.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from oracles.transitions import TransitionAssembler

import corral
from corral.arrays import to_numpy
from corral.data.rollouts import RolloutBuilder, decision_rows, decisions
from corral.vector.sampling import sample_array

torch = pytest.importorskip("torch")

CASES = [
    ("corral/rps", {}),  # turn-based: the first mover's reward
    ("corral/rps4", {}),  # idle agents
    ("corral/tag", {}),  # dying agents
    ("pettingzoo/classic/tictactoe_v3", {}),  # turn-based with masks; self-play's learner
    ("mpe2/simple_spread_v3", {"native": True, "state": True}),  # truncation, final_obs, state
]
STEPS = 60
NUM_ENVS = 3


def as_torch(batch):
    """``batch`` with every array a torch tensor (the layout of ``array="torch"``)."""

    def convert(x):
        if isinstance(x, dict):
            return {k: convert(v) for k, v in x.items()}
        if isinstance(x, np.ndarray):
            return torch.as_tensor(x.copy())
        return x

    return dataclasses.replace(
        batch, **{f.name: convert(getattr(batch, f.name)) for f in dataclasses.fields(batch)}
    )


def rows_both_ways(env_id, settings, steps_per_rollout, array, seed=0, learner=False):
    """The assembler's rows and the rollouts' rows of ``STEPS`` random vector steps (with
    ``learner``, only the rows the random extra ``learner`` marks, as self-play's DQN keeps)."""
    venv = corral.make_vec(env_id, NUM_ENVS, seed=seed, **settings)
    rng = np.random.default_rng(seed)
    assembler = TransitionAssembler(venv)
    builder = RolloutBuilder(venv, steps_per_rollout, record_next=True)
    convert = as_torch if array == "torch" else (lambda b: b)
    oracle, ours = [], []
    batch = venv.reset(seed=seed)
    for t in range(STEPS):
        actions = {
            g: sample_array(
                venv.action_space(g), (NUM_ENVS, len(agents)), rng, batch.action_mask.get(g)
            )
            for g, agents in venv.groups.items()
        }
        marks = {g: rng.random((NUM_ENVS, len(a))) < 0.5 for g, a in venv.groups.items()}
        assembler.act(batch, actions, learner=marks)
        converted = convert(batch)
        builder.act(
            converted,
            {g: convert_array(a, array) for g, a in actions.items()},
            learner={g: convert_array(m, array) for g, m in marks.items()},
        )
        batch = venv.step(actions)
        oracle.append(assembler.observe(batch))
        builder.observe(convert(batch))
        if builder.full or t == STEPS - 1:
            finished = builder.finish().items()
            keep = {g: r.extras["learner"] if learner else None for g, r in finished}
            ours.append({g: decision_rows(r, keep=keep[g]) for g, r in finished})
    venv.close()
    return merge(oracle, venv.groups), merge(ours, venv.groups)


def convert_array(x, array):
    return torch.as_tensor(np.asarray(x).copy()) if array == "torch" else x


def merge(parts, groups):
    """Per group, the rows of ``parts`` concatenated, as NumPy, in each agent's order."""
    out = {}
    for g in groups:
        chunks = [p[g] for p in parts if g in p]
        rows = {k: np.concatenate([to_numpy(c[k]) for c in chunks]) for k in chunks[0]}
        order = np.lexsort((rows["agent"], rows["env"]))  # stable: each agent's rows in order
        out[g] = {k: v[order] for k, v in rows.items()}
    return out


def assert_same_rows(oracle, ours):
    assert oracle.keys() == ours.keys()
    for g in oracle:
        a, b = oracle[g], ours[g]
        assert sorted(a) == sorted(b), (g, sorted(a), sorted(b))
        assert len(a["reward"]) > 0
        for name in a:
            assert a[name].shape == b[name].shape, (g, name, a[name].shape, b[name].shape)
            assert np.array_equal(a[name], b[name]), (g, name)


ARRAYS = ["numpy", "torch"]


@pytest.mark.parametrize("array", ARRAYS)
@pytest.mark.parametrize("steps", [1, 3, 7])
@pytest.mark.parametrize(("env_id", "settings"), CASES, ids=[c[0] for c in CASES])
def test_rollout_rows_are_the_assemblers_transitions(env_id, settings, steps, array):
    oracle, ours = rows_both_ways(env_id, settings, steps, array)
    assert_same_rows(oracle, ours)


def test_the_cases_cover_what_they_are_for():
    # episodes end inside the window, truncations with final observations, carried decisions
    venv = corral.make_vec("mpe2/simple_spread_v3", NUM_ENVS, seed=0, native=True, state=True)
    oracle, _ = rows_both_ways("mpe2/simple_spread_v3", {"native": True, "state": True}, 7, "numpy")
    venv.close()
    spread = oracle["agent"]
    assert spread["truncated"].any() and not np.array_equal(spread["next_state"], spread["state"])
    ttt, _ = rows_both_ways("pettingzoo/classic/tictactoe_v3", {}, 1, "numpy")
    assert ttt["player"]["terminated"].any() and not ttt["player"]["next_acting"].all()
    tag, _ = rows_both_ways("corral/tag", {}, 3, "numpy")
    assert any(t["terminated"].any() for t in tag.values())


@pytest.mark.parametrize("array", ARRAYS)
def test_self_plays_learner_mask_keeps_exactly_the_learners_rows(array):
    oracle, ours = rows_both_ways("pettingzoo/classic/tictactoe_v3", {}, 3, array, learner=True)
    keep = oracle["player"].pop("learner")
    assert 0 < keep.sum() < len(keep)
    kept = {g: {k: v[keep] for k, v in rows.items()} for g, rows in oracle.items()}
    ours["player"].pop("learner")
    assert_same_rows(kept, ours)


def test_decisions_need_a_rollout_recorded_with_next():
    venv = corral.make_vec("corral/rps", 2, seed=0)
    builder = RolloutBuilder(venv, 1)
    batch = venv.reset(seed=0)
    actions = {"player": batch.action_mask["player"].argmax(-1)}
    builder.act(batch, actions, {"player": np.zeros((2, 2))})
    builder.observe(venv.step(actions))
    rollout = builder.finish({"player": np.zeros((2, 2))})["player"]
    venv.close()
    assert rollout.next == {}
    with pytest.raises(ValueError, match="record_next=True"):
        decisions(rollout)


@pytest.mark.parametrize("array", ARRAYS)
@pytest.mark.parametrize("continuous", [True, False])
def test_maddpgs_joint_rows_are_the_assemblers_transitions_of_every_agent(array, continuous):
    from corral.algos.maddpg import MADDPG, _critic_action

    kwargs = {"native": True, "state": True, "env_kwargs": {"continuous_actions": continuous}}
    venv = corral.make_vec("mpe2/simple_spread_v3", NUM_ENVS, seed=0, **kwargs)
    algo = MADDPG(venv, MADDPG.Config(seed=0))
    space, n = venv.action_space("agent"), len(venv.groups["agent"])
    rng = np.random.default_rng(0)
    assembler = TransitionAssembler(venv)
    builder = RolloutBuilder(venv, 3, record_next=True)
    convert = as_torch if array == "torch" else (lambda b: b)
    expected, ours = [], []
    batch = venv.reset(seed=0)
    for _ in range(30):  # 10 rollouts; episodes of 25 steps end (truncated) inside them
        actions = {"agent": sample_array(space, (NUM_ENVS, n), rng, batch.action_mask.get("agent"))}
        assembler.act(batch, actions)
        builder.act(convert(batch), {"agent": convert_array(actions["agent"], array)})
        batch = venv.step(actions)
        builder.observe(convert(batch))
        t = assembler.observe(batch)["agent"]
        order = np.argsort(t["env"] * n + t["agent"])
        t = {k: v[order].reshape(NUM_ENVS, n, *v.shape[1:]) for k, v in t.items()}
        row = {
            "agent/obs": t["obs"],
            "agent/action": _critic_action(space, t["action"]),
            "agent/reward": t["reward"].astype(np.float32),
            "agent/next_obs": t["next_obs"],
            "agent/terminated": t["terminated"],
            "state": t["state"][:, 0],
            "next_state": t["next_state"][:, 0],
        }
        if not continuous:
            row["agent/action_mask"] = t["action_mask"]
            row["agent/next_action_mask"] = t["next_action_mask"]
        expected.append(row)
        if builder.full:
            rows = algo.joint_rows("agent", builder.finish()["agent"])
            ours.append({k: to_numpy(v) for k, v in rows.items()})
    venv.close()
    assert any(
        r["agent/terminated"].any() or (r["next_state"] != r["state"]).any() for r in expected
    )
    truncated_somewhere = False
    for name in expected[0]:
        want = np.concatenate([r[name] for r in expected])
        got = np.concatenate([r[name] for r in ours])
        assert got.shape == want.shape, (name, got.shape, want.shape)
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7, err_msg=name)
        if name == "agent/next_obs":
            truncated_somewhere = not np.array_equal(
                got[:-NUM_ENVS], np.concatenate([r["agent/obs"] for r in ours])[NUM_ENVS:]
            )
    assert truncated_somewhere  # some next_obs is a final_obs, not the next step's obs


def nested(batch):
    """``batch`` with each observation (and final one) as a tree ``{"x": obs, "pair": (obs,
    -obs)}``: what a ``Dict`` of a ``Tuple`` space's vector layer gives."""

    def tree(per_group):
        return {g: {"x": o, "pair": (o, -o)} for g, o in per_group.items()}

    return dataclasses.replace(batch, obs=tree(batch.obs), final_obs=tree(batch.final_obs))


@pytest.mark.parametrize("array", ARRAYS)
@pytest.mark.parametrize("env_id", ["corral/rps", "mpe2/simple_spread_v3"])
def test_nested_observations_are_stored_leaf_by_leaf(env_id, array):
    """Rows of a rollout of tree observations: each leaf is the plain rollout's field, for
    decisions carried across rollouts (rps, 3 steps) and final observations (spread)."""
    venv = corral.make_vec(env_id, NUM_ENVS, seed=0)
    rng = np.random.default_rng(0)
    plain = RolloutBuilder(venv, 3, record_next=True)
    tree = RolloutBuilder(venv, 3, record_next=True)
    convert = as_torch if array == "torch" else (lambda b: b)
    ours, theirs, carried = [], [], 0
    batch = venv.reset(seed=0)
    for _ in range(36):
        actions = {
            g: sample_array(venv.action_space(g), (NUM_ENVS, len(a)), rng, batch.action_mask.get(g))
            for g, a in venv.groups.items()
        }
        converted = {g: convert_array(a, array) for g, a in actions.items()}
        plain.act(convert(batch), converted)
        tree.act(nested(convert(batch)), converted)
        batch = venv.step(actions)
        plain.observe(convert(batch))
        tree.observe(nested(convert(batch)))
        if plain.full:
            finished = plain.finish()
            carried += sum(int(to_numpy(r.carried).sum()) for r in finished.values())
            theirs.append({g: decision_rows(r) for g, r in finished.items()})
            ours.append({g: decision_rows(r) for g, r in tree.finish().items()})
    venv.close()
    for mine, reference in zip(ours, theirs, strict=True):
        for g, rows in reference.items():
            for name in ("obs", "next_obs"):
                leaf = to_numpy(rows[name])
                np.testing.assert_array_equal(to_numpy(mine[g][name]["x"]), leaf)
                np.testing.assert_array_equal(to_numpy(mine[g][name]["pair"][0]), leaf)
                np.testing.assert_array_equal(to_numpy(mine[g][name]["pair"][1]), -leaf)
            for name in rows.keys() - {"obs", "next_obs"}:
                np.testing.assert_array_equal(to_numpy(mine[g][name]), to_numpy(rows[name]))
    assert len(ours) == 12 and (carried > 0) == (env_id == "corral/rps")


def test_an_observation_laid_out_unlike_the_first_steps_is_refused():
    venv = corral.make_vec("corral/rps", 2, seed=0)
    builder = RolloutBuilder(venv, 2)
    batch = venv.reset(seed=0)
    actions = {"player": batch.action_mask["player"].argmax(-1)}
    builder.act(nested(batch), actions)
    batch = venv.step(actions)
    builder.observe(batch)
    venv.close()
    with pytest.raises(ValueError, match=r"group 'player': obs is laid out unlike its first"):
        builder.act(batch, actions)
    with pytest.raises(TypeError, match=r"obs/x must be an array \[E, n, \.\.\.\]"):
        RolloutBuilder(venv, 2).act(dataclasses.replace(batch, obs={"player": {"x": 1}}), actions)
