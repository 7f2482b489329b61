"""``Batch.decision``, each agent's decision index kept by the episode bookkeeping, against
the collector's count of the batches it acted on (``tests/oracles/decisions.py``).

Random legal actions on turn-based, asynchronous and simultaneous envs, as dict envs and
natively batched, on every backend, as numpy and as torch: at every batch the field equals
the oracle's index, and ``episode_decisions`` where ``done`` the oracle's count of the
episode that ended. The faults (restarts, cut episodes) are checked in
``tests/vector/test_faults.py``.
"""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest
from oracles.decisions import DecisionCounter

from corral.arrays import to_numpy
from corral.errors import MissingDependencyError
from corral.vector import make_vec
from corral.vector.sampling import sample_array

NUM_ENVS = 3
STEPS = 40

# case -> (env id, its keyword arguments, whether it has a natively batched form)
CASES = {
    "rps": ("corral/rps", {}, False),  # turn-based
    "tictactoe": ("pettingzoo/classic/tictactoe_v3", {}, False),  # turn-based
    "openspiel": ("openspiel/tic_tac_toe", {}, False),  # turn-based
    "rps4": ("corral/rps4", {}, False),  # asynchronous
    "tag": ("corral/tag", {}, True),  # asynchronous, dying agents
    "mdp": ("mdp/multi_round_nmdp", {}, True),
    "mpe2": ("mpe2/simple_spread_v3", {"N": 3, "max_cycles": 10}, True),  # simultaneous
}

HAS_RAY = importlib.util.find_spec("ray") is not None


def _params() -> list:
    """(case, backend, array, native, copy): every case on every backend as numpy, on sync
    as torch too, a natively batched case also as dict envs, and views on worker backends."""
    params = []
    for case, (_, _, batched) in CASES.items():
        for backend in ("sync", "subproc", "ray"):
            marks = [] if backend != "ray" or HAS_RAY else [pytest.mark.skip(reason="no ray")]
            arrays = ["numpy", "torch"] if backend == "sync" or case == "tag" else ["numpy"]
            natives = [True, False] if batched and backend == "sync" else [batched]
            for array in arrays:
                for native in natives:
                    copy = backend == "sync"
                    name = f"{case}-{backend}-{array}-{'native' if native else 'dict'}"
                    params.append(
                        pytest.param(case, backend, array, native, copy, id=name, marks=marks)
                    )
    return params


def _random_actions(venv, batch, rng: np.random.Generator) -> dict:
    actions = {}
    for g, agents in venv.groups.items():
        mask = batch.action_mask.get(g)
        mask = None if mask is None else to_numpy(mask)
        actions[g] = sample_array(venv.action_space(g), (venv.num_envs, len(agents)), rng, mask)
    return actions


@pytest.mark.parametrize(("case", "backend", "array", "native", "copy"), _params())
def test_decision_is_the_collectors_count_of_the_batches(
    case: str, backend: str, array: str, native: bool, copy: bool, ray_session
) -> None:
    id, kwargs, _ = CASES[case]
    options = {} if backend == "sync" else {"num_workers": 2}
    if backend == "ray":
        ray_session()
    try:
        venv = make_vec(
            id, NUM_ENVS, backend, native=native, array=array, copy=copy, env_kwargs=kwargs,
            **options,
        )  # fmt: skip
    except MissingDependencyError as err:
        pytest.skip(str(err))
    _check_against_the_oracle(venv)


@pytest.mark.parametrize("case", [case for case, (_, _, batched) in CASES.items() if batched])
def test_decision_on_the_device_path(case: str, as_on_a_gpu: None) -> None:
    """As on a GPU (no host read per step: blends instead of indexing), on CPU tensors."""
    pytest.importorskip("torch")
    id, kwargs, _ = CASES[case]
    venv = make_vec(id, NUM_ENVS, native=True, array="torch", env_kwargs=kwargs)
    assert not venv.layout.place.computes_on_host
    _check_against_the_oracle(venv)


def _check_against_the_oracle(venv) -> None:
    """Step ``venv`` with random legal actions, checking ``decision`` and
    ``episode_decisions`` against the oracle at every batch; closes ``venv``."""
    oracle = DecisionCounter()
    rng = np.random.default_rng(3)
    most, ended = 0, 0
    with venv:
        batch = venv.reset(seed=5)
        for t in range(STEPS):
            want = oracle.step(batch)
            for g in venv.groups:
                got = batch.decision[g]
                assert type(got) is type(batch.done) and str(got.dtype).endswith("int64")
                np.testing.assert_array_equal(to_numpy(got), to_numpy(want[g]), f"step {t}, {g}")
                most = max(most, int(to_numpy(got).max()))
            made = oracle.made
            batch = venv.step(_random_actions(venv, batch, rng))
            done = to_numpy(batch.done).copy()
            ended += int(done.sum())
            for g in venv.groups:
                np.testing.assert_array_equal(
                    to_numpy(batch.episode_decisions[g])[done],
                    to_numpy(made[g])[done],
                    f"step {t}, {g}: the decisions of the episodes that ended",
                )
    assert most >= 1 and ended >= 1  # decisions were counted, and counted again after ends


def test_a_reset_starts_every_count_again() -> None:
    with make_vec("corral/tag", 2, native=False) as venv:
        batch = venv.reset(seed=0)
        rng = np.random.default_rng(0)
        for _ in range(3):
            batch = venv.step(_random_actions(venv, batch, rng))
        assert batch.decision["prey"].any()
        batch = venv.reset(seed=1)
        assert not any(d.any() for d in batch.decision.values())
