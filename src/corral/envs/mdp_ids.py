"""The ``mdp/...`` ids: each the dict env of :mod:`corral.envs.mdp` and its natively
batched version (:mod:`corral.envs.mdp_batched`), built from the same tables.

Listing the ids imports no batched module: :mod:`corral.envs.mdp_batched` is imported
when a batched env is first built."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from corral.batched_env import BatchedEnv
from corral.envs.mdp import (
    MatrixGame,
    TabularMDP,
    climbing_game,
    matching_pennies,
    multi_round_nmdp,
    one_round_dmdp,
    one_round_nmdp,
    penalty_game,
    two_round_dmdp,
    two_round_nmdp,
)
from corral.registry import register


@dataclass(frozen=True)
class _Batched:
    """An id's natively batched entry point: ``num_envs`` copies of what ``factory`` builds."""

    factory: Callable[..., TabularMDP | MatrixGame]

    def __call__(
        self,
        num_envs: int,
        array: str = "numpy",
        device: str = "cpu",
        render_mode: str | None = None,
        **kwargs: Any,
    ) -> BatchedEnv:
        from corral.envs.mdp_batched import batch  # lazy, as the module's docstring says

        env = batch(self.factory(**kwargs), num_envs, array, device)
        env.check_render_mode(
            render_mode,
            "the natively batched version cannot render: render the dict env "
            "(corral.make, or corral.make_vec(..., native=False))",
        )
        return env


_REGISTRY: tuple[tuple[str, Callable[..., Any], dict[str, Any]], ...] = (
    ("mdp/one_round_dmdp", one_round_dmdp, {}),
    ("mdp/two_round_dmdp", two_round_dmdp, {}),
    ("mdp/one_round_nmdp", one_round_nmdp, {}),
    ("mdp/two_round_nmdp", two_round_nmdp, {}),
    ("mdp/multi_round_nmdp", multi_round_nmdp, {}),
    ("mdp/climbing", climbing_game, {}),
    ("mdp/penalty", penalty_game, {"k": -100.0}),
    ("mdp/matching_pennies", matching_pennies, {}),
)

for _id, _factory, _kwargs in _REGISTRY:
    register(_id, _factory, batched=_Batched(_factory), **_kwargs)
