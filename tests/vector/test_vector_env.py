"""One suite for every backend: shapes, masks, autoreset, episode stats, determinism.

Each case steps a vector env with random legal actions and, beside it, one
plain corral env per slot driven with the same actions (the reference loop).
Every batch field is checked against what the reference envs returned.
"""

from __future__ import annotations

import inspect
import sys

import cloudpickle
import numpy as np
import pytest
from gymnasium import spaces
from support.backends import BACKENDS

import corral
from corral.envs.tag import Tag
from corral.errors import EnvError, InvalidActionError, MissingDependencyError, VectorStateError
from corral.vector import VectorEnv, make_vec

ENVS = {
    "mpe2": ("mpe2/simple_spread_v3", {"N": 3, "max_cycles": 10}),
    "classic": ("pettingzoo/classic/connect_four_v3", {}),
    "rps4": ("corral/rps4", {}),
    "tag": ("corral/tag", {}),
    "openspiel": ("openspiel/kuhn_poker", {}),
    "gym": ("gym/CartPole-v1", {"max_episode_steps": 15}),
}


def _make_or_skip(id: str, kwargs: dict):
    try:
        return corral.make(id, **kwargs)
    except MissingDependencyError as err:
        pytest.skip(str(err))


def _options(backend: str, ray_session) -> dict:
    if backend == "ray":
        ray_session()
    return {"num_workers": 2} if backend != "sync" else {}


def _reference_step(envs, actions, venv, state):
    """Step the plain envs with the vector actions; return per-env records."""
    records = []
    for i, env in enumerate(envs):
        acting = state["acting"][i]
        act = {}
        for agent in acting:
            g, j = venv.layout.position[agent]
            value = actions[g][i, j]
            act[agent] = int(value) if np.ndim(value) == 0 else value
        obs, rew, term, trunc, infos = env.step(act)
        state["returns"][i] = {a: state["returns"][i].get(a, 0.0) + r for a, r in rew.items()}
        state["length"][i] += 1
        rec = {"obs": obs, "rew": rew, "term": term, "trunc": trunc, "infos": infos}
        if not env.agents:
            rec["episode_return"] = state["returns"][i]
            rec["episode_length"] = state["length"][i]
            obs, infos = env.reset()
            rec["reset_obs"], rec["reset_infos"] = obs, infos
            state["returns"][i], state["length"][i] = {}, 0
        state["acting"][i] = list(obs)
        records.append(rec)
    return records


def _check_agent_obs(venv, batch_obs, i, obs):
    for agent, value in obs.items():
        g, j = venv.layout.position[agent]
        np.testing.assert_array_equal(batch_obs[g][i, j], np.asarray(value), err_msg=agent)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("case", list(ENVS))
def test_batches_match_reference_envs(case: str, backend: str, ray_session) -> None:
    id, kwargs = ENVS[case]
    _make_or_skip(id, kwargs)
    num_envs, seed = 3, 7
    venv = make_vec(
        id, num_envs, backend, seed=seed, env_kwargs=kwargs, **_options(backend, ray_session)
    )
    envs = [corral.make(id, **kwargs) for _ in range(num_envs)]
    try:
        batch = venv.reset()
        state = {"acting": [], "returns": [{} for _ in envs], "length": [0] * num_envs}
        for i, env in enumerate(envs):
            obs, _ = env.reset(seed=seed + i)
            state["acting"].append(list(obs))
            _check_agent_obs(venv, batch.obs, i, obs)
        _check_shapes(venv, batch)
        rng = np.random.default_rng(0)
        dones = 0
        for _ in range(60):
            actions = venv.sample_actions(batch, rng)
            batch = venv.step(actions)
            records = _reference_step(envs, actions, venv, state)
            for i, rec in enumerate(records):
                _check_step(venv, batch, i, rec)
                dones += "episode_return" in rec
        assert dones > 0, "no episode ended: the autoreset path was not exercised"
    finally:
        venv.close()
        for env in envs:
            env.close()


def _check_shapes(venv: VectorEnv, batch) -> None:
    E = venv.num_envs
    for g, agents in venv.groups.items():
        n = len(agents)
        space = venv.observation_space(g)
        assert batch.obs[g].shape == (E, n, *space.shape)
        for field in ("reward", "terminated", "truncated", "alive", "acting", "episode_return"):
            assert getattr(batch, field)[g].shape == (E, n), field
        if g in batch.action_mask:
            assert batch.action_mask[g].shape == (E, n, venv.action_space(g).n)
            assert batch.action_mask[g].dtype == bool
    assert batch.done.shape == batch.episode_length.shape == (E,)


def _check_step(venv: VectorEnv, batch, i: int, rec: dict) -> None:
    position = venv.layout.position
    for agent, reward in rec["rew"].items():
        g, j = position[agent]
        assert batch.reward[g][i, j] == reward, (i, agent)
    for field, key in (("terminated", "term"), ("truncated", "trunc")):
        for agent, flag in rec[key].items():
            g, j = position[agent]
            assert getattr(batch, field)[g][i, j] == flag, (field, i, agent)
    done = "episode_return" in rec
    assert bool(batch.done[i]) == done
    obs, infos = (rec["reset_obs"], rec["reset_infos"]) if done else (rec["obs"], rec["infos"])
    _check_agent_obs(venv, batch.obs, i, obs)
    for g, agents in venv.groups.items():
        acting = [a in obs for a in agents]
        assert batch.acting[g][i].tolist() == acting, (i, g)
    for agent in obs:
        g, j = position[agent]
        mask = infos[agent].get("action_mask")
        if mask is not None:
            np.testing.assert_array_equal(batch.action_mask[g][i, j], mask.astype(bool))
    if done:
        assert batch.episode_length[i] == rec["episode_length"]
        for agent, ret in rec["episode_return"].items():
            g, j = position[agent]
            assert batch.episode_return[g][i, j] == pytest.approx(ret, abs=1e-9)
        final = {a: info["final_obs"] for a, info in rec["infos"].items() if "final_obs" in info}
        assert final, "the ended episode reported no final observation"
        _check_agent_obs(venv, batch.final_obs, i, final)


@pytest.mark.parametrize("backend", [b for b in BACKENDS if b.values[0] != "sync"])
@pytest.mark.parametrize("case", ["mpe2", "classic", "rps4", "tag", "openspiel", "gym"])
def test_backends_return_identical_batches(case: str, backend: str, ray_session) -> None:
    id, kwargs = ENVS[case]
    _make_or_skip(id, kwargs)
    venvs = [
        make_vec(id, 3, name, seed=3, state=True, env_kwargs=kwargs, **_options(name, ray_session))
        for name in ("sync", backend)
    ]
    try:
        batches = [v.reset() for v in venvs]
        rng = np.random.default_rng(1)
        for _ in range(40):
            _assert_same(batches[0], batches[1])
            actions = venvs[0].sample_actions(batches[0], rng)
            batches = [v.step(actions) for v in venvs]
        _assert_same(batches[0], batches[1])
    finally:
        for v in venvs:
            v.close()


def _assert_same(a, b) -> None:
    for field in a.__dataclass_fields__:
        x, y = getattr(a, field), getattr(b, field)
        if isinstance(x, dict):
            assert x.keys() == y.keys(), field
            for key in x:
                np.testing.assert_array_equal(x[key], y[key], err_msg=f"{field}[{key}]")
        elif x is None:
            assert y is None, field
        else:
            np.testing.assert_array_equal(x, y, err_msg=field)


def test_turn_based_acting_mask_and_delayed_reward() -> None:
    """corral/rps: one player acts per step; the round's reward reaches both."""
    venv = make_vec("corral/rps", 2, seed=0, env_kwargs={"num_rounds": 1})
    batch = venv.reset()
    assert batch.acting["player"].tolist() == [[True, False]] * 2
    batch = venv.step({"player": np.array([[0, 0], [0, 0]])})  # player_0: rock
    assert batch.acting["player"].tolist() == [[False, True]] * 2
    assert not batch.reward["player"].any()
    batch = venv.step({"player": np.array([[0, 1], [0, 2]])})  # player_1: paper, scissors
    assert batch.done.tolist() == [True, True]
    assert batch.reward["player"].tolist() == [[-1, 1], [1, -1]]
    assert batch.episode_return["player"].tolist() == [[-1, 1], [1, -1]]
    assert batch.terminated["player"].all()
    assert batch.acting["player"].tolist() == [[True, False]] * 2  # the next episode
    venv.close()


def test_dying_agents_leave_alive_and_acting() -> None:
    venv = make_vec("corral/tag", 4, seed=0)
    batch = venv.reset()
    rng = np.random.default_rng(0)
    deaths = 0
    for _ in range(200):
        before = {g: a.copy() for g, a in batch.alive.items()}
        batch = venv.step(venv.sample_actions(batch, rng))
        for g in batch.alive:
            died = before[g] & batch.terminated[g] & ~batch.done[:, None]
            deaths += int(died.sum())
            assert not (batch.alive[g] & died).any()
            assert not (batch.acting[g] & ~batch.alive[g]).any()
    assert deaths > 0, "no agent died mid-episode in 200 steps"
    venv.close()


@pytest.fixture
def rps_venv():
    venv = make_vec("corral/rps", 2, seed=0)
    batch = venv.reset()
    yield venv, batch
    venv.close()


@pytest.mark.parametrize(
    ("actions", "message"),
    [
        ({}, "group 'player' is missing"),
        ({"player": np.zeros((2, 2)), "ghost": np.zeros((2, 1))}, "unknown group 'ghost'"),
        ({"player": np.zeros((2, 3), dtype=np.int64)}, "shape (2, 2)"),
        ({"player": np.zeros((2, 2), dtype=np.float32)}, "integer actions"),
        ({"player": np.array([[0, 0], [5, 0]])}, "env 1, agent 'player_0'"),
        ({"player": np.array([[0, 0], [-1, 0]])}, "an integer in [0, 2]"),
        ({"player": [[0, 0], [5, 0]]}, "env 1, agent 'player_0'"),
        ({"player": [[0, 0], [1]]}, "group 'player': expected an array [env, agent"),
    ],
)
def test_bad_actions_raise_before_stepping(rps_venv, actions, message) -> None:
    venv, _ = rps_venv
    with pytest.raises(InvalidActionError) as info:
        venv.step(actions)
    assert message in str(info.value)
    after = venv.step({"player": np.zeros((2, 2), dtype=np.int64)})
    assert after.acting["player"].tolist() == [[False, True]] * 2


@pytest.mark.parametrize("array", ["numpy", "torch"])
def test_actions_given_as_nested_lists_step_as_their_arrays(array: str) -> None:
    if array == "torch":
        pytest.importorskip("torch")
    venvs = [make_vec("corral/rps", 2, seed=0, array=array) for _ in range(2)]
    for venv in venvs:
        venv.reset()
    actions = [[1, 0], [2, 0]], [[0, 2], [0, 1]]
    for step in actions:
        as_lists, as_arrays = (
            venvs[0].step({"player": step}),
            venvs[1].step({"player": np.array(step)}),
        )
        for field in ("reward", "acting"):
            assert np.array_equal(
                getattr(as_lists, field)["player"], getattr(as_arrays, field)["player"]
            )
    assert np.asarray(as_lists.reward["player"]).any()
    for venv in venvs:
        venv.close()


def test_out_of_range_entries_of_non_acting_agents_are_ignored(rps_venv) -> None:
    venv, _ = rps_venv
    batch = venv.step({"player": np.array([[1, 99], [2, -7]])})
    assert batch.acting["player"].tolist() == [[False, True]] * 2


def test_masked_action_is_rejected_with_group_env_and_agent() -> None:
    venv = make_vec("corral/tag", 2, seed=0)
    batch = venv.reset()
    for g, mask in batch.action_mask.items():
        where = np.argwhere(~mask & batch.acting[g][..., None])
        if len(where):
            e, j, a = where[0]
            actions = venv.sample_actions(batch, np.random.default_rng(0))
            actions[g][e, j] = a
            with pytest.raises(InvalidActionError, match=f"env {e}, agent '{venv.groups[g][j]}'"):
                venv.step(actions)
            break
    else:
        pytest.skip("no action is masked in the first batch of corral/tag")
    venv.close()


def _as_bool_masks(infos: dict) -> dict:
    return {
        a: {**info, "action_mask": info["action_mask"].astype(bool)}
        if "action_mask" in info
        else info
        for a, info in infos.items()
    }


class BoolMaskTag(Tag):
    """corral/tag with ``bool`` masks: the checker reports them, the vector layer reads them."""

    def reset(self, seed=None, options=None):
        obs, infos = super().reset(seed, options)
        return obs, _as_bool_masks(infos)

    def step(self, actions):
        *out, infos = super().step(actions)
        return (*out, _as_bool_masks(infos))


def test_bool_masks_of_a_dict_env_give_the_batches_of_int8_ones() -> None:
    venvs = [VectorEnv([cls] * 3, seed=0) for cls in (Tag, BoolMaskTag)]
    batches = [venv.reset(seed=1) for venv in venvs]
    rng = np.random.default_rng(0)
    for _ in range(30):
        actions = venvs[0].sample_actions(batches[0], rng)
        batches = [venv.step(actions) for venv in venvs]
        for g, mask in batches[0].action_mask.items():
            np.testing.assert_array_equal(batches[1].action_mask[g], mask)
            np.testing.assert_array_equal(batches[1].obs[g], batches[0].obs[g])
    where = np.argwhere(~mask & batches[0].acting[g][..., None])  # a forbidden move
    assert len(where)
    e, j, a = where[0]
    actions = venvs[0].sample_actions(batches[0], rng)
    actions[g][e, j] = a
    for venv in venvs:
        with pytest.raises(InvalidActionError, match=f"env {e}, agent '{venv.groups[g][j]}'"):
            venv.step(actions)
        venv.close()


def test_nan_in_continuous_actions_is_rejected() -> None:
    venv = make_vec("gym/Pendulum-v1", 2, seed=0)
    batch = venv.reset()
    actions = venv.sample_actions(batch, np.random.default_rng(0))
    actions["agent"][1, 0, 0] = np.nan
    with pytest.raises(InvalidActionError, match=r"env 1, agent 'agent_0'.*finite"):
        venv.step(actions)
    actions["agent"][1, 0, 0] = 0.0
    assert venv.step(actions).obs["agent"].shape == (2, 1, 3)
    venv.close()


def test_calls_out_of_order_raise_named_errors() -> None:
    venv = make_vec("corral/rps", 2)
    with pytest.raises(VectorStateError, match="before reset"):
        venv.step({"player": np.zeros((2, 2), dtype=np.int64)})
    with pytest.raises(VectorStateError, match="without a pending step_async"):
        venv.step_wait()
    venv.reset_async(seed=0)
    with pytest.raises(VectorStateError, match="awaits its reset_wait"):
        venv.step_async({"player": np.zeros((2, 2), dtype=np.int64)})
    venv.reset_wait()
    venv.close()
    venv.close()
    with pytest.raises(VectorStateError, match="closed"):
        venv.reset()


def test_backends_refuse_options_they_do_not_take() -> None:
    with pytest.raises(ValueError, match=r"backend 'sync' takes no 'timeout' option: .*subproc"):
        make_vec("corral/rps", 2, timeout=5.0)
    with pytest.raises(ValueError, match=r"backend 'sync' takes no option 'num_workers'.*none"):
        make_vec("corral/rps", 2, num_workers=2)
    with pytest.raises(ValueError, match=r"no option 'num_wrokers'; its options: .*num_workers"):
        make_vec("corral/rps", 2, "subproc", num_wrokers=2)
    with pytest.raises(ValueError, match="on_env_error must be 'raise' or 'restart'"):
        make_vec("corral/rps", 2, on_env_error="ignore")
    with make_vec("corral/rps", 2) as venv:  # a wait's timeout, too
        venv.reset_async(seed=0)
        with pytest.raises(ValueError, match="takes no 'timeout' option"):
            venv.reset_wait(timeout=1.0)
        batch = venv.reset_wait()  # still pending: the refused call changed nothing
        assert batch.acting["player"].any()
        with pytest.raises(ValueError, match="takes no 'timeout' option"):
            venv.get_attr("num_rounds", timeout=1.0)


@pytest.mark.parametrize(
    ("backend", "option"), [("subproc", "timeout"), ("ray", "timeout"), ("ray", "start_timeout")]
)
@pytest.mark.parametrize("value", [-1, 0, float("nan"), float("inf"), "5", True])
def test_a_time_limit_that_is_no_positive_finite_number_is_refused_before_any_worker_starts(
    backend: str, option: str, value: object
) -> None:
    import multiprocessing

    ray = sys.modules.get("ray")
    ray_before = ray is not None and ray.is_initialized()
    children = set(multiprocessing.active_children())
    with pytest.raises(ValueError) as info:
        make_vec("corral/rps", 2, backend, **{option: value})
    assert str(info.value) == (
        f"{option} must be a positive, finite number of seconds, or None to wait without "
        f"limit; got {value!r}"
    )
    assert set(multiprocessing.active_children()) == children  # no worker was started
    ray = sys.modules.get("ray")
    assert ray is None or ray.is_initialized() == ray_before  # nor Ray


@pytest.mark.parametrize("value", [-1, 0, float("nan"), float("inf")])
def test_a_wait_s_time_limit_that_is_no_positive_finite_number_is_refused(value: float) -> None:
    with make_vec("corral/rps", 2, "subproc", num_workers=1) as venv:
        venv.reset_async(seed=0)
        with pytest.raises(ValueError, match=r"^timeout must be a positive, finite number"):
            venv.reset_wait(timeout=value)
        assert venv.reset_wait(timeout=30).acting["player"].any()  # the refusal changed nothing


def test_worker_backends_time_out_by_default() -> None:
    from corral.vector.backend import DEFAULT_TIMEOUT, backend_class

    assert 60 <= DEFAULT_TIMEOUT < float("inf")
    for name in ("subproc", "ray"):  # read from the signature: Ray need not start
        timeout = inspect.signature(backend_class(name)).parameters["timeout"]
        assert timeout.default == DEFAULT_TIMEOUT, name
    with make_vec("corral/rps", 2, "subproc", num_workers=1) as venv:
        assert venv._backend.timeout == DEFAULT_TIMEOUT
    with make_vec("corral/rps", 2, "subproc", num_workers=1, timeout=None) as venv:
        assert venv._backend.timeout is None


def test_seeding_gives_env_i_seed_plus_i() -> None:
    venv = make_vec("mpe2/simple_spread_v3", 3, seed=10, env_kwargs={"N": 3})
    batch = venv.reset()
    for i in range(3):
        env = _make_or_skip("mpe2/simple_spread_v3", {"N": 3})
        obs, _ = env.reset(seed=10 + i)
        _check_agent_obs(venv, batch.obs, i, obs)
    venv.close()


def test_a_numpy_integer_seed_seeds_as_its_int_and_other_seeds_are_refused() -> None:
    pytest.importorskip("mpe2")
    batches = []
    for seed in (10, np.int64(10)):
        for native in (True, False):
            with make_vec("mpe2/simple_spread_v3", 2, seed=seed, native=native) as venv:
                batches.append(venv.reset().obs["agent"])
                batches.append(venv.reset(seed=seed).obs["agent"])
    for batch in batches[1:]:
        np.testing.assert_allclose(batch, batches[0], rtol=0, atol=1e-12)
    for bad in (-1, 1.5, True, "3"):
        with pytest.raises(
            ValueError, match=f"seed must be a non-negative integer or None, got {bad!r}"
        ):
            make_vec("corral/rps", 2, seed=bad)
        with make_vec("corral/rps", 2) as venv, pytest.raises(ValueError, match="seed must be"):
            venv.reset(seed=bad)


@pytest.mark.parametrize("flag", ["copy", "clip_actions", "check_finite", "deferred_checks"])
def test_a_flag_that_is_no_bool_is_refused(flag: str) -> None:
    with pytest.raises(TypeError, match=f"{flag} must be True or False, got 'no'"):
        make_vec("corral/rps", 2, **{flag: "no"})


def test_copy_false_returns_views_that_the_next_step_overwrites() -> None:
    venv = make_vec("corral/rps", 1, seed=0, copy=False)
    first = venv.reset()
    acting = first.acting["player"]
    venv.step({"player": np.zeros((1, 2), dtype=np.int64)})
    assert acting.tolist() == [[False, True]]
    venv.close()


def test_vector_env_from_user_constructors_and_group_map() -> None:
    venv = VectorEnv([lambda: corral.make("corral/rps")] * 2, group_map="agent")
    assert venv.groups == {"player_0": ("player_0",), "player_1": ("player_1",)}
    batch = venv.reset(seed=0)
    assert batch.obs["player_0"].shape[:2] == (2, 1)
    venv.close()


def test_state_is_opt_in_and_matches_each_envs_state() -> None:
    plain = make_vec("corral/tag", 2, seed=0)
    assert plain.state_space is None and plain.reset().state is None
    plain.close()
    venv = make_vec("corral/tag", 2, seed=0, state=True, native=False)  # to call state()
    batch = venv.reset()
    envs = [corral.make("corral/tag") for _ in range(2)]
    for i, env in enumerate(envs):
        env.reset(seed=i)
        np.testing.assert_array_equal(batch.state[i], env.state())
    rng = np.random.default_rng(0)
    for _ in range(60):
        batch = venv.step(venv.sample_actions(batch, rng))
        states = venv.call("state")
        for i in range(2):
            np.testing.assert_array_equal(batch.state[i], states[i])
        if batch.done.any():
            e = int(np.flatnonzero(batch.done)[0])
            assert not np.array_equal(batch.final_state[e], batch.state[e])
    venv.close()


def test_final_state_is_the_state_after_the_last_step() -> None:
    venv = make_vec("corral/tag", 1, seed=0, state=True)
    env = corral.make("corral/tag")
    batch, _ = venv.reset(), env.reset(seed=0)
    rng = np.random.default_rng(0)
    episodes = 0
    while episodes < 2:
        actions = venv.sample_actions(batch, rng)
        batch = venv.step(actions)
        env.step(
            {
                a: actions[g][0, j]
                for g, agents in venv.groups.items()
                for j, a in enumerate(agents)
                if a in env.agents
            }
        )
        if batch.done[0]:
            np.testing.assert_array_equal(batch.final_state[0], env.state())
            env.reset()
            episodes += 1
    venv.close()


def test_render_and_attributes_reach_every_env() -> None:
    venv = make_vec("corral/rps", 2, seed=0, state=True, env_kwargs={"render_mode": "ansi"})
    venv.reset()
    frames = venv.render()
    assert len(frames) == 2 and all(isinstance(f, str) for f in frames)
    venv.set_attr("marker", [1, 2])
    assert venv.get_attr("marker") == [1, 2]
    assert venv.call("state")[0].shape == venv.state_space.shape
    venv.close()


def test_envs_inside_a_vector_env_skip_their_own_action_checks() -> None:
    """The batch is validated once in the parent; each env need not check again."""
    assert corral.make("corral/rps").check_actions is True
    venv = make_vec("corral/rps", 2, seed=0)
    assert venv.get_attr("check_actions") == [False, False]
    venv.close()


@pytest.mark.parametrize("backend", BACKENDS)
def test_call_errors_are_env_errors_on_every_backend(backend: str, ray_session) -> None:
    """A missing method, a method that raises and a missing attribute: one error type."""
    # Dict envs: a natively batched env has no methods per copy to call.
    venv = make_vec("corral/tag", 3, backend, native=False, **_options(backend, ray_session))
    try:
        with pytest.raises(EnvError) as missing:
            venv.call("no_such_method")
        with pytest.raises(EnvError) as raising:
            venv.call("observation_space", "nobody")  # a KeyError inside the env
        with pytest.raises(EnvError) as attribute:
            venv.get_attr("no_such_attribute")
        assert venv.call("action_space", "prey_0") == [spaces.Discrete(9)] * 3  # still usable
    finally:
        venv.close()
    for info, text, cause in (
        (missing, "env 0: no_such_method() raised AttributeError", "no_such_method"),
        (raising, "env 0: observation_space() raised KeyError: 'nobody'", "KeyError"),
        (attribute, "env 0: reading attribute 'no_such_attribute' raised AttributeError", ""),
    ):
        assert type(info.value) is EnvError
        assert info.value.env_index == 0
        assert str(info.value).startswith(text)
        assert "Traceback" in info.value.remote_traceback and cause in info.value.remote_traceback


@pytest.mark.parametrize("backend", BACKENDS)
def test_episode_limit_and_source_attributes_reach_every_backend(backend: str, ray_session) -> None:
    pytest.importorskip("mpe2")
    kwargs = {"N": 2, "max_cycles": 7}
    options = _options(backend, ray_session)
    # The dict envs (mpe2's own): their attributes and their adapter's.
    venv = make_vec("mpe2/simple_spread_v3", 2, backend, native=False, env_kwargs=kwargs, **options)
    try:
        assert venv.max_episode_steps == 7
        assert venv.get_attr("max_cycles") == [7, 7]  # an attribute of the raw mpe2 env
        assert venv.get_attr("max_episode_steps") == [7, 7]
        assert callable(venv.get_attr("state")[0])  # get_attr reads methods, call calls them
        with pytest.raises(EnvError, match="has no attribute 'max_cyclez', nor has the"):
            venv.get_attr("max_cyclez")
        batch = venv.reset(seed=0)
        rng = np.random.default_rng(0)
        for _ in range(7):
            assert not batch.done.any()
            batch = venv.step(venv.sample_actions(batch, rng))
        assert batch.done.all() and batch.episode_length.tolist() == [7, 7]
    finally:
        venv.close()
    # The natively batched MPE: attributes of the batched env, one per copy.
    with make_vec("mpe2/simple_spread_v3", 2, backend, env_kwargs=kwargs, **options) as venv:
        assert venv.native and venv.max_episode_steps == 7
        assert venv.get_attr("max_cycles") == [7, 7]


def test_vector_env_without_an_episode_limit_says_none() -> None:
    venv = make_vec("corral/rps4", 1, env_kwargs={"num_cycles": 3})
    assert venv.max_episode_steps == 9
    venv.close()
    venv = VectorEnv([lambda: _make_or_skip("pettingzoo/classic/go_v5", {})])
    assert venv.max_episode_steps is None
    venv.close()


class JoiningEnv(corral.MultiAgentEnv):
    """``agent_0`` plays from the reset; ``agent_1`` joins (alive and acting) after step 2;
    ``agent_2`` joins ``agents`` after step 3 but first acts after step 4. Five steps."""

    possible_agents = ["agent_0", "agent_1", "agent_2"]

    def __init__(self) -> None:
        self.agents: list[str] = []
        self.t = 0

    def observation_space(self, agent: str) -> spaces.Box:
        return spaces.Box(0.0, 10.0, (1,), np.float32)

    def action_space(self, agent: str) -> spaces.Discrete:
        return spaces.Discrete(2)

    def reset(self, seed=None, options=None):
        self.t, self.agents = 0, ["agent_0"]
        return self._observe()

    def step(self, actions):
        corral.validate_actions(actions, self._acting(), self.action_space, {}, self.t)
        alive = list(self.agents)
        self.t += 1
        done = self.t == 5
        rewards = dict.fromkeys(alive, 1.0)
        terms, truncs = dict.fromkeys(alive, done), dict.fromkeys(alive, False)
        if done:
            final = np.full(1, self.t, np.float32)
            self.agents = []
            return {}, rewards, terms, truncs, {a: {"final_obs": final} for a in alive}
        self.agents = self.possible_agents[: 1 + (self.t >= 2) + (self.t >= 3)]
        obs, infos = self._observe()
        return obs, rewards, terms, truncs, infos

    def _acting(self) -> list[str]:
        return self.possible_agents[: 1 + (self.t >= 2) + (self.t >= 4)]

    def _observe(self) -> tuple[dict, dict]:
        acting = self._acting()
        return {a: np.full(1, self.t, np.float32) for a in acting}, {a: {} for a in acting}


@pytest.mark.parametrize("backend", ["sync", "subproc"])
def test_agents_that_join_mid_episode_are_alive(backend: str) -> None:
    assert corral.check_env(JoiningEnv()).ok  # joining keeps the contract
    cloudpickle.register_pickle_by_value(sys.modules[__name__])  # workers cannot import tests/
    venv = VectorEnv([JoiningEnv] * 2, backend)
    alive, acting = [], []
    batch = venv.reset(seed=0)
    for _ in range(6):
        alive.append(batch.alive["agent"][0].tolist())
        acting.append(batch.acting["agent"][0].tolist())
        assert not (batch.acting["agent"] & ~batch.alive["agent"]).any()
        batch = venv.step({"agent": np.zeros((2, 3), np.int64)})
    venv.close()
    F, T = False, True
    assert alive == [[T, F, F], [T, F, F], [T, T, F], [T, T, T], [T, T, T], [T, F, F]]
    assert acting == [[T, F, F], [T, F, F], [T, T, F], [T, T, F], [T, T, T], [T, F, F]]


def test_clip_actions_clips_box_actions_into_bounds_and_counts_them() -> None:
    pytest.importorskip("mpe2")
    kwargs = {"N": 2, "continuous_actions": True}  # Box(0, 1, (5,)) actions
    clipping = make_vec("mpe2/simple_spread_v3", 2, seed=0, clip_actions=True, env_kwargs=kwargs)
    plain = make_vec("mpe2/simple_spread_v3", 2, seed=0, env_kwargs=kwargs)
    clipping.reset(), plain.reset()
    actions = np.full((2, 2, 5), 0.5, np.float32)
    actions[0, 1, :2] = [1.7, -0.3]
    with pytest.raises(InvalidActionError, match=r"env 0, agent 'agent_1': expected values within"):
        plain.step({"agent": actions})
    actions[1, 0, 4] = np.inf  # clipped to the bound like any value past it
    batch = clipping.step({"agent": actions})
    assert batch.clipped_actions["agent"].tolist() == [[0, 2], [1, 0]]
    assert actions[0, 1, 0] == np.float32(1.7)  # the caller's array is left as it was
    want = plain.step({"agent": np.clip(actions, 0.0, 1.0)})
    np.testing.assert_array_equal(batch.obs["agent"], want.obs["agent"])
    assert not want.clipped_actions["agent"].any()
    batch = clipping.step({"agent": np.full((2, 2, 5), 0.5, np.float32)})
    assert not batch.clipped_actions["agent"].any()
    actions[1, 1, 0] = np.nan
    with pytest.raises(InvalidActionError, match=r"env 1, agent 'agent_1'.*finite"):
        clipping.step({"agent": actions})
    clipping.close(), plain.close()


@pytest.mark.parametrize(
    ("args", "kwargs", "said"),
    [
        # the env's keyword arguments passed as for corral.make: they read as backend options
        ((2,), {"N": 2}, "the env's keyword arguments go in env_kwargs, e.g. make_vec("),
        ((0,), {}, "num_envs must be an int of at least 1, got 0"),
        ((-1,), {}, "num_envs must be an int of at least 1, got -1"),
        ((2.0,), {}, "num_envs must be an int of at least 1, got 2.0"),
    ],
)
def test_make_vec_arguments_it_cannot_use_say_what_it_takes(
    args: tuple, kwargs: dict, said: str
) -> None:
    with pytest.raises(ValueError) as caught:
        make_vec("corral/tag", *args, **kwargs)
    assert said in str(caught.value)


def test_make_vec_takes_a_numpy_integer_count() -> None:
    with make_vec("corral/rps", np.int64(2)) as venv:
        assert venv.num_envs == 2
