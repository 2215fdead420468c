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


@pytest.fixture(autouse=True)
def _registries_as_they_were():
    """A method or dataset a test registers in this process (an in-process plugin, a folder dataset named in a
    spec) is gone after it: every test starts from the registries as collection left them. Restored in place,
    since modules hold the registries' dicts."""
    from orchestrator.registry import datasets, methods

    methods.method_cards()  # the built-in cards loaded before the snapshot
    live = (methods._CARDS, methods._PLUGINS_LOADED, datasets.DATASETS, datasets._LOOKUP)
    saved = [type(x)(x) for x in live]
    yield
    for registry, copy in zip(live, saved):
        registry.clear()
        registry.update(copy)
    methods._KINDS_CACHE[:] = [None, {}]


@pytest.fixture
def local_ray() -> str:
    """The local Ray that tests running sweeps in this process share (ray_cluster.shared_local_ray); its GCS
    address."""
    pytest.importorskip("ray")
    from ray_cluster import shared_local_ray

    return shared_local_ray()
