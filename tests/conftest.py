"""Shared fixtures of the project's own tests."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest_plugins = ["pytester"]

FIXTURES = Path(__file__).parent / "fixtures"
ASCEND = FIXTURES / "ascend"


@pytest.fixture
def ascend_fixtures() -> Path:
    return ASCEND
