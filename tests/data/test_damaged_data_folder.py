"""A `draftheads data` folder whose own files are damaged: refused in one line naming the file, never written over
unless --overwrite asks for the folder to be made again."""

import pytest

from draftheads.core.state_files import DamagedFile
from draftheads.data import datagen, datastore
from draftheads.data.prompts import read_prompts
from tests.data.test_datagen import load, make_recipe, prompt_file, target  # noqa: F401 - target is a fixture


def test_damaged_metadata_is_refused_and_kept_unless_overwrite(tmp_path, target):  # noqa: F811
    recipe = make_recipe(tmp_path / "out", prompt_file(tmp_path))
    first = load(datagen.run_data(recipe, target=target))
    meta = recipe.data_dir / datastore.META
    meta.write_bytes(meta.read_bytes()[:40])
    with pytest.raises(DamagedFile, match=f"data folder metadata {meta} is damaged \\(cut short .*--overwrite"):
        datagen.run_data(recipe, target=target)
    assert len(meta.read_bytes()) == 40   # refused, not written over
    assert load(datagen.run_data(recipe, target=target, overwrite=True)) == first
    assert datastore.is_complete(recipe.data_dir)


def test_damaged_metadata_is_refused_before_rows_are_read(tmp_path):
    (tmp_path / datastore.META).write_bytes(b'{"complete": tr\xffe}')
    with pytest.raises(DamagedFile, match="not UTF-8 text"):
        datastore.check_finished(tmp_path)


def test_damaged_prompt_list_names_its_line(tmp_path):
    path = tmp_path / "prompts.jsonl"
    path.write_text('{"turns": ["hi"]}\n{"turns": ["hello"\n')
    with pytest.raises(DamagedFile, match="prompt list .* is damaged \\(line 2: cut short .*--overwrite"):
        read_prompts(path)
    path.write_text('{"turns": ["hi"], "colour": "red"}\n')
    with pytest.raises(DamagedFile, match="colour"):
        read_prompts(path)


def test_a_feature_cache_with_a_damaged_manifest_is_said_before_it_goes(tmp_path, capsys):
    cache = tmp_path / "features" / "abc"
    cache.mkdir(parents=True)
    (cache / "manifest.json").write_text('{"shard_digests": ["00')
    assert not datastore.can_serve(cache)
    assert f"feature cache manifest {cache / 'manifest.json'} is damaged" in capsys.readouterr().out
