import pytest
import torch


@pytest.fixture(autouse=True)
def one_thread():
    """Tiny models run fastest single-threaded; on a shared 2-core machine intra-op threads thrash (25x slower measured)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
