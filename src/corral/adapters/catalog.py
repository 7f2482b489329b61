"""The ids of the other libraries' envs: mpe2, PettingZoo, MAgent2, Gymnasium, LBF, RWARE and
OpenSpiel.

Each id names where its env lives and the ``pip install corral[extra]`` that provides
it; the env is built (its library imported) only by ``corral.make``. This module is a
list the registry reads (:data:`IDS`, :data:`NAMESPACES`) the first time it is asked for
an id; it knows no registry. How each library's env is built and wrapped is its
adapter's business (:mod:`corral.adapters`).
"""

from __future__ import annotations

import importlib
from collections.abc import Collection
from functools import partial
from typing import Any

from corral.adapters.gymnasium import make_gymnasium
from corral.adapters.gymnasium_multi import make_from_package
from corral.adapters.openspiel import OpenSpielEnv
from corral.adapters.pettingzoo_aec import build_classic
from corral.adapters.pettingzoo_parallel import build, build_unchecked
from corral.envs.mpe.arguments import check_arguments

IDS: list[tuple[str, Any, dict[str, Any]]] = []
"""Each id with its entry point and the keyword arguments of :func:`corral.register`
(``batched``, ``extra`` and the env's own)."""

NAMESPACES: list[tuple[str, Any, dict[str, Any]]] = []
"""Each namespace prefix with its factory and the keyword arguments of
:func:`corral.register_namespace`."""


def _add(id: str, entry_point: Any, **options: Any) -> None:
    """List ``id`` in :data:`IDS`, as :func:`corral.register` takes it."""
    IDS.append((id, entry_point, options))


def _add_namespace(prefix: str, factory: Any, **options: Any) -> None:
    """List ``prefix`` in :data:`NAMESPACES`, as :func:`corral.register_namespace` takes it."""
    NAMESPACES.append((prefix, factory, options))


# -- PettingZoo parallel envs -------------------------------------------------------------

_MPE2 = {
    name: f"mpe2.{name}"
    for name in (
        "simple_v3",
        "simple_adversary_v3",
        "simple_crypto_v3",
        "simple_push_v3",
        "simple_reference_v3",
        "simple_speaker_listener_v4",
        "simple_spread_v3",
        "simple_tag_v3",
        "simple_world_comm_v3",
        "simple_formation_v1",
        "simple_line_v1",
        "collect_treasure_v1",
    )
}
# The natively batched ones (corral.envs.mpe), exact to mpe2.
_MPE2_BATCHED = {
    "simple_v3": "corral.envs.mpe.simple:BatchedSimple",
    "simple_spread_v3": "corral.envs.mpe.simple_spread:BatchedSimpleSpread",
    "simple_reference_v3": "corral.envs.mpe.simple_reference:BatchedSimpleReference",
    "simple_speaker_listener_v4": (
        "corral.envs.mpe.simple_speaker_listener:BatchedSimpleSpeakerListener"
    ),
    "simple_push_v3": "corral.envs.mpe.simple_push:BatchedSimplePush",
    "simple_tag_v3": "corral.envs.mpe.simple_tag:BatchedSimpleTag",
    "simple_adversary_v3": "corral.envs.mpe.simple_adversary:BatchedSimpleAdversary",
    "simple_crypto_v3": "corral.envs.mpe.simple_crypto:BatchedSimpleCrypto",
    "simple_world_comm_v3": "corral.envs.mpe.simple_world_comm:BatchedSimpleWorldComm",
    "simple_formation_v1": "corral.envs.mpe.simple_formation:BatchedSimpleFormation",
    "simple_line_v1": "corral.envs.mpe.simple_line:BatchedSimpleLine",
    "collect_treasure_v1": "corral.envs.mpe.collect_treasure:BatchedCollectTreasure",
}
# The implementation modules: PettingZoo 1.27 deprecates importing ``<name>_v<N>`` modules.
_SISL = {
    "multiwalker_v9": "pettingzoo.sisl.multiwalker.multiwalker",
    "pursuit_v5": "pettingzoo.sisl.pursuit.pursuit",
}
_BUTTERFLY = {
    "pistonball_v6": "pettingzoo.butterfly.pistonball.pistonball",
    "cooperative_pong_v6": "pettingzoo.butterfly.cooperative_pong.cooperative_pong",
    "knights_archers_zombies_v11": (
        "pettingzoo.butterfly.knights_archers_zombies.knights_archers_zombies"
    ),
}
# MAgent2's grid worlds of many agents: the packages of its scenarios (the ``<name>_v<N>``
# modules only re-export them).
_MAGENT2 = {
    name: f"magent2.environments.{name.rpartition('_v')[0]}"
    for name in (
        "battle_v4",
        "battlefield_v5",
        "combined_arms_v6",
        "gather_v5",
        "tiger_deer_v4",
        "adversarial_pursuit_v4",
    )
}


def _build_mpe2(module: str, **kwargs: Any) -> Any:
    """mpe2's env of ``module``, its arguments checked as the natively batched one's are."""
    check_arguments(kwargs)
    return build_unchecked(module, **kwargs)


# (id prefix, pip extra, names -> module path, how to build from the module)
_PARALLEL = (
    ("mpe2", "pettingzoo", _MPE2, _build_mpe2),
    ("pettingzoo/sisl", "sisl", _SISL, partial(build, factory="parallel_env")),
    ("pettingzoo/butterfly", "butterfly", _BUTTERFLY, partial(build, factory="parallel_env")),
    ("magent2", "magent2", _MAGENT2, partial(build, factory="parallel_env")),
)

for _prefix, _extra, _table, _builder in _PARALLEL:
    for _name, _module in _table.items():
        batched = _MPE2_BATCHED.get(_name) if _prefix == "mpe2" else None
        _add(f"{_prefix}/{_name}", partial(_builder, _module), batched=batched, extra=_extra)

# -- PettingZoo AEC games -----------------------------------------------------------------

# The implementation modules (PettingZoo 1.27 deprecates importing ``<name>_v<N>`` modules),
# and whether the game is zero-sum (hanabi is cooperative).
_CLASSIC = {
    "rps_v2": ("pettingzoo.classic.rps.rps", True),
    "tictactoe_v3": ("pettingzoo.classic.tictactoe.tictactoe", True),
    "connect_four_v3": ("pettingzoo.classic.connect_four.connect_four", True),
    "leduc_holdem_v4": ("pettingzoo.classic.rlcard_envs.leduc_holdem", True),
    "texas_holdem_v4": ("pettingzoo.classic.rlcard_envs.texas_holdem", True),
    "texas_holdem_no_limit_v6": ("pettingzoo.classic.rlcard_envs.texas_holdem_no_limit", True),
    "chess_v6": ("pettingzoo.classic.chess.chess", True),
    "go_v5": ("pettingzoo.classic.go.go", True),
    "hanabi_v5": ("pettingzoo.classic.hanabi.hanabi", False),
}

for _name, (_module, _zero_sum) in _CLASSIC.items():
    _add(
        f"pettingzoo/classic/{_name}",
        partial(build_classic, _module, _zero_sum),
        extra="pettingzoo",
    )

# -- Gymnasium ----------------------------------------------------------------------------

# Ids listed by `corral list`; any other Gymnasium id loads through the namespace.
_GYMNASIUM_IDS = (
    "CartPole-v1",
    "Pendulum-v1",
    "MountainCar-v0",
    "Acrobot-v1",
    "FrozenLake-v1",
    "Taxi-v4",
)


def gymnasium_names(name: str) -> Collection[str] | None:
    """``None`` where ``gymnasium.make(name)`` finds ``name`` (or imports the module of
    ``module:Env-v0``, which may register it), else every id Gymnasium knows."""
    if ":" in name:
        return None
    import gymnasium
    from gymnasium.envs.registration import get_env_id, parse_env_id

    ids = set(gymnasium.envs.registry)
    # gymnasium.make takes an id without its version for the latest one
    unversioned = {get_env_id(*parse_env_id(i)[:2], None) for i in ids}
    return None if name in ids | unversioned else sorted(ids)


for _name in _GYMNASIUM_IDS:
    _add(f"gym/{_name}", make_gymnasium, name=_name)
_add_namespace("gym", make_gymnasium, names=gymnasium_names)

# -- EPyMARL's benchmarks: Gymnasium envs of several agents -------------------------------

# (id prefix and pip extra, the package whose import registers the Gymnasium ids, ids
# listed by `corral list`: the tasks of EPyMARL's benchmark); any other id of the
# package loads through the namespace.
_MULTI_AGENT_GYMNASIUM = (
    (
        "lbf",
        "lbforaging",
        (
            "Foraging-8x8-2p-2f-coop-v3",
            "Foraging-2s-8x8-2p-2f-coop-v3",
            "Foraging-10x10-3p-3f-v3",
            "Foraging-2s-10x10-3p-3f-v3",
            "Foraging-15x15-4p-3f-v3",
        ),
    ),
    ("rware", "rware", ("rware-tiny-2ag-v2", "rware-tiny-4ag-v2", "rware-small-4ag-v2")),
)


def package_names(package: str, name: str) -> Collection[str] | None:
    """``None`` where importing ``package`` registers the Gymnasium id ``name``, else every
    id it registers."""
    importlib.import_module(package)
    import gymnasium

    ids = {
        i
        for i, spec in gymnasium.envs.registry.items()
        if isinstance(spec.entry_point, str) and spec.entry_point.startswith(package + ".")
    }
    return None if name in ids else sorted(ids)


for _prefix, _package, _names in _MULTI_AGENT_GYMNASIUM:
    _factory = partial(make_from_package, _package)
    for _name in _names:
        _add(f"{_prefix}/{_name}", _factory, extra=_prefix, name=_name)
    _add_namespace(_prefix, _factory, extra=_prefix, names=partial(package_names, _package))

# -- OpenSpiel ----------------------------------------------------------------------------

# Games listed by `corral list` (each loads and plays quickly); any other game
# name loads through the namespace.
_OPENSPIEL_GAMES = (
    "tic_tac_toe",
    "connect_four",
    "breakthrough",
    "kuhn_poker",
    "leduc_poker",
    "liars_dice",
    "goofspiel",
    "matrix_pd",
    "matrix_rps",
)


def openspiel_names(name: str) -> Collection[str] | None:
    """``None`` where OpenSpiel has the game ``name`` (``kuhn_poker(players=3)`` with its
    parameters), else every game it has."""
    import pyspiel

    games = pyspiel.registered_names()
    return None if name.partition("(")[0] in games else games


for _name in _OPENSPIEL_GAMES:
    _add(f"openspiel/{_name}", OpenSpielEnv, extra="openspiel", game=_name)
_add_namespace("openspiel", OpenSpielEnv, extra="openspiel", names=openspiel_names)
