"""Fixtures shared by the test modules."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from corral import registry


@pytest.fixture
def isolated_registry(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Ids and namespaces registered inside the test are forgotten after it."""
    registry._load_builtins()  # the builtins must be in the copy, not loaded into it
    monkeypatch.setattr(registry, "_specs", dict(registry._specs))
    monkeypatch.setattr(registry, "_namespaces", dict(registry._namespaces))
    yield


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Skip tests marked ``slow`` (long learning runs) when ``CI=true``."""
    if os.environ.get("CI", "").lower() not in ("1", "true", "yes"):
        return
    skip = pytest.mark.skip(reason="slow learning run: skipped under CI=true, run it by hand")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)
