# Imported first so that every Ray the tests start (in-process or through `bca sweep`) listens on loopback.
import orchestrator.sweep  # noqa: F401

import pytest  # noqa: E402
import torch  # noqa: E402


@pytest.fixture
def one_thread():
    """One torch thread for tests of per-sample loops of small tensor ops: intra-op threads only add overhead
    on a shared machine."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
