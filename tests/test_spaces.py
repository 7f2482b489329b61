"""The action rule of each space in its three modes: one action, a host array of a group's
actions, a tensor on its device. The single-action mode is the reference the other two
are checked against, entry by entry."""

from __future__ import annotations

import numpy as np
import pytest
from gymnasium import spaces

from corral.spaces import action_problem, action_rule, device_suspect, group_problem

E, N = 5, 3
SPECIAL = ((0, 1), (2, 2), (1, 1))
"""The entries the Box cases make NaN, inf and 1e300: acting in every test."""


@pytest.fixture
def rng() -> np.random.Generator:
    """A generator of its own per test, so that no test's data hangs on the order they run."""
    return np.random.default_rng(26)


def _acting(rng: np.random.Generator) -> np.ndarray:
    acting = rng.random((E, N)) < 0.7
    for entry in SPECIAL:
        acting[entry] = True
    return acting


def _discrete(
    rng: np.random.Generator, start: int, masked: bool
) -> tuple[spaces.Space, np.ndarray, np.ndarray | None]:
    space = spaces.Discrete(4, start=start)
    actions = rng.integers(start - 2, start + 6, size=(E, N))
    mask = None
    if masked:
        mask = rng.random((E, N, 4)) < 0.6
        mask[..., 1] = True
    return space, actions, mask


def _box(rng: np.random.Generator) -> tuple[spaces.Space, np.ndarray, None]:
    space = spaces.Box(-1.0, 1.0, shape=(2,), dtype=np.float32)
    actions = rng.uniform(-1.5, 1.5, size=(E, N, 2)).astype(np.float32)
    actions[0, 1, 0] = np.nan
    actions[2, 2, 1] = np.inf
    return space, actions, None


def _box_wide(rng: np.random.Generator) -> tuple[spaces.Space, np.ndarray, None]:
    space = spaces.Box(-np.inf, np.inf, shape=(), dtype=np.float32)
    actions = rng.uniform(-2, 2, size=(E, N))
    actions[1, 1] = 1e300  # float64: beyond float32
    return space, actions, None


CASES = {
    "discrete": lambda rng: _discrete(rng, 0, masked=False),
    "discrete-start": lambda rng: _discrete(rng, 2, masked=False),
    "discrete-masked": lambda rng: _discrete(rng, 0, masked=True),
    "discrete-start-masked": lambda rng: _discrete(rng, 1, masked=True),
    "box": _box,
    "box-wide": _box_wide,
}


def _single(space, actions, mask, acting) -> np.ndarray:
    """The reference: each acting entry judged by the single-action mode."""
    bad = np.zeros(acting.shape, bool)
    for e, j in np.argwhere(acting):
        m = None if mask is None else mask[e, j]
        if isinstance(space, spaces.Discrete):  # the single mode takes Python/numpy scalars
            bad[e, j] = action_problem(space, actions[e, j], m) is not None
        else:
            bad[e, j] = _box_entry_problem(space, actions[e, j])
    return bad


@np.errstate(over="ignore")  # the single mode casts 1e300 to float32 (inf) as numpy does
def _box_entry_problem(space: spaces.Box, action: np.ndarray) -> bool:
    if action_problem(space, action) is not None:
        return True
    # a wider value than the space's dtype holds: the single mode stores it as inf
    return not np.isfinite(np.asarray(action).astype(space.dtype)).all()


@pytest.mark.parametrize("legal", [False, True], ids=["with-illegal", "legal"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_the_host_array_mode_agrees_with_the_single_action_mode(case, legal, rng):
    space, actions, mask = CASES[case](rng)
    acting = _acting(rng)
    rule = action_rule(space)
    if legal:
        actions = _legal_everywhere(rule, actions, mask)
    bad = _single(space, actions, mask, acting)
    assert bad.any() != legal
    problem = rule.array_problem(actions, acting, mask)
    assert (problem is None) == (not bad.any())
    if problem is not None:
        env, agent, _ = problem
        assert bad[env, agent], (problem, bad)
    if rule.fine(actions, acting, mask):  # the one-look fast path never takes an illegal one
        assert not _single(space, actions, mask, np.ones_like(acting)).any()
    few = rule.few_check(acting.shape)
    if few is not None and few(actions, mask):
        assert not _single(space, actions, mask, np.ones_like(acting)).any()


@pytest.mark.parametrize("clip", [False, True])
@pytest.mark.parametrize("case", sorted(CASES))
def test_the_device_mode_flags_exactly_the_entries_the_single_mode_refuses(case, clip, rng):
    torch = pytest.importorskip("torch")
    space, actions, mask = CASES[case](rng)
    acting = _acting(rng)
    rule = action_rule(space)
    t = torch.as_tensor
    checked = rule.device_check(t(actions), t(acting), None if mask is None else t(mask), clip)
    assert checked is not None
    kinds = [kind for kind, _ in checked.faults]  # in the order of the rule's kinds
    assert kinds == [k for k in rule.kinds if k in kinds] and not (clip and "bounds" in kinds)
    flagged = np.zeros((E, N), bool)
    for _, flags in checked.faults:
        flagged |= flags.numpy()
    expected = _single(space, actions, mask, acting)
    if clip and isinstance(
        space, spaces.Box
    ):  # out of bounds is clipped, not refused: only NaN, inf and overflow remain
        clipped = np.clip(actions, space.low, space.high)
        expected = _single(space, np.where(np.isnan(actions), np.inf, clipped), mask, acting)
    np.testing.assert_array_equal(flagged, expected)
    # the stand-ins are legal everywhere, acting or not
    safe = checked.safe.numpy()
    assert not _single(space, safe, mask, np.ones_like(acting)).any()


@pytest.mark.parametrize("case", sorted(CASES))
def test_group_problem_on_tensors_names_what_the_host_mode_names(case, rng):
    torch = pytest.importorskip("torch")
    space, actions, mask = CASES[case](rng)
    acting = _acting(rng)
    rule = action_rule(space)
    t = torch.as_tensor
    tmask = None if mask is None else t(mask)
    host = rule.array_problem(actions, acting, mask)
    # host_views=False: the tensor path, as on a GPU
    assert group_problem(rule, t(actions), t(acting), tmask, host_views=False) == host
    assert device_suspect(rule, t(actions), t(acting), tmask) == (host is not None)


def test_the_rule_of_a_space_is_built_once_and_masks_only_constrain_discrete_actions():
    space = spaces.Discrete(3)
    assert action_rule(space) is action_rule(space)
    mask = np.array([1, 0, 1], np.int8)
    assert action_problem(space, 1, mask) == "a legal action [0, 2] (the action mask forbids 1)"
    assert action_problem(space, 5, mask) == "an integer in [0, 2], got 5"
    assert action_problem(space, 2, mask) is None
    # entry i of a mask is the action start + i, as in the host and device modes
    shifted = spaces.Discrete(3, start=5)
    assert action_problem(shifted, 6, mask) == "a legal action [5, 7] (the action mask forbids 6)"
    assert action_problem(shifted, 7, mask) is None
    assert action_problem(spaces.Discrete(5), 4, mask) is None  # a short mask: no entry, no say


def _legal_everywhere(rule, actions, mask):
    """``actions`` with every entry made legal (by the single-action mode's standard)."""
    space = rule.space
    if isinstance(space, spaces.Discrete):
        low = int(space.start)
        if mask is None:
            return np.clip(actions, low, low + space.n - 1)
        return mask.argmax(-1) + low
    out = np.nan_to_num(actions, posinf=0.0, neginf=0.0)
    return np.clip(out, np.maximum(space.low, -1e30), np.minimum(space.high, 1e30)).astype(
        actions.dtype
    )


@pytest.mark.parametrize("tensor", [False, True], ids=["host", "tensor"])
def test_a_nan_where_no_agent_acts_hides_no_acting_agent_s_problem(tensor):
    space = spaces.Box(-1.0, 1.0, shape=(2,), dtype=np.float32)
    rule = action_rule(space)
    actions = np.zeros((2, 2, 2), np.float32)
    acting = np.array([[True, False], [True, True]])
    actions[0, 1] = np.nan  # not acting: ignored
    torch = pytest.importorskip("torch") if tensor else None

    def problem(a: np.ndarray):
        if torch is None:
            return rule.array_problem(a, acting)
        t = torch.as_tensor
        return group_problem(rule, t(a), t(acting), None, host_views=False)

    assert problem(actions) is None
    actions[1, 0, 1] = 5.0  # acting, out of bounds
    assert problem(actions) == (1, 0, rule.kinds["bounds"])
    actions[1, 1, 0] = np.inf  # acting, not finite: named first
    assert problem(actions) == (1, 1, rule.kinds["finite"])


@pytest.mark.parametrize("dtype", [np.int8, np.uint8, np.int16])
def test_an_integer_box_judges_the_value_given_not_its_wrapped_cast(dtype):
    space = spaces.Box(0, 10, shape=(1,), dtype=dtype)
    for value in range(-300, 301):
        problem = action_problem(space, np.array([value]))
        assert (problem is None) == (0 <= value <= 10), value


@pytest.mark.parametrize(
    ("action", "said"),
    [
        (np.array([1e300]), "values that float32 holds (|x| <= 3.40282e+38; more is inf)"),
        (np.array([0.5 + 2j]), "values castable to float32, got dtype complex128"),
    ],
)
def test_one_agent_s_action_is_judged_as_the_batch_s(action: np.ndarray, said: str) -> None:
    """An unbounded float32 Box: a float64 beyond float32 (stored as inf) and a complex
    number (stored as its real part) passed one agent's check while the batch's refused them."""
    space = spaces.Box(-np.inf, np.inf, (1,), np.float32)
    assert said in str(action_problem(space, action))
    rule = action_rule(space)
    batch = action[None, None]  # [E, n, 1]
    assert rule.array_problem(batch, np.ones((1, 1), bool)) is not None
    assert action_problem(space, np.array([3e38])) is None  # what float32 holds is taken


DISCRETE_DTYPES = [
    (spaces.Discrete(200), np.int8),  # beyond int8: negative int8 read as unsigned is below n
    (spaces.Discrete(5, start=-1000), np.int8),  # a start that int8 cannot hold
    (spaces.Discrete(3, start=-2), np.uint8),  # a negative start with unsigned actions
    (spaces.Discrete(4, start=120), np.int8),  # the last actions at int8's edge
    (spaces.Discrete(300), np.int16),
]


@pytest.mark.parametrize("tensor", [False, True], ids=["host", "tensor"])
@pytest.mark.parametrize(("space", "dtype"), DISCRETE_DTYPES, ids=str)
def test_narrow_integer_actions_of_many_envs_are_judged_as_one_by_one(space, dtype, tensor):
    """Past a few entries the one-look fast path judges a group's actions; each verdict must
    be the single-action mode's, whatever the actions' integer width."""
    rng = np.random.default_rng(3)
    rule = action_rule(space)
    info = np.iinfo(dtype)
    low, high = int(space.start), int(space.start) + space.n - 1
    legal = np.clip(np.arange(40) % space.n + low, info.min, info.max).astype(dtype)
    acting = np.ones((8, 5), bool)
    for trial in range(60):
        actions = legal[rng.permutation(40)].reshape(8, 5)
        if trial % 2:  # one entry anywhere in the dtype's range
            actions[rng.integers(8), rng.integers(5)] = rng.integers(info.min, info.max + 1)
        expected = any(not low <= int(a) <= high for a in actions.ravel())
        assert _single(space, actions, None, acting).any() == expected
        if tensor:
            torch = pytest.importorskip("torch")
            t = torch.as_tensor
            found = group_problem(rule, t(actions), t(acting), None, host_views=False)
            assert (found is not None) == expected, actions
            continue
        if rule.fine(actions, acting, None):  # the fast path may decline, never let one pass
            assert not expected, actions
        assert (rule.array_problem(actions, acting) is not None) == expected
