"""Fixtures shared by the test modules."""

from __future__ import annotations

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
