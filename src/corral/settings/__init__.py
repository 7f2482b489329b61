"""Settings as they are typed and checked: the grammar of ``--set key=value``
(:mod:`corral.settings.grammar`) and the ranges declared on config fields
(:mod:`corral.settings.ranges`)."""

from corral.settings.grammar import parse_settings, parse_value
from corral.settings.ranges import SEED, Range, check_ranges, declared_ranges

__all__ = ["SEED", "Range", "check_ranges", "declared_ranges", "parse_settings", "parse_value"]
