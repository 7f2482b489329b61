"""Partition agents into groups of identical spaces, for the vector layer."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from gymnasium import spaces

from corral.errors import GroupError

GroupMap = str | Mapping[str, str] | Mapping[str, Iterable[str]] | None

_INDEX_SUFFIX = re.compile(r"[_\-]?\d+$")


def prefix_of(agent: str) -> str:
    """The agent's name without its trailing index: ``adversary_0`` -> ``adversary``."""
    return _INDEX_SUFFIX.sub("", agent) or agent


def group_agents(
    agents: Iterable[str],
    observation_space: Callable[[str], spaces.Space],
    action_space: Callable[[str], spaces.Space],
    group_map: GroupMap = None,
) -> dict[str, list[str]]:
    """Groups of agents with identical spaces, in the order agents are given.

    ``group_map`` is ``None`` or ``"prefix"`` (group by name prefix),
    ``"agent"`` (one group per agent), a mapping agent -> group, or a mapping
    group -> agents. A group whose agents' spaces differ raises
    :class:`GroupError` naming the two agents and their spaces.

    Examples:
        >>> from gymnasium.spaces import Discrete
        >>> group_agents(["adversary_0", "agent_0", "agent_1"], lambda a: Discrete(2),
        ...              lambda a: Discrete(3))
        {'adversary': ['adversary_0'], 'agent': ['agent_0', 'agent_1']}
    """
    agents = list(agents)
    groups: dict[str, list[str]] = {}
    for agent in agents:
        groups.setdefault(_group_of(agent, group_map), []).append(agent)
    for name, members in groups.items():
        _check_same_spaces(name, members, observation_space, action_space)
    return groups


def _group_of(agent: str, group_map: GroupMap) -> str:
    if group_map is None or group_map == "prefix":
        return prefix_of(agent)
    if group_map == "agent":
        return agent
    if isinstance(group_map, str):
        raise GroupError(f"group_map {group_map!r} is not 'prefix', 'agent' or a mapping")
    own = group_map.get(agent)
    if isinstance(own, str):
        return own
    for group, members in group_map.items():
        if not isinstance(members, str) and agent in members:
            return group
    raise GroupError(f"agent {agent!r} is in no group of the group map {dict(group_map)}")


def _check_same_spaces(
    group: str,
    members: list[str],
    observation_space: Callable[[str], spaces.Space],
    action_space: Callable[[str], spaces.Space],
) -> None:
    first = members[0]
    for other in members[1:]:
        for kind, space_of in (("observation", observation_space), ("action", action_space)):
            a: Any = space_of(first)
            b: Any = space_of(other)
            if a != b:
                raise GroupError(
                    f"group {group!r} mixes {kind} spaces: {first!r} has {a}, {other!r} has {b}; "
                    "pass a group map that separates them (e.g. group_map='agent')"
                )
