"""corral's errors cross process boundaries (subprocess and Ray workers) by pickling: each
keeps its message, its fields, its collected faults and the batch of the failed step."""

from __future__ import annotations

import pickle

import pytest

from corral.errors import EnvError, WorkerDiedError, WorkerStartError, WorkerTimeoutError


def _errors() -> list[Exception]:
    return [
        EnvError(
            2, "step raised", "Traceback ...\nValueError: x", restarted=True, copies=range(2, 4)
        ),
        WorkerTimeoutError("worker 1 did not answer", [3, 4], restarted=True),
        WorkerDiedError("worker 0 died", [0, 1]),
        WorkerStartError("worker 2 died before it built its envs", {2: -9}, [5]),
    ]


@pytest.mark.parametrize("error", _errors(), ids=lambda e: type(e).__name__)
def test_an_error_keeps_its_fields_faults_and_batch_through_pickle(error: Exception) -> None:
    other = EnvError(7, "another env failed")
    error.faults = [error, other]  # type: ignore[attr-defined]
    error.batch = {"reward": [1.0]}  # type: ignore[attr-defined]
    back = pickle.loads(pickle.dumps(error))
    assert type(back) is type(error)
    assert str(back) == str(error)
    fields = {k: v for k, v in vars(error).items() if k not in ("faults", "batch")}
    assert {k: getattr(back, k) for k in fields} == fields
    assert back.batch == {"reward": [1.0]}
    assert back.faults[0] is back  # the error itself, not a copy
    assert [type(f) for f in back.faults] == [type(error), EnvError]
    assert back.faults[1].env_index == 7


def test_a_worker_error_has_no_batch_until_the_vector_env_sets_one() -> None:
    for error in _errors():
        assert error.batch is None  # type: ignore[attr-defined]
