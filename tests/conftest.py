import pytest

import clconv


@pytest.fixture(scope="session")
def queue():
    """The default device's queue (PoCL here; set CLCONV_DEVICE to choose another)."""
    return clconv.default_queue()


@pytest.fixture(autouse=True, scope="session")
def private_tuning_cache(tmp_path_factory):
    """Keep a developer's tuning cache out of the tests: the planner's choices stay the defaults."""
    mp = pytest.MonkeyPatch()
    mp.setenv("CLCONV_CACHE_DIR", str(tmp_path_factory.mktemp("tuning-cache")))
    mp.delenv("CLCONV_AUTOTUNE", raising=False)
    yield
    mp.undo()
