import os

import pytest
import torch

from tests.cli_world import world  # noqa: F401 - the CLI tests' shared fixtures, built once a session
from tests.fixtures import FAMILIES, make_target, make_tokenizer


@pytest.fixture(autouse=True)
def thread_count(request):
    """Tiny models run fastest on one thread (intra-op threads cost more than they bring: 6-25x
    slower measured on a busy 2-core machine); tests of the real target use every core."""
    before = torch.get_num_threads()
    torch.set_num_threads((os.cpu_count() or 1) if request.node.get_closest_marker("slow") else 1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session", autouse=True)
def profile_cache(tmp_path_factory):
    """Cost profiles (costmodel/profile.py) of the tests' targets go to a folder of this session, not the user's."""
    os.environ["DRAFTHEADS_PROFILES"] = str(tmp_path_factory.mktemp("profiles"))


@pytest.fixture(scope="session")
def tokenizer():
    return make_tokenizer("chatml")


@pytest.fixture(scope="session", params=FAMILIES)
def family(request):
    return request.param


@pytest.fixture(scope="session")
def tiny_target(family, tokenizer):
    """A frozen tiny random target of each family (shared: tests must not modify it)."""
    return make_target(family, tokenizer)


@pytest.fixture(scope="session")
def llama_target(tokenizer):
    return make_target("llama", tokenizer)


@pytest.fixture(scope="session")
def tiny_target_dir(tmp_path_factory, tokenizer):
    """A tiny llama target and its tokenizer saved as a Hugging Face folder."""
    folder = tmp_path_factory.mktemp("tiny-llama")
    make_target("llama", tokenizer).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder
