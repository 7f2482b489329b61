"""``compile=True``: every batched MPE scenario steps as one torch graph, and the compiled
step computes what the uncompiled one does."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
from support.mpe_differential import batched, check_torch, random_actions

import corral

torch = pytest.importorskip("torch")
pytest.importorskip("mpe2")

MPE_IDS = [id for id in corral.batched_ids() if id.startswith("mpe2/")]


@pytest.mark.parametrize("id", MPE_IDS)
@pytest.mark.parametrize("continuous", [False, True])
def test_every_scenario_steps_as_one_graph(id: str, continuous: bool) -> None:
    """No graph break: ``torch.compile`` fuses the whole step (decode, physics, scenario,
    batch) with no Python between its kernels and no read-back from the device."""
    env = batched(id, 8, array="torch", dtype="float32", continuous_actions=continuous)
    env.reset(seed=0)
    actions = {
        g: torch.as_tensor(a) for g, a in random_actions(env, np.random.default_rng(0)).items()
    }
    explained = torch._dynamo.explain(env._step_all)(actions)
    assert explained.graph_break_count == 0, [b.reason for b in explained.break_reasons]
    assert explained.graph_count == 1


def test_compile_needs_torch() -> None:
    with pytest.raises(ValueError, match="compile=True compiles torch code"):
        batched("mpe2/simple_v3", 2, compile=True)


@pytest.mark.skipif(shutil.which("g++") is None, reason="torch.compile on the CPU needs g++")
@pytest.mark.parametrize("id", ["mpe2/simple_spread_v3", "mpe2/simple_tag_v3"])
def test_the_compiled_step_stays_within_1e9_of_numpy(id: str, monkeypatch) -> None:
    make = batched

    def compiled(id: str, num_envs: int, **kwargs):
        return make(id, num_envs, **kwargs, compile=kwargs.get("array") == "torch")

    monkeypatch.setattr("support.mpe_differential.batched", compiled)
    check_torch(id, {}, steps=40)
