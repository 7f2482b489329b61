"""A natively batched env through ``VectorEnv`` gives the same batches as its dict envs.

The reference is today's per-env path (``native=False``): the same ids, seeds and
actions must give identical batches over many episodes (same-step autoreset,
dying agents), on every backend, with numpy and torch arrays.
"""

from __future__ import annotations

import re

import numpy as np
import pytest
from support.batches import PLACES, assert_batches_equal, needs_torch

import corral
from corral.arrays import to_numpy
from corral.errors import InvalidActionError


def _run_side_by_side(
    id: str, num_envs: int, steps: int, backend: str, array, device, rtol=0.0, **kw
):
    options = {"num_workers": 2} if backend == "subproc" else {}
    rng = np.random.default_rng(3)
    with (
        corral.make_vec(id, num_envs, "sync", native=False, seed=11, state=True) as ref,
        corral.make_vec(
            id, num_envs, backend, native=True, seed=11, state=True, array=array,
            device=device, **options, **kw,
        ) as native,
    ):  # fmt: skip
        want, got = ref.reset(), native.reset()
        assert_batches_equal(want, got, f"{id} reset", rtol)
        episodes = 0
        for t in range(steps):
            actions = ref.sample_actions(want, rng)
            want = ref.step(actions)
            got = native.step(actions)
            assert_batches_equal(want, got, f"{id} step {t}", rtol)
            episodes += int(want.done.sum())
        return episodes


@pytest.mark.parametrize("id", corral.batched_ids())
@pytest.mark.parametrize(("array", "device"), PLACES)
def test_native_batches_equal_the_dict_envs(id: str, array: str, device: str) -> None:
    # MPE's physics rounds differently in torch's sqrt and logaddexp: its float32
    # observations may differ in the last place (tests/envs/mpe/test_batched_mpe.py bounds the
    # float64 state); every other native env is exact in torch too.
    rtol = 1e-6 if array == "torch" and id.startswith("mpe2/") else 0.0
    episodes = _run_side_by_side(id, 8, 120, "sync", array, device, rtol)
    assert episodes >= 8  # many episodes, each ended and autoreset


@pytest.mark.parametrize("id", ["mdp/climbing", "mdp/two_round_nmdp", "corral/tag"])
def test_native_shards_in_worker_processes_equal_the_dict_envs(id: str) -> None:
    _run_side_by_side(id, 6, 40, "subproc", "numpy", "cpu")


def test_a_native_env_judged_after_each_step_equals_the_dict_envs() -> None:
    """With check_finite, corral/tag does not write into the batch (a copy that returned NaN
    is cut where it stood before the step): the batches stay those of the dict envs."""
    with corral.make_vec("corral/tag", 2, check_finite=True) as venv:
        assert not venv._backend.shard._shared
    _run_side_by_side("corral/tag", 8, 60, "sync", "numpy", "cpu", check_finite=True)


@needs_torch
def test_torch_batches_live_on_the_asked_device() -> None:
    import torch

    with corral.make_vec("mdp/climbing", 4, array="torch", seed=0) as venv:
        batch = venv.reset()
        assert isinstance(batch.obs["player"], torch.Tensor)
        assert batch.done.device.type == "cpu"
        batch = venv.step({"player": torch.zeros(4, 2, dtype=torch.int64)})
        assert isinstance(batch.reward["player"], torch.Tensor)
    with corral.make_vec("corral/rps", 2, array="torch", seed=0) as venv:  # dict envs
        batch = venv.reset()
        assert isinstance(batch.obs["player"], torch.Tensor)


def test_native_true_on_an_id_without_one_lists_the_ids_that_have_one() -> None:
    with pytest.raises(ValueError, match=r"no natively batched implementation.*mdp/climbing"):
        corral.make_vec("corral/rps", 2, native=True)


@pytest.mark.parametrize("native", [True, False])
@pytest.mark.parametrize("max_cycles", [2.5, 0, True])
def test_an_mpe_max_cycles_that_is_no_step_count_is_refused_by_both_implementations(
    native: bool, max_cycles: object
) -> None:
    # mpe2 took 2.5 and ended its episodes after 3 steps; the native env's int() after 2
    expected = (
        f"max_cycles must be an int of at least 1 (the steps of an episode), got {max_cycles!r}"
    )
    kwargs = {"max_cycles": max_cycles}
    with pytest.raises((ValueError, corral.errors.EnvError), match=re.escape(expected)):
        corral.make_vec("mpe2/simple_spread_v3", 2, native=native, env_kwargs=kwargs)
    with pytest.raises(ValueError, match=re.escape(expected)):
        corral.make("mpe2/simple_spread_v3", **kwargs)


def test_native_is_the_default_where_an_id_has_one() -> None:
    from corral.vector.dict_envs import DictEnvs

    with corral.make_vec("mdp/climbing", 2) as venv:
        assert not isinstance(venv._backend.shard, DictEnvs) and venv.native
    with corral.make_vec("mdp/climbing", 2, native=False) as venv:
        assert isinstance(venv._backend.shard, DictEnvs) and not venv.native
    with corral.make_vec("mpe2/simple_spread_v3", 2) as venv:  # mpe2 ids: native MPE
        assert venv.native


@needs_torch
@pytest.mark.parametrize("case", ["legal", "masked", "range", "idle-junk"])
def test_device_checks_of_discrete_actions_agree_with_the_host_checks(case: str) -> None:
    """On a GPU, discrete actions are checked on the device (CPU tensors go through numpy
    views): those checks, run here on CPU tensors, agree with the numpy ones."""
    import torch
    from gymnasium import spaces

    from corral.spaces import action_rule, device_suspect, group_problem

    rng = np.random.default_rng(4)
    space = spaces.Discrete(4, start=1)
    acting = rng.random((6, 3)) < 0.7
    mask = (rng.random((6, 3, 4)) < 0.5) | ~acting[..., None]
    mask[..., 2] = True
    actions = np.where(mask, rng.random(mask.shape), -1).argmax(-1) + 1
    env, agent = np.argwhere(acting)[0]
    if case == "masked":
        mask[env, agent, 0] = False
        actions[env, agent] = 1
    elif case == "range":
        actions[env, agent] = 5
    elif case == "idle-junk":  # not acting: ignored, but not taken at one look either
        env, agent = np.argwhere(~acting)[0]
        actions[env, agent] = 9
    rule = action_rule(space)
    problem = group_problem(rule, actions, acting, mask, host_views=True)
    assert (problem is None) == (case in ("legal", "idle-junk"))
    t = torch.as_tensor
    assert rule.fine(t(actions), t(acting), t(mask)) == (case == "legal")
    assert rule.fine(actions, acting, mask) == (case == "legal")
    assert device_suspect(rule, t(actions), t(acting), t(mask)) == (problem is not None)


@pytest.mark.parametrize(("array", "device"), PLACES)
def test_an_invalid_action_names_group_env_and_agent_and_the_env_goes_on(array, device):
    with corral.make_vec("mdp/climbing", 3, seed=0, array=array, device=device) as venv:
        batch = venv.reset()
        actions = {"player": np.zeros((3, 2), np.int64)}
        actions["player"][1, 1] = 7
        if array == "torch":
            import torch

            actions = {"player": torch.as_tensor(actions["player"], device=device)}
        with pytest.raises(InvalidActionError, match=r"group 'player', env 1, agent 'player_1'"):
            venv.step(actions)
        actions["player"][1, 1] = 0
        batch = venv.step(actions)
        assert to_numpy(batch.done).all()


def test_batched_env_declares_its_optional_speed_ups_promising_nothing_by_default() -> None:
    class Plain(corral.BatchedEnv):
        pass

    env = Plain()
    assert env.keeps_masks is False and env.keeps_rules is False
    assert env.write_into({"obs/agent": np.zeros((2, 1, 3))}) is False


def test_the_vector_layer_reads_the_speed_ups_a_batched_env_declares() -> None:
    from corral.envs.tag_batched import BatchedTag

    offered = []

    class Watched(BatchedTag):
        def write_into(self, arrays):
            offered.append(sorted(arrays))
            return super().write_into(arrays)

    corral.register("tests/tag-offered-arrays", batched=Watched)
    venv = corral.make_vec("tests/tag-offered-arrays", 2, seed=0)
    venv.reset(seed=0)
    venv.close()
    assert len(offered) == 1 and "obs/predator" in offered[0]


@needs_torch
@pytest.mark.parametrize("backend", ["sync", "subproc"])
def test_a_native_env_made_inside_device_path_is_built_on_it_in_workers_and_later(backend):
    """The source keeps the decision: a worker process builds its env on the device path, and
    so does a build after the block (a restart after a fault)."""
    from corral.vector.sources import NativeSource

    options = {"num_workers": 2} if backend == "subproc" else {}
    with corral.device_path():
        venv = corral.make_vec("corral/tag", 4, backend, array="torch", **options)
    with venv:
        assert [place.host_views for place in venv.get_attr("place")] == [False] * 4
        assert not venv.layout.place.computes_on_host
    with corral.device_path():
        source = NativeSource(lambda n: corral.spec("mdp/climbing").make_batched(n, "torch"), 2)
    assert source.build().place.host_views is False
    outside = NativeSource(lambda n: corral.spec("mdp/climbing").make_batched(n, "torch"), 2)
    assert outside.build().place.host_views is True
