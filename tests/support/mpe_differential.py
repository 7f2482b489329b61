"""Differential checks of corral's natively batched MPE against mpe2 itself.

Every scenario's test module runs these on its own cases (id, env_kwargs):

* :func:`check_exact`: numpy float64 batches bit-identical to the mpe2 dict envs
  through corral (``native=False``), same seeds and actions, over runs that cross
  several autoresets;
* :func:`check_torch`: torch float64 within 1e-9 of numpy float64 (world state and
  rewards), on the CPU and on CUDA where there is one;
* :func:`check_float32_step`: one step of float32 from a state mpe2 reached (loaded
  into the batched world with ``from_mpe2``) within 1e-4 of mpe2's step;
* :func:`check_float32_returns`: float32's mean random-policy episode return within 1%
  of float64's (itself exact to mpe2) over 10,000 episodes;
* :func:`check_render`: a copy drawn by ``render(copy)`` equals mpe2's own frame;
* :func:`check_render_at_reset`: every copy drawn right after a reset equals mpe2's frame.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import corral
from corral.arrays import to_numpy
from corral.registry import spec

from .batches import assert_batches_equal


def batched(id: str, num_envs: int, **kwargs: Any) -> Any:
    """The natively batched env of ``id``."""
    return spec(id).make_batched(num_envs, **kwargs)


def random_actions(env: Any, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Uniformly random actions ``{group: [E, n_g, ...]}`` for every agent of ``env``."""
    out = {}
    for group, agents in env.groups.items():
        space = env.action_space(agents[0])
        shape = (env.num_envs, len(agents))
        if hasattr(space, "n"):
            out[group] = rng.integers(0, space.n, shape)
        else:
            out[group] = rng.random((*shape, *space.shape), dtype=np.float32)
    return out


def check_exact(id: str, env_kwargs: dict[str, Any], steps: int = 80, num_envs: int = 4) -> int:
    """numpy float64 native batches equal mpe2's through corral; the episodes ended."""
    rng = np.random.default_rng(7)
    with (
        corral.make_vec(
            id, num_envs, native=False, seed=5, state=True, env_kwargs=env_kwargs
        ) as ref,
        corral.make_vec(
            id, num_envs, native=True, seed=5, state=True, env_kwargs=env_kwargs, dtype="float64"
        ) as native,
    ):
        want, got = ref.reset(), native.reset()
        assert_batches_equal(want, got, f"{id} {env_kwargs} reset")
        episodes = 0
        for t in range(steps):
            actions = ref.sample_actions(want, rng)
            want, got = ref.step(actions), native.step(actions)
            assert_batches_equal(want, got, f"{id} {env_kwargs} step {t}")
            episodes += int(want.done.sum())
    assert episodes >= num_envs  # every copy ended an episode and went on
    return episodes


def check_torch(
    id: str, env_kwargs: dict[str, Any], device: str = "cpu", steps: int = 60, num_envs: int = 6
) -> None:
    """torch float64 stays within 1e-9 of numpy float64 (world state and rewards)."""
    rng = np.random.default_rng(3)
    envs = [
        batched(id, num_envs, dtype="float64", **env_kwargs),
        batched(id, num_envs, array="torch", device=device, dtype="float64", **env_kwargs),
    ]
    for env in envs:
        env.reset(seed=9)
    for t in range(steps):
        actions = random_actions(envs[0], rng)
        want, got = (env.step(actions) for env in envs)
        where = f"{id} {env_kwargs} step {t}"
        for name in ("pos", "vel", "comm"):
            a, b = (to_numpy(getattr(env.world, name)) for env in envs)
            np.testing.assert_allclose(b, a, rtol=1e-9, atol=1e-9, err_msg=f"{where}: {name}")
        for group in want.reward:
            np.testing.assert_allclose(
                to_numpy(got.reward[group]), want.reward[group], rtol=1e-9, atol=1e-9,
                err_msg=f"{where}: reward {group}",
            )  # fmt: skip
            np.testing.assert_array_equal(to_numpy(got.alive[group]), want.alive[group])
        ended = ~np.stack([a.any(1) for a in want.alive.values()]).any(0)
        if ended.any():
            for env in envs:
                env.reset(where=env.place.asarray(ended))


def mpe2_raw(id: str, env_kwargs: dict[str, Any]) -> Any:
    """A fresh mpe2 raw env (AEC, no wrappers) of ``id``."""
    return batched(id, 1, **env_kwargs).mpe2_env(**env_kwargs)


def _mpe2_step(raw: Any, actions: list[Any]) -> None:
    """One parallel step of an mpe2 raw (AEC) env: every agent's action in turn."""
    for action in actions:
        raw.step(action)


def _per_agent(env: Any, actions: dict[str, np.ndarray], copy: int) -> list[Any]:
    """Copy ``copy``'s action of each agent, in ``possible_agents`` order."""
    out = {}
    for group, agents in env.groups.items():
        for k, agent in enumerate(agents):
            out[agent] = actions[group][copy, k]
    return [out[a] for a in env.possible_agents]


def check_float32_step(
    id: str, env_kwargs: dict[str, Any], num_envs: int = 16, warmup: int = 12
) -> None:
    """float32 from a state mpe2 reached: one step within 1e-4 of mpe2's."""
    rng = np.random.default_rng(1)
    env = batched(id, num_envs, dtype="float32", **env_kwargs)
    env.reset(seed=0)
    raws = []
    for copy in range(num_envs):
        raw = mpe2_raw(id, env_kwargs)
        raw.reset(seed=100 + copy)
        for _ in range(warmup + copy % 5):
            _mpe2_step(raw, _per_agent(env, random_actions(env, rng), 0))
        env.from_mpe2(raw, copy)
        raws.append(raw)
    actions = random_actions(env, rng)
    step = env.step(actions)
    for copy, raw in enumerate(raws):
        _mpe2_step(raw, _per_agent(env, actions, copy))
        for group, agents in env.groups.items():
            for k, agent in enumerate(agents):
                np.testing.assert_allclose(
                    to_numpy(step.obs[group][copy, k]), raw.observe(agent), atol=1e-4, rtol=0,
                    err_msg=f"{id} {env_kwargs} copy {copy} {agent}",
                )  # fmt: skip
                assert abs(float(to_numpy(step.reward[group][copy, k])) - raw.rewards[agent]) < 1e-4


def check_float32_returns(id: str, env_kwargs: dict[str, Any], episodes: int = 10_000) -> None:
    """float32's mean random-policy return within 1% of float64's (same seeds, actions)."""
    means = []
    for dtype in ("float64", "float32"):
        rng = np.random.default_rng(2)
        env = batched(id, episodes, dtype=dtype, **env_kwargs)
        env.reset(seed=0)
        total = 0.0
        for _ in range(env.max_cycles):
            step = env.step(random_actions(env, rng))
            total += sum(float(to_numpy(r).sum()) for r in step.reward.values())
        means.append(total / episodes)
    assert abs(means[1] - means[0]) <= 0.01 * abs(means[0]), means


def check_render(id: str, env_kwargs: dict[str, Any], steps: int = 7) -> None:
    """``render(copy)`` draws what mpe2's env, seeded and stepped alike, draws."""
    rng = np.random.default_rng(4)
    env = batched(id, 3, render_mode="rgb_array", **env_kwargs)
    env.reset(seed=20)
    raw = batched(id, 1, **env_kwargs).mpe2_env(**env_kwargs, render_mode="rgb_array")
    raw.reset(seed=22)
    for _ in range(steps):
        actions = random_actions(env, rng)
        env.step(actions)
        _mpe2_step(raw, _per_agent(env, actions, 2))
    np.testing.assert_array_equal(env.render(2), raw.render())
    env.close()
    raw.close()


def check_render_at_reset(id: str, env_kwargs: dict[str, Any], num_envs: int = 8) -> Any:
    """Each copy drawn by ``render(copy)`` right after ``reset(seed=s)``, in turn with the
    one renderer, equals mpe2's frame after ``reset(seed=s + copy)``: what a reset sets
    beside the positions (goals, the colours they give) reaches the renderer. Returns the
    batched env (closed)."""
    env = batched(id, num_envs, render_mode="rgb_array", **env_kwargs)
    env.reset(seed=20)
    raw = mpe2_raw(id, {**env_kwargs, "render_mode": "rgb_array"})
    for copy in range(num_envs):
        raw.reset(seed=20 + copy)
        np.testing.assert_array_equal(env.render(copy), raw.render(), err_msg=f"{id} copy {copy}")
    env.close()
    raw.close()
    return env


def differential_tests(
    id: str,
    cases: list[dict[str, Any]],
    *,
    torch_cases: list[dict[str, Any]] | None = None,
    float32_cases: list[dict[str, Any]] | None = None,
    returns_cases: list[dict[str, Any]] | None = None,
    render_cases: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """The checks above for scenario ``id`` as parametrized test functions, by name, for a
    test module to take in (``globals().update(differential_tests(ID, CASES))``).

    Every case is checked for exactness; torch on ``torch_cases`` (default: all), one
    float32 step on ``float32_cases`` (every other case), the float32 mean return on
    ``returns_cases`` (the first case: 10,000 episodes each) and rendering on
    ``render_cases`` (the first case)."""
    from .batches import PLACES

    torch_places = [p for p in PLACES if p != ("numpy", "cpu")]

    def over(chosen: list[dict[str, Any]] | None, default: list[dict[str, Any]]) -> Any:
        chosen = default if chosen is None else chosen
        return pytest.mark.parametrize("env_kwargs", chosen, ids=[str(c) for c in chosen])

    @over(cases, cases)
    def test_numpy_float64_is_bit_identical_to_mpe2(env_kwargs: dict[str, Any]) -> None:
        check_exact(id, env_kwargs)

    @pytest.mark.parametrize(("array", "device"), torch_places)
    @over(torch_cases, cases)
    def test_torch_float64_is_within_1e9_of_numpy(
        env_kwargs: dict[str, Any], array: str, device: str
    ) -> None:
        check_torch(id, env_kwargs, device)

    @over(float32_cases, cases[::2])
    def test_float32_steps_within_1e4_of_mpe2(env_kwargs: dict[str, Any]) -> None:
        check_float32_step(id, env_kwargs)

    @over(returns_cases, cases[:1])
    def test_float32_mean_return_within_1_percent(env_kwargs: dict[str, Any]) -> None:
        check_float32_returns(id, env_kwargs)

    @over(render_cases, cases[:1])
    def test_render_draws_a_copy_as_mpe2_does(env_kwargs: dict[str, Any]) -> None:
        check_render(id, env_kwargs)

    tests = (
        test_numpy_float64_is_bit_identical_to_mpe2,
        test_torch_float64_is_within_1e9_of_numpy,
        test_float32_steps_within_1e4_of_mpe2,
        test_float32_mean_return_within_1_percent,
        test_render_draws_a_copy_as_mpe2_does,
    )
    return {test.__name__: test for test in tests}
