import pytest

from tests.training.train_helpers import make_dataset, reset_accelerate


@pytest.fixture(autouse=True)
def fresh_accelerate():
    """Accelerate keeps process-wide state; each test starts from none."""
    yield
    reset_accelerate()


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory, llama_target):
    """A target-generated-style dataset from the tiny llama target."""
    return make_dataset(llama_target, tmp_path_factory.mktemp("data") / "rows")
