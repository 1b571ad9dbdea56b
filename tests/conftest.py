import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
# `--precision auto` picks bf16 on a CPU with bf16 units: pinned off, so every test (and every process it starts)
# runs the same numbers on any CI machine; the tests of bf16 ask for it or patch the answer themselves
os.environ["BERTKIT_CPU_BF16_UNITS"] = "0"
SHARED_DATA = Path(os.environ.get("BERTKIT_SHARED_DATA", REPO.parent / "shared" / "data"))


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """../shared/data (or $BERTKIT_SHARED_DATA); tests that need it skip with a reason when it is absent."""
    if not SHARED_DATA.is_dir():
        pytest.skip(f"real data not found at {SHARED_DATA} (set BERTKIT_SHARED_DATA to the shared/data folder)")
    return SHARED_DATA


@pytest.fixture
def clean_dist_env():
    """pretrain() in this process makes a process group of one; keep its env vars from leaking into other tests."""
    saved = dict(os.environ)
    yield
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        if k in saved:
            os.environ[k] = saved[k]
        else:
            os.environ.pop(k, None)


def pytest_collection_modifyitems(items):
    """Tests that use the shared_data fixture carry the shared_data marker: `pytest -m "not shared_data"`."""
    for item in items:
        if "shared_data" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.shared_data)
