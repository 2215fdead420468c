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


@pytest.fixture
def isolated_registry(monkeypatch):
    """Method cards a test registers in this process (an in-process plugin) are gone after it: later tests
    see the built-in cards only."""
    from orchestrator.registry import methods

    methods.method_cards()  # the built-ins in the copy
    monkeypatch.setattr(methods, "_CARDS", dict(methods._CARDS))
    monkeypatch.setattr(methods, "_PLUGINS_LOADED", set(methods._PLUGINS_LOADED))
    monkeypatch.setattr(methods, "_KINDS_CACHE", [None, {}])

