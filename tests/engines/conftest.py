import pytest


@pytest.fixture(scope="session")
def engine():
    """The llama.cpp build (`make test` builds it first, cached; here `install_llama_cpp` only finds it)."""
    from draftheads.interop.llama_cpp_build import install_llama_cpp

    return install_llama_cpp()
