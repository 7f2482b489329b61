"""docs/training.md's table of run settings says what :class:`RunConfig` holds: every field
has a row, every row names fields, and a default written as a value is the field's."""

from __future__ import annotations

import dataclasses
import re

from support.paths import ROOT

from corral.training.config import RunConfig

DOC = ROOT / "docs" / "training.md"
HEADER = "| run setting | default | meaning |"


def table_rows() -> list[tuple[list[str], list[str]]]:
    """``(names, defaults)`` of each row of the run settings table."""
    lines = DOC.read_text().splitlines()
    start = lines.index(HEADER) + 2
    rows = []
    for line in lines[start:]:
        if not line.startswith("|"):
            break
        names_cell, default_cell = (cell.strip() for cell in line.strip("|").split("|")[:2])
        names = re.findall(r"`(\w+)`", names_cell)
        rows.append((names, [d.strip() for d in default_cell.split(", ")]))
    return rows


def field_defaults() -> dict[str, object]:
    return {
        f.name: f.default if f.default is not dataclasses.MISSING else None
        for f in dataclasses.fields(RunConfig)
    }


def test_every_run_setting_has_a_row_and_every_row_names_settings() -> None:
    named = [name for names, _ in table_rows() for name in names]
    assert sorted(set(field_defaults()) - set(named)) == [], "settings without a row"
    assert sorted(set(named) - set(field_defaults())) == [], "rows of no setting"


def _as_written(value: object) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def test_a_default_written_as_a_value_is_the_settings() -> None:
    fields = field_defaults()
    compared, wrong = [], []
    for names, defaults in table_rows():
        if len(defaults) != len(names):  # one phrase said of several settings: prose
            assert len(defaults) == 1, f"{names}: {len(defaults)} defaults, {len(names)} settings"
            continue
        for name, written in zip(names, defaults, strict=True):
            value = fields[name]
            if value is None or value in ((), "") or isinstance(value, dict):
                continue  # resolved at run time ("the backend's", "auto"...): prose
            compared.append(name)
            if written.strip("`").replace(",", "") != _as_written(value):
                wrong.append((name, written, value))
    assert wrong == []
    assert len(compared) >= 15  # the table's literal defaults are read, not skipped
