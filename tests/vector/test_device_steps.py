"""The vector layer on a device: a step reads nothing back to the host.

Where the layer computes in torch off the CPU (a GPU), ``VectorEnv.step`` of a
natively batched env ends and restarts episodes with masked blends (no read of
which copies ended) and, with ``deferred_checks=True``, checks actions without
reading them back. A CPU-only machine runs that path for what is built inside
``corral.device_path()`` ("as on a GPU"): the tests count the calls that
would synchronise a GPU (:mod:`support.host_reads`), reads back to the host and copies
from it, and compare the batches with the host path's, step by step. CUDA variants run under
``torch.cuda.set_sync_debug_mode("error")`` where a GPU is present.
"""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from support.host_reads import counting_reads, counting_transfers  # noqa: E402
from support.marks import needs_cuda  # noqa: E402

import corral  # noqa: E402
from corral.adapters.catalog import _MPE2_BATCHED  # noqa: E402
from corral.arrays import to_numpy  # noqa: E402
from corral.errors import InvalidActionError  # noqa: E402

CUDA = needs_cuda


@contextlib.contextmanager
def no_sync(device: str):
    """On CUDA, any call that synchronises the device raises."""
    if device != "cuda":
        yield
        return
    torch.cuda.set_sync_debug_mode("error")
    try:
        yield
    finally:
        torch.cuda.set_sync_debug_mode("default")


def legal_actions(venv: corral.VectorEnv, batch: Any, rng: np.random.Generator) -> dict:
    """Random actions legal under ``batch``'s masks, as numpy arrays (drawn on the host)."""
    out = {}
    for g, agents in venv.groups.items():
        space, shape = venv.action_space(g), (venv.num_envs, len(agents))
        if g in batch.action_mask:
            scores = rng.random((*shape, space.n)) * to_numpy(batch.action_mask[g])
            out[g] = scores.argmax(-1) + int(space.start)
        else:
            out[g] = rng.uniform(space.low, space.high, (*shape, *space.shape)).astype(space.dtype)
    return out


def planned_actions(venv: corral.VectorEnv, batch: Any, device: str, steps: int):
    """A function of a step's index and the latest batch giving legal actions on ``device``
    with no host read or copy: random priorities drawn beforehand, on ``device``, times the
    latest masks (a group without masks takes actions drawn beforehand)."""
    rng = np.random.default_rng(0)
    plan = [on(device, legal_actions(venv, batch, rng)) for _ in range(steps)]
    priorities = {
        g: torch.as_tensor(rng.random((steps, *mask.shape)), device=device)
        for g, mask in batch.action_mask.items()
    }

    def actions(t: int, batch: Any) -> dict:
        masked = {g: (p[t] * batch.action_mask[g]).argmax(-1) for g, p in priorities.items()}
        return {**plan[t], **masked}

    return actions


def on(device: str, actions: dict) -> dict:
    return {g: torch.as_tensor(a, device=device) for g, a in actions.items()}


def fields(batch: Any) -> dict[str, np.ndarray]:
    """Every array of a batch, by its path, on the host."""
    out: dict[str, np.ndarray] = {}

    def walk(path: str, value: Any) -> None:
        if isinstance(value, dict):
            for key, sub in value.items():
                walk(f"{path}/{key}", sub)
        elif isinstance(value, (tuple, list)):
            for key, sub in enumerate(value):
                walk(f"{path}/{key}", sub)
        elif value is not None:
            out[path] = to_numpy(value)

    for field in dataclasses.fields(batch):
        walk(field.name, getattr(batch, field.name))
    return out


# -- no host read per step ------------------------------------------------------------

STEPPED = [
    pytest.param("mpe2/simple_spread_v3", {}, id="simple_spread"),
    pytest.param("mpe2/simple_spread_v3", {"continuous_actions": True}, id="spread-continuous"),
    pytest.param("mdp/climbing", {}, id="climbing"),
    pytest.param("mdp/multi_round_nmdp", {}, id="multi_round_nmdp"),  # chance: streams
    pytest.param("corral/tag", {"size": 4, "max_cycles": 12}, id="tag"),  # draws, dying prey
]


COPIED = [
    pytest.param("mpe2/simple_spread_v3", {}, "float32", id="simple_spread-float32"),
    pytest.param("mpe2/simple_spread_v3", {}, "float64", id="simple_spread-float64"),
    pytest.param(
        "mpe2/simple_spread_v3", {"continuous_actions": True}, "float32", id="continuous-float32"
    ),
    pytest.param(
        "mpe2/simple_spread_v3", {"continuous_actions": True}, "float64", id="continuous-float64"
    ),
    pytest.param("mdp/climbing", {}, None, id="climbing"),
    pytest.param("mdp/multi_round_nmdp", {}, None, id="multi_round_nmdp"),
    pytest.param("corral/tag", {"size": 4, "max_cycles": 12}, None, id="tag"),
]


def stepped_reads(id: str, env_kwargs: dict, device: str, steps: int = 100, **settings) -> tuple:
    """The host reads of ``steps`` vector steps of ``id`` (4 copies) with legal actions
    placed on ``device`` beforehand, and how many episodes ended."""
    venv = corral.make_vec(
        id, 4, array="torch", device=device, seed=0, env_kwargs=env_kwargs, **settings
    )
    batch = venv.reset(seed=0)
    actions = planned_actions(venv, batch, device, steps)
    ended = []
    with counting_reads() as counts, no_sync(device):
        for t in range(steps):
            batch = venv.step(actions(t, batch))
            ended.append(batch.done)
    venv.close()
    return counts, int(sum(int(d.sum()) for d in ended))


@pytest.mark.parametrize(("id", "env_kwargs"), STEPPED)
def test_a_step_reads_nothing_back_on_a_device(as_on_a_gpu, id, env_kwargs):
    counts, ended = stepped_reads(id, env_kwargs, "cpu", deferred_checks=True)
    assert ended >= 4 * 3  # several autoresets of every copy
    assert counts == {}, counts


@pytest.mark.parametrize("inside", [True, False], ids=["built-inside", "built-outside"])
def test_what_is_built_inside_device_path_keeps_it_after_the_block(inside):
    # the vector layer and corral/tag on the device path: no read, no copy from the host
    with corral.device_path() if inside else contextlib.nullcontext():
        venv = corral.make_vec(
            "corral/tag", 4, array="torch", seed=0, deferred_checks=True,
            env_kwargs={"size": 4, "max_cycles": 12},
        )  # fmt: skip
    batch = venv.reset(seed=0)
    actions = planned_actions(venv, batch, "cpu", 40)
    with counting_reads() as reads, counting_transfers() as copies:
        for t in range(40):
            batch = venv.step(actions(t, batch))
    venv.close()
    if inside:
        assert reads == {} and copies == {}, (reads, copies)
    else:  # the host path
        assert sum(reads.values()) >= 40, reads  # the actions, read through numpy views
    assert venv.place is venv.layout.place and venv.place.host_views is not inside


@CUDA
@pytest.mark.parametrize(("id", "env_kwargs", "dtype"), COPIED)
def test_on_cuda_a_step_never_synchronises(id, env_kwargs, dtype):
    # no read back, and no copy from the host (a copy that is not asynchronous synchronises)
    settings = {} if dtype is None else {"dtype": dtype}
    counts, ended = stepped_reads(id, env_kwargs, "cuda", deferred_checks=True, **settings)
    assert ended >= 4 * 3 and counts == {}, counts


def test_without_deferred_checks_the_action_checks_read_the_host(as_on_a_gpu):
    # the counter sees the vector layer's reads: immediate checks read every step
    counts, _ = stepped_reads("mdp/climbing", {}, "cpu", steps=10)
    assert sum(counts.values()) >= 10
    assert all(key.startswith("corral.spaces") for key in counts), counts


# -- no copy from the host per step ----------------------------------------------------


@pytest.mark.parametrize(("id", "env_kwargs", "dtype"), COPIED)
def test_a_step_copies_nothing_from_the_host_on_a_device(as_on_a_gpu, id, env_kwargs, dtype):
    settings = {} if dtype is None else {"dtype": dtype}
    venv = corral.make_vec(
        id, 4, array="torch", seed=0, env_kwargs=env_kwargs, deferred_checks=True, **settings
    )
    batch = venv.reset(seed=0)
    actions = planned_actions(venv, batch, "cpu", 100)
    ended = []
    with counting_transfers() as counts:
        for t in range(100):
            batch = venv.step(actions(t, batch))
            ended.append(batch.done)
    venv.close()
    assert sum(int(d.sum()) for d in ended) >= 4 * 3  # several autoresets of every copy
    assert counts == {}, counts


@pytest.mark.parametrize("name", sorted(_MPE2_BATCHED))
def test_no_native_mpe_scenario_reads_or_copies_the_host_per_step(as_on_a_gpu, name):
    venv = corral.make_vec(
        f"mpe2/{name}", 3, array="torch", seed=0, env_kwargs={"max_cycles": 6},
        deferred_checks=True,
    )  # fmt: skip
    batch = venv.reset(seed=0)
    rng = np.random.default_rng(0)
    plan = [on("cpu", legal_actions(venv, batch, rng)) for _ in range(14)]
    with counting_reads() as reads, counting_transfers() as copies:
        for actions in plan:  # two autoresets of every copy
            venv.step(actions)
    venv.close()
    assert copies == {} and reads == {}, (copies, reads)


def test_simple_lines_second_landmark_on_a_device_is_the_hosts(monkeypatch):
    # many resets: the landmark turned (up to its most turns) as on the host, read nothing
    from corral.envs.mpe.simple_line import BatchedSimpleLine

    venvs = [
        venv_of("mpe2/simple_line_v1", {"dtype": "float64"}, device_path)
        for device_path in (False, True)
    ]
    on_device, turned = BatchedSimpleLine._second_on_device, []

    def counting_turns(self, first, theta):
        start = first + self.TOTAL_SEP * torch.stack([theta.cos(), theta.sin()], 1)
        turned.append((start.abs() >= 1.0).any(1).sum())  # outside before turning
        return on_device(self, first, theta)

    monkeypatch.setattr(BatchedSimpleLine, "_second_on_device", counting_turns)
    seeds = range(40)
    with counting_reads() as reads:
        states = [venvs[1].reset(seed=seed).state for seed in seeds]
    assert reads == {}, reads
    for seed, state in zip(seeds, states, strict=True):
        np.testing.assert_array_equal(to_numpy(state), to_numpy(venvs[0].reset(seed=seed).state))
    assert int(sum(turned)) >= 20  # copies whose landmark turned
    for venv in venvs:
        venv.close()


def test_simple_line_never_needs_more_turns_than_its_device_path_tries():
    # mpe2's loop, at the corners of the first landmark's square (the longest arcs outside)
    from corral.envs.mpe.simple_line import BatchedSimpleLine

    most = 0
    for first in [(0.25, 0.25), (-0.25, 0.25), (0.25, -0.25), (-0.25, -0.25), (0.0, 0.0)]:
        for theta in np.linspace(0.0, 2 * np.pi, 3600, endpoint=False):
            turns = 0
            while True:
                loc = np.array(first) + BatchedSimpleLine.TOTAL_SEP * np.array(
                    [np.cos(theta), np.sin(theta)]
                )
                if abs(loc[0]) < 1.0 and abs(loc[1]) < 1.0:
                    break
                theta, turns = theta + np.radians(5), turns + 1
            most = max(most, turns)
    assert 38 <= most <= BatchedSimpleLine.MAX_TURNS


@pytest.mark.parametrize(
    "copy",
    [
        lambda t, m: torch.tensor([1.0, 2.0], device=t.device),
        lambda t, m: torch.tensor(0.5, device=t.device),
        lambda t, m: torch.as_tensor(np.zeros(3), device=t.device),
        lambda t, m: torch.from_numpy(np.zeros(3)).to(t.device),
        lambda t, m: torch.zeros(3).to(t.device),
        lambda t, m: torch.from_numpy(np.zeros(3)).float().cuda(),
        lambda t, m: t.new_tensor([1.0]),
        lambda t, m: t[[0, 2]],
        lambda t, m: t[np.array([0, 2])],
        lambda t, m: t[None][:, [0, 1]],
        lambda t, m: t[torch.tensor([0, 2])],
        lambda t, m: t.__setitem__(m, torch.from_numpy(np.ones(2, np.float32))),
        lambda t, m: torch.where(m, t, torch.from_numpy(np.ones(3, np.float32))),
        lambda t, m: t + torch.ones(3),
        lambda t, m: t.copy_(torch.from_numpy(np.ones(3, np.float32))),
    ],
    ids=lambda _: "",
)
def test_the_counter_sees_every_copy_from_the_host(copy, monkeypatch):
    values, flags = torch.zeros(3), torch.tensor([True, False, True])
    monkeypatch.setattr(torch.Tensor, "cuda", lambda t: t.to("cpu"), raising=True)
    with counting_transfers() as counts:
        copy(values, flags)
        # not copies: kernels with Python numbers, device indices and device data, work on
        # the host alone, and asynchronous copies (from pinned memory on a GPU)
        values * 2.0, torch.where(flags, values, 0.0), values.to(torch.float64)
        torch.full((2,), 0.5, device="cpu"), torch.arange(3, device="cpu")
        values[torch.arange(2, device="cpu")], values[0], values[1:], values[flags]
        torch.as_tensor(values, device="cpu"), torch.zeros(2, device="cpu").shape
        torch.log(torch.rand(4).clamp_(min=1e-20)), values * torch.tensor(2.0)
        values + torch.rand(3).to("cpu", non_blocking=True)
    assert sum(counts.values()) == 1, counts


@pytest.mark.parametrize(
    "read",
    [
        lambda t: t.nonzero(),
        lambda t: torch.nonzero(t),
        lambda t: t.argwhere(),
        lambda t: torch.masked_select(t, t),
        lambda t: t.unique(),
        lambda t: torch.where(t),
        lambda t: t[t],
        lambda t: t.__setitem__(t, False),
        lambda t: t[(t, ...)],
        lambda t: bool(t.any()),
        lambda t: t.tolist(),
    ],
    ids=lambda _: "",
)
def test_the_counter_sees_every_call_that_would_synchronise(read):
    flags = torch.tensor([True, False, True])
    with counting_reads() as counts:
        read(flags)
        flags.where(flags, flags)  # not a read: two-argument forms and masked blends
        torch.where(flags, flags, ~flags)
        flags.masked_fill_(flags, True)
        _ = flags[torch.tensor([0, 2])]
    assert sum(counts.values()) == 1, counts


# -- the device path gives the host path's batches -------------------------------------

DIFFERENTIAL = [
    pytest.param("mpe2/simple_spread_v3", {"max_cycles": 7}, id="simple_spread"),
    pytest.param(
        "mpe2/simple_spread_v3", {"max_cycles": 5, "continuous_actions": True}, id="continuous"
    ),
    pytest.param("mdp/climbing", {}, id="climbing"),
    pytest.param("mdp/multi_round_nmdp", {}, id="multi_round_nmdp"),
    pytest.param("corral/tag", {"size": 4, "max_cycles": 12}, id="tag"),
    pytest.param("corral/tag", {"num_prey": 3, "size": 5, "max_cycles": 9}, id="tag-3-prey"),
]


def venv_of(id: str, env_kwargs: dict, device_path: bool, **settings):
    """``id``'s copies on torch CPU tensors, built on the device path or the host path."""
    with corral.device_path() if device_path else contextlib.nullcontext():
        return corral.make_vec(
            id, 6, array="torch", seed=0, state=True, env_kwargs=env_kwargs, **settings
        )


def tag_by_torch(id: str, env_kwargs: dict) -> dict:
    """``env_kwargs``, with corral/tag computing by torch on either path."""
    return {**env_kwargs, "host_views": False} if id == "corral/tag" else env_kwargs


@pytest.mark.parametrize(("id", "env_kwargs"), DIFFERENTIAL)
def test_the_device_path_gives_the_host_paths_batches(id, env_kwargs):
    kwargs = {**env_kwargs, "dtype": "float64"} if id.startswith("mpe2/") else env_kwargs
    kwargs = tag_by_torch(id, kwargs)  # corral/tag by torch in both
    host = venv_of(id, kwargs, False)
    device = venv_of(id, kwargs, True, deferred_checks=True)
    batches = [venv.reset(seed=3) for venv in (host, device)]
    rng = np.random.default_rng(1)
    partly = 0  # steps in which some copies ended and others went on
    for t in range(60):
        actions = on("cpu", legal_actions(host, batches[0], rng))
        batches = [venv.step(actions) for venv in (host, device)]
        want, got = (fields(batch) for batch in batches)
        assert want.keys() == got.keys()
        for path in want:
            np.testing.assert_array_equal(got[path], want[path], err_msg=f"step {t}: {path}")
        done = want["done"]
        partly += bool(done.any() and not done.all())
    if id in ("mdp/multi_round_nmdp", "corral/tag"):  # copies end apart: masks blend
        assert partly >= 3
    for venv in (host, device):
        venv.close()


# -- deferred checks ------------------------------------------------------------------


def forbidden_entry(batch: Any, group: str) -> tuple[int, int, int]:
    """An acting ``(env, agent)`` of ``group`` and an action its mask forbids, env >= 1."""
    mask, acting = to_numpy(batch.action_mask[group]), to_numpy(batch.acting[group])
    for env, agent, action in np.argwhere(~mask):
        if env >= 1 and acting[env, agent]:
            return int(env), int(agent), int(action)
    raise AssertionError("no forbidden action in this batch")


# (id, env_kwargs, group, the bad entry's value or "forbidden", expected, its stand-in)
BAD = [
    pytest.param("mdp/climbing", {}, "player", 3, "an integer in [0, 2]", 0, id="too-big"),
    pytest.param("mdp/climbing", {}, "player", -1, "an integer in [0, 2]", 0, id="negative"),
    pytest.param("corral/tag", {}, "prey", 99, "an integer in [0, 8]", "first", id="tag-range"),
    pytest.param(
        "corral/tag",
        {},
        "prey",
        "forbidden",
        "a legal action (its action mask forbids this one)",
        "first",
        id="tag-mask",
    ),
    pytest.param(
        "mpe2/simple_spread_v3",
        {"continuous_actions": True},
        "agent",
        float("nan"),
        "finite values (got NaN or inf)",
        0.0,
        id="nan",
    ),
    pytest.param(
        "mpe2/simple_spread_v3",
        {"continuous_actions": True},
        "agent",
        2.0,
        "values within [0.0, 1.0]",
        1.0,
        id="above-bounds",
    ),
]


@pytest.mark.parametrize(("id", "env_kwargs", "group", "bad", "expected", "stand_in"), BAD)
def test_deferred_checks_report_a_bad_action_later_and_play_a_legal_stand_in(
    id, env_kwargs, group, bad, expected, stand_in
):
    torch_kwargs = tag_by_torch(id, env_kwargs)  # an out-of-range index would raise
    checked = venv_of(id, torch_kwargs, True, deferred_checks=True)
    oracle = venv_of(id, torch_kwargs, False)  # given the stand-in itself
    batches = [venv.reset(seed=5) for venv in (checked, oracle)]
    rng = np.random.default_rng(2)
    for t in range(1, 6):
        actions = legal_actions(oracle, batches[1], rng)
        given = {g: a.copy() for g, a in actions.items()}
        if t == 3:  # one bad entry, of an acting agent
            env, agent = 2, 1
            if bad == "forbidden":
                env, agent, value = forbidden_entry(batches[1], group)
            value = bad if bad != "forbidden" else value
            given[group][env, agent] = value
            if stand_in == "first":  # the first action its mask allows
                legal = to_numpy(batches[1].action_mask[group])[env, agent]
                actions[group][env, agent] = int(np.argmax(legal))
            elif id.startswith("mpe2/"):  # a Box action: NaN -> low, then clipped
                entry = np.clip(np.nan_to_num(given[group][env, agent], nan=0.0), 0.0, 1.0)
                actions[group][env, agent] = entry
            else:
                actions[group][env, agent] = stand_in
            name = checked.groups[group][agent]
        batches = [checked.step(on("cpu", given)), oracle.step(on("cpu", actions))]
        want, got = fields(batches[1]), fields(batches[0])
        for path in want:
            np.testing.assert_array_equal(got[path], want[path], err_msg=f"step {t}: {path}")
    message = (
        f"group {group!r}, env {env}, agent {name!r}: expected {expected} "
        "(in step 3 of the 5 since the last check"
    )
    with pytest.raises(InvalidActionError) as caught:
        checked.raise_deferred()
    assert message in str(caught.value)
    checked.raise_deferred()  # reported once
    checked.step(on("cpu", legal_actions(oracle, batches[1], rng)))  # the env goes on
    checked.raise_deferred()
    for venv in (checked, oracle):
        venv.close()


def test_only_the_first_problem_is_reported(as_on_a_gpu):
    venv = corral.make_vec("mdp/climbing", 4, array="torch", seed=0, deferred_checks=True)
    venv.reset(seed=0)
    venv.step({"player": torch.zeros((4, 2), dtype=torch.int64)})
    late = torch.zeros((4, 2), dtype=torch.int64)
    late[3, 0], late[1, 1] = 7, -2  # by env, then agent: env 1 first
    venv.step({"player": late})
    venv.step({"player": torch.full((4, 2), 9)})
    with pytest.raises(InvalidActionError, match=r"env 1, agent 'player_1'.*in step 2 of the 3"):
        venv.raise_deferred()
    venv.close()


def test_entries_of_agents_not_acting_are_ignored_and_made_safe():
    # corral/tag by torch: a caught prey is not acting; an out-of-range index in its entry
    # would raise in the env's indexing (on CUDA it would end the process's context)
    venv = venv_of("corral/tag", {"size": 4, "host_views": False}, True, deferred_checks=True)
    batch = venv.reset(seed=0)
    rng = np.random.default_rng(0)
    idle = 0
    for _ in range(80):
        actions = legal_actions(venv, batch, rng)
        resting = ~to_numpy(batch.acting["prey"])
        actions["prey"][resting] = 99
        idle += int(resting.sum())
        batch = venv.step(on("cpu", actions))
    assert idle > 0
    venv.raise_deferred()  # nothing to report
    venv.close()


def test_reset_and_close_raise_a_pending_problem(as_on_a_gpu):
    venv = corral.make_vec("mdp/climbing", 2, array="torch", seed=0, deferred_checks=True)
    venv.reset(seed=0)
    venv.step({"player": torch.full((2, 2), 5)})
    with pytest.raises(InvalidActionError, match=r"env 0, agent 'player_0'.*in step 1 of the 1"):
        venv.reset(seed=0)
    venv.reset(seed=0)  # the problem was reported: the reset goes on
    venv.step({"player": torch.full((2, 2), 5)})
    with pytest.raises(InvalidActionError, match="in step 1 of the 1"):
        venv.close()
    with pytest.raises(corral.errors.VectorStateError, match="closed"):
        venv.step({"player": torch.zeros((2, 2), dtype=torch.int64)})


@pytest.mark.parametrize(
    ("actions", "message"),
    [
        ({"player": torch.zeros((2, 2))}, "group 'player': expected integer actions"),
        ({"player": torch.zeros((2, 3), dtype=torch.int64)}, "expected an array of shape"),
        ({}, "group 'player' is missing from the actions"),
    ],
    ids=["dtype", "shape", "missing-group"],
)
def test_what_needs_no_values_still_raises_in_step(as_on_a_gpu, actions, message):
    venv = corral.make_vec("mdp/climbing", 2, array="torch", seed=0, deferred_checks=True)
    venv.reset(seed=0)
    with pytest.raises(InvalidActionError, match=message):
        venv.step(actions)
    venv.close()


@pytest.mark.parametrize("array", ["numpy", "torch"])
def test_on_the_host_deferred_checks_stay_immediate(array):
    venv = corral.make_vec("mdp/climbing", 2, array=array, seed=0, deferred_checks=True)
    venv.reset(seed=0)
    bad = np.full((2, 2), 5)
    with pytest.raises(InvalidActionError, match="env 0, agent 'player_0': expected an integer"):
        venv.step({"player": bad if array == "numpy" else torch.from_numpy(bad)})
    venv.raise_deferred()  # nothing kept
    venv.close()


def test_clipped_actions_are_counted_not_reported():
    kwargs = {"continuous_actions": True, "dtype": "float64"}
    venvs = [
        venv_of("mpe2/simple_spread_v3", kwargs, False, clip_actions=True),
        venv_of("mpe2/simple_spread_v3", kwargs, True, clip_actions=True, deferred_checks=True),
    ]
    batches = [venv.reset(seed=0) for venv in venvs]
    rng = np.random.default_rng(0)
    for _ in range(12):
        actions = {"agent": torch.from_numpy(rng.uniform(-0.5, 1.5, (6, 3, 5)))}
        actions["agent"][0, 0, 1], actions["agent"][3, 2, 4] = np.inf, -np.inf  # clipped too
        batches = [venv.step(actions) for venv in venvs]
        want, got = (fields(batch) for batch in batches)
        for path in want:
            np.testing.assert_array_equal(got[path], want[path], err_msg=path)
    assert want["clipped_actions/agent"].sum() > 0
    venvs[1].raise_deferred()  # clipping is no problem, inf included (NaN is)
    for venv in venvs:
        venv.close()


@CUDA
def test_on_cuda_a_bad_action_waits_on_the_device_until_raise_deferred():
    venv = corral.make_vec("mdp/climbing", 4, array="torch", device="cuda", deferred_checks=True)
    venv.reset(seed=0)
    bad = torch.zeros((4, 2), dtype=torch.int64, device="cuda")
    bad[2, 1] = 3
    with no_sync("cuda"):
        venv.step({"player": bad})
        venv.step({"player": bad * 0})
    with pytest.raises(InvalidActionError, match=r"env 2, agent 'player_1'.*in step 1 of the 2"):
        venv.raise_deferred()
    venv.close()
