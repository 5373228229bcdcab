"""Shared fixtures for the Python tests: where the ferry binary and the repository are."""
import os
import pathlib
import subprocess

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def ferry_bin() -> str:
    path = os.environ.get("FERRY_BIN", str(REPO / "build" / "ferry"))
    if not os.access(path, os.X_OK):
        pytest.fail(f"ferry binary not found at {path}: build first (tools/setup.sh) or set FERRY_BIN")
    return path


@pytest.fixture(scope="session")
def six_layer_model(ferry_bin, tmp_path_factory) -> str:
    """The random 6-layer serve_tiny checkpoint as a GGUF: room for splits into up to 6 stages (the
    default model has 2 layers)."""
    out = tmp_path_factory.mktemp("six-layers") / "serve_tiny.gguf"
    subprocess.run([ferry_bin, "convert", str(REPO / "tests/fixtures/glm5/serve_tiny"), str(out), "--type", "bf16",
                    "--tokenizer", str(REPO / "tests/fixtures/tokenizer"), "--quiet"], check=True, capture_output=True)
    return str(out)
