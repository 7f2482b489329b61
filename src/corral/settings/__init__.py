"""Settings as they are typed, checked and listed: the grammar of ``--set key=value``
(:mod:`corral.settings.grammar`), the ranges declared on config fields
(:mod:`corral.settings.ranges`), the fields' docstrings (:mod:`corral.settings.docstrings`)
and the listing of them that ``--help`` shows (:mod:`corral.settings.listing`)."""

from corral.settings.docstrings import field_docs
from corral.settings.grammar import parse_settings, parse_value
from corral.settings.listing import list_settings
from corral.settings.ranges import SEED, Range, check_ranges, declared_ranges

__all__ = [
    "SEED",
    "Range",
    "check_ranges",
    "declared_ranges",
    "field_docs",
    "list_settings",
    "parse_settings",
    "parse_value",
]
