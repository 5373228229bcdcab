"""Shared fixtures for the Python tests: where the ferry binary and the repository are."""
import os
import pathlib

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def ferry_bin() -> str:
    path = os.environ.get("FERRY_BIN", str(REPO / "build" / "ferry"))
    if not os.access(path, os.X_OK):
        pytest.fail(f"ferry binary not found at {path}: build first (tools/setup.sh) or set FERRY_BIN")
    return path
