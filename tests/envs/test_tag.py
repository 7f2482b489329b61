"""corral/tag: two kinds of agents, prey that die mid-episode, action masks."""

from __future__ import annotations

import re

import numpy as np
import pytest

import corral
from corral.envs.tag import PREDATOR_MOVES, PREY_MOVES, Tag

STAY = 0


def positions(env: Tag) -> dict[str, tuple[int, int]]:
    """Each live agent's cell, read from the global state."""
    n = len(env.possible_agents)
    cells = np.rint(env.state()[: 2 * n].reshape(n, 2) * (env.size - 1)).astype(int)
    return {a: (int(r), int(c)) for a, (r, c) in zip(env.possible_agents, cells, strict=True)}


def legal_mask(cell: tuple[int, int], moves, size: int, walls: set) -> list[int]:
    targets = [(cell[0] + dr, cell[1] + dc) for dr, dc in moves]
    return [int(0 <= r < size and 0 <= c < size and (r, c) not in walls) for r, c in targets]


def greedy_chase(env: Tag, obs) -> dict[str, int]:
    """Predators step towards the nearest live prey; prey stay put."""
    cells = positions(env)
    prey = [cells[a] for a in env.agents if a.startswith("prey")]
    actions = {}
    for agent in obs:
        if agent.startswith("prey"):
            actions[agent] = STAY
            continue
        r, c = cells[agent]
        target = min(prey, key=lambda p: abs(p[0] - r) + abs(p[1] - c))
        distance = [abs(target[0] - r - dr) + abs(target[1] - c - dc) for dr, dc in PREDATOR_MOVES]
        actions[agent] = int(np.argmin(distance))
    return actions


@pytest.mark.parametrize("seed", range(8))
def test_user_loop_keeps_the_contract(seed: int) -> None:
    env = corral.make("corral/tag")
    walls = {(2, 2), (2, 4), (4, 2), (4, 4)}
    obs, infos = env.reset(seed=seed)
    rng = np.random.default_rng(seed)
    gone: set[str] = set()
    while env.agents:
        assert set(obs) == set(env.agents)
        cells = positions(env)
        for agent in obs:
            mask = infos[agent]["action_mask"]
            moves = PREDATOR_MOVES if agent.startswith("predator") else PREY_MOVES
            assert mask.dtype == np.int8
            assert mask.tolist() == legal_mask(cells[agent], moves, env.size, walls)
            assert env.observation_space(agent).contains(obs[agent])
        assert env.state_space.contains(env.state())
        alive = list(env.agents)
        actions = {a: int(rng.choice(np.flatnonzero(infos[a]["action_mask"]))) for a in obs}
        obs, rewards, terms, truncs, infos = env.step(actions)
        assert set(rewards) == set(terms) == set(truncs) == set(alive)
        assert not gone & (set(obs) | set(rewards) | set(env.agents))
        ended = {a for a in alive if terms[a] or truncs[a]}
        assert set(infos) == set(obs) | ended
        for agent in ended:
            assert env.observation_space(agent).contains(infos[agent]["final_obs"])
            assert agent not in obs and agent not in env.agents
        gone |= ended
    assert obs == {} and gone == set(env.possible_agents)


def test_kinds_have_different_spaces_and_form_two_groups() -> None:
    env = Tag(num_predators=3, num_prey=2)
    assert env.observation_space("predator_0").shape == (2 + 2 * 2 + 3 * 2,)
    assert env.observation_space("prey_0").shape == (2 + 2 * 3 + 3 * 1,)
    assert env.action_space("predator_2").n == 5 and env.action_space("prey_1").n == 9
    groups = corral.group_agents(env.possible_agents, env.observation_space, env.action_space)
    assert groups == {"predator": ["predator_0", "predator_1", "predator_2"],
                      "prey": ["prey_0", "prey_1"]}  # fmt: skip
    assert env.state_space.shape == (3 * 5,)


def test_caught_prey_leaves_once_and_for_all() -> None:
    env = Tag(num_predators=1, num_prey=2, size=5, walls=[], max_cycles=100)
    obs, infos = env.reset(seed=3)
    history = []
    while env.agents:
        before = list(env.agents)
        obs, rewards, terms, truncs, infos = env.step(greedy_chase(env, obs))
        history.append((before, rewards, terms, truncs, infos, obs, env.state()))
    catches = [k for k, (_, rewards, *_) in enumerate(history) if rewards["predator_0"] > 0]
    assert len(catches) == 2 and catches[0] < catches[1], "greedy predator catches both prey"
    first, last = catches
    before, rewards, terms, truncs, infos, obs, state = history[first]
    (victim,) = [a for a in before if terms[a]]
    survivor = ({"prey_0", "prey_1"} - {victim}).pop()
    assert rewards == {"predator_0": 1.0, victim: -1.0, survivor: 0.0}
    assert not terms["predator_0"] and not terms[survivor] and not any(truncs.values())
    assert set(obs) == {"predator_0", survivor} and set(infos) == {"predator_0", survivor, victim}
    assert infos[victim]["final_obs"].shape == env.observation_space(victim).shape
    # The dead prey's slot in the others' observations and in the state is zeroed.
    k = env.possible_agents.index(victim)
    assert state[2 * k : 2 * k + 2].tolist() == [0.0, 0.0] and state[6 + k] == 0.0
    survivor_index = 0 if survivor == "prey_0" else 1
    assert obs["predator_0"][2 + 3 * survivor_index + 2] == 1.0
    assert obs["predator_0"][2 + 3 * (1 - survivor_index) :][:3].tolist() == [0.0, 0.0, 0.0]
    for before, rewards, _, _, infos, _, _ in history[first + 1 :]:
        assert victim not in before and victim not in rewards and victim not in infos
    before, rewards, terms, truncs, infos, obs, _ = history[last]
    assert before == ["predator_0", survivor] and obs == {} and env.agents == []
    assert terms == {"predator_0": True, survivor: True} and not any(truncs.values())
    assert set(infos) == {"predator_0", survivor}


def test_swapping_cells_is_a_catch() -> None:
    env = Tag(num_predators=1, num_prey=1, size=2, walls=[])
    for seed in range(50):
        env.reset(seed=seed)
        cells = positions(env)
        (pr, pc), (yr, yc) = cells["predator_0"], cells["prey_0"]
        if abs(pr - yr) + abs(pc - yc) == 1:
            break
    towards = PREDATOR_MOVES.index((yr - pr, yc - pc))
    away = PREY_MOVES.index((pr - yr, pc - yc))
    _, rewards, terms, *_ = env.step({"predator_0": towards, "prey_0": away})
    assert rewards == {"predator_0": 1.0, "prey_0": -1.0} and all(terms.values())


def test_max_cycles_truncates_everyone_alive() -> None:
    env = corral.make("corral/tag", max_cycles=3)
    obs, _ = env.reset(seed=0)
    for _ in range(3):
        obs, rewards, terms, truncs, infos = env.step(dict.fromkeys(obs, STAY))
    assert obs == {} and env.agents == []
    assert all(truncs.values()) and not any(terms.values()) and len(truncs) == 4
    assert all(r == 0.0 for r in rewards.values())
    assert all("final_obs" in infos[a] for a in env.possible_agents)


def rollout(seed: int, steps: int = 30) -> list:
    env = corral.make("corral/tag")
    obs, infos = env.reset(seed=seed)
    rng = np.random.default_rng(100)
    out = [obs]
    for _ in range(steps):
        if not env.agents:
            break
        actions = {a: int(rng.choice(np.flatnonzero(infos[a]["action_mask"]))) for a in obs}
        obs, rewards, terms, truncs, infos = env.step(actions)
        out.append((obs, rewards, terms, truncs))
    return out


def _same(a, b) -> bool:
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (tuple, list)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return bool(np.array_equal(a, b))


def test_seeded_reset_is_deterministic() -> None:
    assert _same(rollout(7), rollout(7))
    assert not _same(rollout(7)[0], rollout(8)[0])


def test_bad_actions_raise_and_leave_env_usable() -> None:
    env = Tag(num_predators=1, num_prey=1, size=4, walls=[(1, 1)], max_cycles=5)
    _, infos = env.reset(seed=0)
    mask = infos["predator_0"]["action_mask"]
    blocked = int(np.flatnonzero(mask == 0)[0])
    good = {"predator_0": STAY, "prey_0": STAY}
    bad_cases = [
        ({"predator_0": blocked, "prey_0": STAY}, "step 0: agent 'predator_0'.*mask forbids"),
        ({"predator_0": 5, "prey_0": STAY}, "step 0: agent 'predator_0'"),
        ({"predator_0": STAY, "prey_0": 9}, "step 0: agent 'prey_0'"),
        ({"predator_0": STAY}, "step 0: agent 'prey_0' must act"),
        ({**good, "predator_1": STAY}, "'predator_1', which is not acting"),
    ]
    for actions, pattern in bad_cases:
        with pytest.raises(corral.InvalidActionError, match=pattern):
            env.step(actions)
    reference = Tag(num_predators=1, num_prey=1, size=4, walls=[(1, 1)], max_cycles=5)
    reference.reset(seed=0)
    assert _same(env.step(good), reference.step(good))
    assert _same(env.state(), reference.state())


def test_dead_prey_cannot_act() -> None:
    env = Tag(num_predators=1, num_prey=2, size=5, walls=[], max_cycles=100)
    obs, _ = env.reset(seed=3)
    while len(obs) == 3:
        obs, *_ = env.step(greedy_chase(env, obs))
    (victim,) = {"prey_0", "prey_1"} - set(obs)
    with pytest.raises(corral.InvalidActionError, match=f"'{victim}', which is not acting"):
        env.step({**dict.fromkeys(obs, STAY), victim: STAY})
    obs, rewards, *_ = env.step(dict.fromkeys(obs, STAY))
    assert victim not in rewards


def test_render_and_arguments() -> None:
    env = corral.make("corral/tag", render_mode="ansi")
    env.reset(seed=0)
    rows = env.render().splitlines()
    assert len(rows) == 7 and all(len(r) == 7 for r in rows)
    text = "".join(rows)
    assert text.count("#") == 4 and text.count("P") + text.count("o") >= 2
    assert Tag().render() is None
    with pytest.raises(ValueError, match="outside"):
        Tag(size=3, walls=[(3, 0)])
    with pytest.raises(ValueError, match="free cells"):
        Tag(num_predators=3, num_prey=2, size=2)


def test_rgb_array_frames_draw_walls_and_follow_the_agents() -> None:
    from corral.envs.tag import CELL, PREDATOR, PREY, WALL

    env = corral.make("corral/tag", render_mode="rgb_array")
    assert "rgb_array" in env.metadata["render_modes"]

    def colour_at(frame: np.ndarray, cell: tuple[int, int]) -> tuple[int, ...]:
        return tuple(int(v) for v in frame[cell[0] * CELL + CELL // 2, cell[1] * CELL + CELL // 2])

    obs, infos = env.reset(seed=0)
    frame = env.render()
    assert frame.shape == (7 * CELL, 7 * CELL, 3) and frame.dtype == np.uint8
    assert colour_at(frame, (2, 2)) == WALL
    rng = np.random.default_rng(0)
    moves = 0
    while env.agents:
        cells = {a: positions(env)[a] for a in env.agents}
        for agent, cell in cells.items():
            assert colour_at(frame, cell) == (PREDATOR if "predator" in agent else PREY)
        actions = {a: int(rng.choice(np.flatnonzero(infos[a]["action_mask"]))) for a in obs}
        obs, _, _, _, infos = env.step(actions)
        before, frame = frame, env.render()
        moved = cells != {a: positions(env)[a] for a in env.agents}
        assert (before != frame).any() == moved
        moves += moved
    assert moves > 10


@pytest.mark.parametrize("max_cycles", [2.5, 0, True])
def test_a_max_cycles_that_is_no_step_count_is_refused_by_both_implementations(
    max_cycles: object,
) -> None:
    """2.5 would end the episodes after 3 steps, under a limit that is no step count."""
    expected = (
        f"max_cycles must be an int of at least 1 (the steps of an episode), got {max_cycles!r}"
    )
    with pytest.raises(ValueError, match=re.escape(expected)):
        Tag(max_cycles=max_cycles)
    with pytest.raises(ValueError, match=re.escape(expected)):
        corral.make_vec("corral/tag", 2, native=True, env_kwargs={"max_cycles": max_cycles})
    env = Tag(max_cycles=4)
    with pytest.raises(ValueError, match=re.escape(expected)):
        env.max_cycles = max_cycles
    assert env.max_cycles == 4 and env.max_episode_steps == 4
