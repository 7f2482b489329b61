"""corral/tag natively batched: step for step what E dict Tag envs give, packed into arrays."""

from __future__ import annotations

import contextlib
import doctest
import subprocess
import sys
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import pytest

import corral
from corral.arrays import Place, to_numpy
from corral.batched_env import BatchedStep
from corral.envs import tag_batched
from corral.envs.choices import Choices, StreamChoices
from corral.envs.tag import Tag
from corral.envs.tag_batched import BatchedTag
from corral.errors import InvalidActionError

PLACES = [
    pytest.param(("numpy", "cpu"), id="numpy"),
    pytest.param(("torch", "cpu"), id="torch-cpu"),  # computed by numpy on the tensors' memory
    pytest.param(("torch", "cpu", "by torch"), id="torch-cpu-by-torch"),  # draws from streams
    pytest.param(("torch", "cpu", "as on a GPU"), id="torch-cpu-device-path"),  # and reads none
    pytest.param(("torch", "cuda"), id="torch-cuda"),
]
KWARGS = [
    pytest.param({}, id="default"),
    pytest.param(
        {"num_predators": 3, "num_prey": 1, "size": 5, "max_cycles": 10}, id="3-predators-1-prey"
    ),
    pytest.param(
        {"num_predators": 1, "num_prey": 3, "size": 4, "max_cycles": 30, "walls": [(1, 1)]},
        id="1-predator-3-prey-walls",
    ),
]
FIELDS = ("obs", "alive", "acting", "action_mask", "reward", "terminated", "truncated")
NOT_ACTING = 99  # the action entry of an agent that is not acting: the env must ignore it


@pytest.fixture(params=PLACES)
def place(request: pytest.FixtureRequest) -> Iterator[tuple[str, ...]]:
    """``(array, device)``, and ``"by torch"`` where the env is told to compute by torch."""
    if request.param[0] == "torch":
        torch = pytest.importorskip("torch")  # imported here: collecting stays cheap
        if request.param[1] == "cuda" and not torch.cuda.is_available():
            pytest.skip("no CUDA GPU")
    as_on_a_gpu = request.param[2:] == ("as on a GPU",)  # the env follows the layer's path
    with corral.device_path() if as_on_a_gpu else contextlib.nullcontext():
        yield request.param


def placed(place: tuple[str, ...]) -> dict[str, Any]:
    """BatchedTag's keyword arguments for ``place`` (``host_views=False``: by torch)."""
    options: dict[str, Any] = {"array": place[0], "device": place[1]}
    if place[2:] == ("by torch",):
        options["host_views"] = False
    return options


class DictCopies:
    """E dict ``Tag`` envs packed into arrays by the vector layer's rules: the oracle."""

    def __init__(self, num_envs: int, **kwargs: Any) -> None:
        self.envs = [Tag(**kwargs) for _ in range(num_envs)]
        for env in self.envs:
            env.check_actions = False  # as inside a vector env, which checks them itself
        env = self.envs[0]
        grouped = corral.group_agents(env.possible_agents, env.observation_space, env.action_space)
        self.groups = {g: tuple(agents) for g, agents in grouped.items()}
        self.last_obs = {
            g: np.zeros((num_envs, len(agents), *env.observation_space(agents[0]).shape), "f4")
            for g, agents in self.groups.items()
        }
        self.obs: list[dict] = [{} for _ in self.envs]
        self.infos: list[dict] = [{} for _ in self.envs]

    def reset(self, seeds: Sequence[int | None], where: np.ndarray | None = None) -> dict:
        """Reset the copies ``where`` selects (all for ``None``), copy ``i`` with ``seeds[i]``."""
        rows = range(len(self.envs)) if where is None else np.flatnonzero(where)
        for i in rows:
            self.obs[i], self.infos[i] = self.envs[i].reset(seed=seeds[i])
            for last in self.last_obs.values():
                last[i] = 0.0  # an agent not in the reset obs reads zeros
            self._keep_obs(i, self.obs[i], {})
        return self.pack(None)

    def step(self, actions: dict[str, np.ndarray]) -> dict:
        results = []
        for i, env in enumerate(self.envs):
            chosen = {
                agent: int(actions[g][i, j])
                for g, agents in self.groups.items()
                for j, agent in enumerate(agents)
                if agent in self.obs[i]
            }
            obs, rewards, terms, truncs, infos = env.step(chosen)
            self._keep_obs(i, obs, infos)
            self.obs[i], self.infos[i] = obs, infos
            results.append((rewards, terms, truncs))
        return self.pack(results)

    def _keep_obs(self, i: int, obs: dict, infos: dict) -> None:
        """An agent's last observation: its entry of ``obs``, else its final one."""
        for g, agents in self.groups.items():
            for j, agent in enumerate(agents):
                if agent in obs:
                    self.last_obs[g][i, j] = obs[agent]
                elif "final_obs" in infos.get(agent, {}):
                    self.last_obs[g][i, j] = infos[agent]["final_obs"]

    def pack(self, results: list | None) -> dict:
        """The batch of the last call: ``results`` of a step, ``None`` after a reset."""
        out: dict[str, Any] = {f: {} for f in FIELDS}
        out["obs"] = {g: o.copy() for g, o in self.last_obs.items()}
        out["state"] = np.stack([env.state() for env in self.envs])
        for g, agents in self.groups.items():
            shape = (len(self.envs), len(agents))
            mask = np.ones((*shape, self.envs[0].action_space(agents[0]).n), bool)
            packed = {f: np.zeros(shape, bool) for f in ("alive", "acting", "terminated")}
            packed["truncated"], packed["reward"] = np.zeros(shape, bool), np.zeros(shape)
            for i, env in enumerate(self.envs):
                for j, agent in enumerate(agents):
                    packed["alive"][i, j] = agent in env.agents
                    packed["acting"][i, j] = agent in self.obs[i]
                    if agent in self.obs[i]:
                        mask[i, j] = self.infos[i][agent]["action_mask"].astype(bool)
                    if results is not None:
                        for f, values in zip(
                            ("reward", "terminated", "truncated"), results[i], strict=True
                        ):
                            packed[f][i, j] = values.get(agent, 0)
            out["action_mask"][g] = mask
            for f, value in packed.items():
                out[f][g] = value
        if results is None:
            out["reward"] = out["terminated"] = out["truncated"] = None
        return out


def assert_same(
    got: BatchedStep, expected: dict, place: tuple[str, str], when: object, rows: Any = slice(None)
) -> None:
    """Every field equal bit for bit in ``rows``, of the same dtype, in the env's namespace
    and device."""
    for field in (*FIELDS, "state"):
        want, have = expected[field], getattr(got, field)
        if want is None:
            assert have is None, f"{when}: {field} should be None"
            continue
        pairs = (
            [(field, want, have)]
            if field == "state"
            else [(f"{field}[{g!r}]", want[g], have[g]) for g in want]
        )
        assert field == "state" or set(have) == set(want), f"{when}: {field} groups"
        for name, w, h in pairs:
            if place[0] == "torch":
                assert h.device.type == place[1], f"{when}: {name} on {h.device}"
            else:
                assert isinstance(h, np.ndarray), f"{when}: {name} is a {type(h)}"
            h, w = to_numpy(h)[rows], w[rows]
            assert h.dtype == w.dtype and h.shape == w.shape, f"{when}: {name} {h.dtype} {h.shape}"
            if h.tobytes() != w.tobytes():
                np.testing.assert_array_equal(h, w, err_msg=f"{when}: {name}")
                raise AssertionError(f"{when}: {name} differs in its bits (a signed zero?)")


def scribble(got: BatchedStep) -> None:
    """Overwrite every returned array: the env must not read them again."""
    for field in FIELDS:
        for value in (getattr(got, field) or {}).values():
            value[...] = 1
    got.state[...] = 1


def random_actions(rng: np.random.Generator, expected: dict) -> dict[str, np.ndarray]:
    """A uniformly random legal action of every acting agent; junk for the others."""
    actions = {}
    for g, mask in expected["action_mask"].items():
        score = np.where(mask, rng.random(mask.shape), -1.0)
        actions[g] = np.where(expected["acting"][g], score.argmax(-1), NOT_ACTING)
    return actions


def on(place: tuple[str, str], value: np.ndarray) -> Any:
    if place[0] == "numpy":
        return value
    import torch

    return torch.as_tensor(value, device=place[1])


@pytest.mark.parametrize("kwargs", KWARGS)
def test_steps_exactly_as_dict_envs_with_autoreset(place: tuple[str, str], kwargs: dict) -> None:
    num_envs, seed = 8, 17
    env = BatchedTag(num_envs, **placed(place), **kwargs)
    oracle = DictCopies(num_envs, **kwargs)
    got = env.reset(seed=seed)
    assert_same(got, oracle.reset([seed + i for i in range(num_envs)]), place, "reset")
    rng = np.random.default_rng(seed)
    expected = oracle.pack(None)
    died_early = all_caught = timed_out = 0
    for t in range(300):
        actions = random_actions(rng, expected)
        got = env.step({g: on(place, a) for g, a in actions.items()})
        expected = oracle.step(actions)
        assert_same(got, expected, place, f"step {t}")
        scribble(got)
        ended = expected["terminated"]["predator"][:, 0]
        died_early += int((expected["reward"]["prey"][~ended] < 0).sum())
        all_caught += int(ended.sum())
        timed_out += int(expected["truncated"]["predator"][:, 0].sum())
        done = ~np.concatenate(list(expected["alive"].values()), 1).any(1)
        if done.any():
            got = env.reset(where=on(place, done))
            expected = oracle.reset([None] * num_envs, where=done)
            assert_same(got, expected, place, f"reset after step {t}", rows=done)
            scribble(got)
    # The run saw episodes end both ways (then unseeded resets), and prey die mid-episode.
    assert all_caught > 0 and timed_out > 0
    assert died_early > 0 or kwargs.get("num_prey") == 1


def test_reset_where_leaves_the_other_copies_running(place: tuple[str, str]) -> None:
    kwargs = {"max_cycles": 8, "num_prey": 3}
    env = BatchedTag(4, **placed(place), **kwargs)
    oracle = DictCopies(4, **kwargs)
    expected = oracle.reset([3, 4, 5, 6])
    assert_same(env.reset(seed=3), expected, place, "reset")
    rng = np.random.default_rng(0)
    for t in range(12):
        if t == 5:
            where = np.array([False, True, False, False])
            got = env.reset(seed=[None, 11, 12, None], where=on(place, where))
            expected = oracle.reset([None, 11, 12, None], where=where)
            assert_same(got, expected, place, "reset of copy 1 with seed 11", rows=where)
        actions = random_actions(rng, expected)
        expected = oracle.step(actions)
        assert_same(env.step({g: on(place, a) for g, a in actions.items()}), expected, place, t)
        if t == 7:  # copies 0, 2 and 3 are out of time, copy 1 is not
            truncated = expected["truncated"]["predator"][:, 0]
            assert truncated.tolist() == [True, False, True, True]
            break


def test_a_copy_stepped_after_its_episode_ended_changes_nothing_as_the_dict_env(
    place: tuple[str, str],
) -> None:
    """Not the vector layer's way (it resets first), but a dict env that does not check
    actions allows it: no agent ends again, nothing moves, nobody earns."""
    kwargs = {"max_cycles": 3, "num_prey": 2}
    env = BatchedTag(3, **placed(place), **kwargs)
    oracle = DictCopies(3, **kwargs)
    expected = oracle.reset([5, 6, 7])
    assert_same(env.reset(seed=5), expected, place, "reset")
    rng = np.random.default_rng(1)
    for t in range(6):  # the episodes end at step 3 at the latest
        actions = random_actions(rng, expected)
        expected = oracle.step(actions)
        assert_same(env.step({g: on(place, a) for g, a in actions.items()}), expected, place, t)
    assert not any(a.any() for a in expected["alive"].values())


def test_written_into_a_batch_it_steps_exactly_as_dict_envs(place: tuple[str, str]) -> None:
    """After write_into, every reset and step fills the arrays given (and returns them), with
    the values the fresh arrays have; arrays that do not fit are refused."""
    kwargs = {"max_cycles": 12, "num_prey": 3}
    with corral.make_vec(
        "corral/tag", 6, array=place[0], device=place[1], state=True, env_kwargs=kwargs
    ) as venv:
        arrays = venv.layout.allocate()
    env = BatchedTag(6, **placed(place), **kwargs)
    bad = dict(arrays, **{"obs/prey": arrays["obs/prey"][:, :1]})  # one prey too few
    assert not env.write_into(bad) and not env.write_into({})
    assert env.write_into(arrays)
    oracle = DictCopies(6, **kwargs)
    got, expected = env.reset(seed=5), oracle.reset([5 + i for i in range(6)])
    assert got.obs["prey"] is arrays["obs/prey"] and got.state is arrays["state"]
    assert_same(got, expected, place, "reset")
    rng = np.random.default_rng(2)
    ended = 0
    for t in range(40):
        actions = random_actions(rng, expected)
        got = env.step({g: on(place, a) for g, a in actions.items()})
        expected = oracle.step(actions)
        assert got.reward["predator"] is arrays["reward/predator"]
        assert_same(got, expected, place, f"step {t}")
        done = ~np.concatenate(list(expected["alive"].values()), 1).any(1)
        if done.any():
            ended += int(done.sum())
            got = env.reset(where=on(place, done))
            expected = oracle.reset([None] * 6, where=done)
            assert_same(got, expected, place, f"reset after step {t}", rows=done)
            for field in FIELDS[:4]:  # the resets' rows merged into the batch, as a vector env
                for g, value in getattr(got, field).items():
                    expected[field][g][~done] = to_numpy(value)[~done]
    assert ended >= 6


@pytest.mark.parametrize(("array", "device"), [("numpy", "cpu"), ("torch", "cpu")])
def test_an_invalid_action_through_make_vec_names_group_env_and_agent(array, device) -> None:
    """Out of range, or forbidden by the mask: raised naming the agent, and the env goes on;
    the entries of agents that are not acting are ignored."""
    if array == "torch":
        pytest.importorskip("torch")
    with corral.make_vec("corral/tag", 5, seed=1, array=array, device=device) as venv:
        batch = venv.reset()
        rng = np.random.default_rng(0)
        masks = {g: to_numpy(m) for g, m in batch.action_mask.items()}
        legal = {g: m.argmax(-1) for g, m in masks.items()}

        def with_entry(group: str, env: int, agent: int, action: int) -> dict:
            actions = {g: a.copy() for g, a in legal.items()}
            actions[group][env, agent] = action
            return {g: on((array, device), a) for g, a in actions.items()}

        env, agent = np.argwhere(~masks["predator"].all(-1))[0]
        forbidden = int(np.flatnonzero(~masks["predator"][env, agent])[0])
        with pytest.raises(
            InvalidActionError,
            match=rf"group 'predator', env {env}, agent 'predator_{agent}': expected a legal",
        ):
            venv.step(with_entry("predator", env, agent, forbidden))
        with pytest.raises(
            InvalidActionError, match=r"group 'prey', env 3, agent 'prey_1': expected an integer"
        ):
            venv.step(with_entry("prey", 3, 1, 9))
        for _ in range(60):  # until some prey is caught: its entry is ignored
            batch = venv.step({g: on((array, device), a) for g, a in legal.items()})
            masks = {g: to_numpy(m) for g, m in batch.action_mask.items()}
            legal = {g: np.where(m, rng.random(m.shape), -1).argmax(-1) for g, m in masks.items()}
            idle = np.argwhere(~to_numpy(batch.acting["prey"]))
            if len(idle):
                break
        assert len(idle), "no prey was caught"
        assert masks["prey"][tuple(idle[0])].all()  # an agent not acting: every action legal
        venv.step(with_entry("prey", *idle[0], 99))


def test_has_the_dict_envs_agents_spaces_and_groups() -> None:
    kwargs = {"num_predators": 3, "num_prey": 2, "size": 6, "max_cycles": 9}
    env, tag = BatchedTag(2, **kwargs), Tag(**kwargs)
    assert env.possible_agents == tag.possible_agents
    for agent in tag.possible_agents:
        assert env.observation_space(agent) == tag.observation_space(agent)
        assert env.action_space(agent) == tag.action_space(agent)
    assert env.state_space == tag.state_space
    assert env.max_episode_steps == tag.max_episode_steps == 9
    assert env.metadata["name"] == tag.metadata["name"]
    assert env.metadata["render_modes"] == []
    grouped = corral.group_agents(tag.possible_agents, tag.observation_space, tag.action_space)
    assert env.groups == {g: tuple(agents) for g, agents in grouped.items()}
    assert list(env.groups) == ["predator", "prey"]


def test_the_registry_builds_it() -> None:
    assert "corral/tag" in corral.batched_ids()
    env = corral.spec("corral/tag").make_batched(8)
    assert isinstance(env, BatchedTag) and env.num_envs == 8 and env.array == "numpy"
    env = corral.spec("corral/tag").make_batched(3, num_prey=1)
    assert env.reset(seed=0).obs["prey"].shape == (3, 1, 2 + 2 * 2)


def test_importing_tag_imports_neither_the_batched_env_nor_torch() -> None:
    code = (
        "import sys, corral.envs.tag\n"
        "assert 'corral.envs.tag_batched' not in sys.modules\n"
        "corral.spec('corral/tag').make_batched(2).reset(seed=0)\n"
        "assert 'torch' not in sys.modules, 'array=numpy imported torch'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"render_mode": "rgb_array"}, ValueError, "cannot render.*native=False"),
        ({"num_envs": 0}, ValueError, "num_envs must be at least 1, got 0"),
        ({"num_envs": 2.0}, TypeError, "num_envs must be an int"),
        ({"num_prey": 0}, ValueError, "at least one predator and one prey"),
        ({"size": 1}, ValueError, "size >= 2"),
        ({"walls": [(7, 0)]}, ValueError, r"wall \(7, 0\) is outside"),
        ({"array": "jax"}, ValueError, "array must be one of"),
        ({"device": "cuda"}, ValueError, "numpy arrays live on the CPU"),
        ({"speed": 2}, TypeError, "speed"),
    ],
)
def test_bad_arguments_raise_clearly(kwargs: dict, error: type, match: str) -> None:
    kwargs = {"num_envs": 2, **kwargs}
    with pytest.raises(error, match=match):
        BatchedTag(**kwargs)


def test_bad_actions_raise_clearly() -> None:
    env = BatchedTag(4)
    env.reset(seed=0)
    with pytest.raises(KeyError, match="no entry for group 'prey'"):
        env.step({"predator": np.zeros((4, 2), int)})
    with pytest.raises(ValueError, match=r"actions\['prey'\] has shape \(4,\), expected \(4, 2\)"):
        env.step({"predator": np.zeros((4, 2), int), "prey": np.zeros(4, int)})


@pytest.mark.parametrize("exact", [True, False], ids=["as-arrays", "one-call-per-copy"])
@pytest.mark.parametrize(("m", "n"), [(45, 4), (4, 4), (1, 1), (2**31 + 5, 3)])
def test_choices_draw_what_generator_choice_draws(m: int, n: int, exact: bool) -> None:
    """Copy by copy, across draws, a reseeded copy and (for 2**31 + 5) Lemire's rejections."""
    choices = Choices(5, m, n)
    assert choices.exact, "numpy now draws Generator.choice differently: Choices is slow"
    choices.exact = exact
    ours = [np.random.default_rng(seed) for seed in range(5)]
    theirs = [np.random.default_rng(seed) for seed in range(5)]
    for draw in range(60):
        if draw == 30:
            ours[2], theirs[2] = np.random.default_rng(99), np.random.default_rng(99)
        rows = np.arange(5) if draw % 3 else np.array([1, 2, 4])  # some copies only
        got = choices.choose([ours[i] for i in rows], rows)
        expected = [theirs[i].choice(m, size=n, replace=False) for i in rows]
        assert got.tolist() == np.stack(expected, 1).tolist(), f"draw {draw}"


def test_on_the_layers_device_path_it_reads_and_copies_nothing_from_the_host(
    as_on_a_gpu: None,
) -> None:
    """Built inside ``corral.device_path()`` it computes in torch as on a GPU: steps and
    unseeded resets of the copies a device mask selects read nothing back and copy nothing
    over."""
    torch = pytest.importorskip("torch")
    from support.host_reads import counting_reads, counting_transfers

    env = BatchedTag(5, array="torch", max_cycles=4, num_prey=3, size=4)
    env.reset(seed=0)
    rng = np.random.default_rng(0)
    plan = [
        (
            {g: torch.as_tensor(rng.integers(0, 5, (5, len(a)))) for g, a in env.groups.items()},
            torch.as_tensor(rng.random(5) < 0.5),
        )
        for _ in range(10)
    ]
    with counting_reads() as reads, counting_transfers() as copies:
        for actions, where in plan:
            env.step(actions)
            env.reset(where=where)
    assert reads == {} and copies == {}, (reads, copies)


@pytest.mark.parametrize(("host_views", "by_torch"), [(None, False), (False, True), (True, False)])
def test_host_views_tells_it_how_to_compute_on_torch_cpu_tensors(host_views, by_torch) -> None:
    """``host_views=False`` computes by torch (nothing copied from the host) on a place that
    computes through numpy views; ``None`` follows the place; through make_vec too."""
    torch = pytest.importorskip("torch")
    from support.host_reads import counting_transfers

    kwargs = {"max_cycles": 4, "num_prey": 3, "size": 4, "host_views": host_views}
    with corral.make_vec("corral/tag", 5, array="torch", env_kwargs=kwargs) as venv:
        assert venv.place.host_views  # the place is the layer's: it keeps its numpy views
    env = BatchedTag(5, array="torch", **kwargs)
    env.reset(seed=0)
    rng = np.random.default_rng(0)
    plan = [
        {g: torch.as_tensor(rng.integers(0, 5, (5, len(a)))) for g, a in env.groups.items()}
        for _ in range(5)
    ]
    with counting_transfers() as copies:
        for actions in plan:
            env.step(actions)
    assert (copies == {}) == by_torch, copies  # by numpy: its results copied into tensors


@pytest.mark.parametrize("on_a_device", [False, True], ids=["host", "device-path"])
@pytest.mark.parametrize(("m", "n"), [(45, 4), (4, 4), (1, 1), (2**31 + 5, 3)])
def test_stream_choices_draw_what_generator_choice_draws(m: int, n: int, on_a_device: bool) -> None:
    """Copy by copy, across draws, with copies left out and a reseeded copy, (for 2**31 + 5)
    through Lemire's rejections: words read ahead until enough on the host, as many as
    make too few unlikely on a device (where nothing is read)."""
    torch = pytest.importorskip("torch")
    from corral.arrays import CopyStreams

    streams = CopyStreams(5, Place("torch", "cpu"))
    streams.seed(list(range(5)))
    choose = StreamChoices(streams, m, n, check=not on_a_device)
    if not on_a_device:
        choose.extra = 0  # too few words at first where one is skipped: more are read
    elif m == 2**31 + 5:
        assert choose.extra > 50  # about half the words are skipped
    theirs = [np.random.default_rng(seed) for seed in range(5)]
    for draw in range(40):
        if draw == 20:
            streams.seed([None, None, 99, None, None])
            theirs[2] = np.random.default_rng(99)
        rows = np.arange(5) if draw % 3 else np.array([1, 2, 4])  # some copies only
        where = torch.from_numpy(np.isin(np.arange(5), rows))
        got = choose(None if draw % 3 else where).numpy()[:, rows]
        expected = [theirs[i].choice(m, size=n, replace=False) for i in rows]
        assert got.tolist() == np.stack(expected, 1).tolist(), f"draw {draw}"


def test_doctests_pass() -> None:
    result = doctest.testmod(tag_batched, optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0 and result.failed == 0
