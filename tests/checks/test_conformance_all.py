"""Every registered env passes the conformance checker (envs whose extra is missing skip)."""

from __future__ import annotations

from typing import Any

import pytest

import corral
from corral.checks import check_env
from corral.errors import MissingDependencyError
from corral.registry import namespaces

pytestmark = [
    # Box2D's SWIG module (sisl) warns while it is imported; raising there crashes Python
    pytest.mark.filterwarnings("ignore:builtin type .* has no __module__:DeprecationWarning"),
    # texas_holdem_no_limit builds a float64-bounded Box
    pytest.mark.filterwarnings("ignore:.*Box (low|high)'s precision lowered:UserWarning"),
    # cooperative_pong renders inside its own reset()
    pytest.mark.filterwarnings("ignore:.*render method without specifying any render mode"),
]

# Ids too slow for a test under their defaults -> check_env arguments that keep them fast.
SETTINGS: dict[str, dict[str, Any]] = {
    "pettingzoo/butterfly/pistonball_v6": {"env_kwargs": {"n_pistons": 4, "max_cycles": 15}},
    "pettingzoo/sisl/pursuit_v5": {"env_kwargs": {"max_cycles": 25}},
    # MAgent2: hundreds of agents on its default maps; small maps (gather's is fixed)
    **{
        f"magent2/{name}": {"env_kwargs": {"map_size": size, "max_cycles": 40}}
        for name, size in (
            ("adversarial_pursuit_v4", 16),
            ("battle_v4", 16),
            ("battlefield_v5", 46),
            ("combined_arms_v6", 16),
            ("tiger_deer_v4", 16),
        )
    },
    "magent2/gather_v5": {"env_kwargs": {"max_cycles": 10}, "max_steps": 20},
}

# Upstream bugs the checker finds -> why. Strict: the test fails once they are fixed.
KNOWN_FAILURES = {
    "pettingzoo/butterfly/knights_archers_zombies_v11": (
        "PettingZoo KAZ keeps its zombie spawn counter across reset(seed), so the same seed "
        "gives another episode after a previous one"
    ),
}

# One id per open-ended namespace, since registered_ids() cannot list them.
NAMESPACE_EXAMPLES = {
    "gym": "gym/Blackjack-v1",
    "openspiel": "openspiel/tiny_hanabi",
    "lbf": "lbf/Foraging-7x7-2p-2f-coop-v3",
    "rware": "rware/rware-tiny-1ag-easy-v2",
}

IDS = [
    pytest.param(env_id, marks=pytest.mark.xfail(reason=KNOWN_FAILURES[env_id], strict=True))
    if env_id in KNOWN_FAILURES
    else env_id
    for env_id in corral.registered_ids()
] + [example for prefix, example in NAMESPACE_EXAMPLES.items() if prefix in namespaces()]


@pytest.mark.parametrize("env_id", IDS)
def test_registered_env_passes_the_checker(env_id: str) -> None:
    try:
        report = check_env(env_id, raise_on_error=False, **SETTINGS.get(env_id, {}))
    except MissingDependencyError as err:
        pytest.skip(str(err))
    assert report.ok, str(report)
    assert report.complete, str(report)  # an episode ended: the end-of-episode rules ran


def test_tables_name_registered_ids() -> None:
    assert set(SETTINGS) | set(KNOWN_FAILURES) <= set(corral.registered_ids())


@pytest.mark.parametrize("env_id", corral.batched_ids())
def test_natively_batched_ids_pass_the_batched_checker_and_equal_their_dict_envs(
    env_id: str,
) -> None:
    from corral.checks import check_batched_env

    report = check_batched_env(env_id, seed=3, episodes=3)  # compared with its dict env
    assert report.complete, env_id
