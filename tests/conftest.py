import pytest

import clconv


@pytest.fixture(scope="session")
def queue():
    """The default device's queue (PoCL here; set CLCONV_DEVICE to choose another)."""
    return clconv.default_queue()
