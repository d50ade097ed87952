"""A cached llama.cpp build whose record is damaged is built again, and says so first."""

from draftheads.interop.llama_cpp_build import COMPLETE, build_folder, cmake_options, installed_llama_cpp


def test_a_damaged_build_record_is_said_and_built_again(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("DRAFTHEADS_CACHE", str(tmp_path))
    assert installed_llama_cpp() is None and not capsys.readouterr().err   # none built: nothing to say
    folder = build_folder(cmake_options())
    folder.mkdir(parents=True)
    (folder / COMPLETE).write_text('{"sdist": "llama_cpp_python-0.3.36.tar.gz", "programs": {"llama-ser')
    assert installed_llama_cpp() is None
    said = capsys.readouterr().err
    assert f"llama.cpp build record {folder / COMPLETE} is damaged (cut short" in said and "builds it again" in said
    assert (folder / COMPLETE).exists()   # what replaces it is the next build, not this check
