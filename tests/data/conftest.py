import pytest

from tests.training.train_helpers import reset_accelerate


@pytest.fixture(autouse=True)
def fresh_accelerate():
    """Data generation splits prompts over Accelerate's processes, whose state is process-wide; each test starts from
    none."""
    yield
    reset_accelerate()
