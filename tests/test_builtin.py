"""Built-in datasets (urm_ray.data.builtin): built once into the cache with their recipe, and
built again when the cached folder came from another recipe of the same name."""

import json

import pytest

from urm_ray.data import builtin
from urm_ray.data.store import read_metadata
from urm_ray.errors import ConfigError


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    return tmp_path / "urm_ray"


def test_a_builtin_is_built_once_with_its_recipe(cache, capsys):
    folder = builtin.resolve_path("builtin:nqueens6")
    assert "building built-in dataset nqueens6" in capsys.readouterr().out
    stamp = json.loads((cache / "nqueens6" / builtin.RECIPE_FILE).read_text())
    assert stamp == {"builder": "urm_ray.data.tasks.nqueens.build_unconditional", "n": 6, "repeats": 512}
    assert read_metadata(folder).splits["train"].num_rows == 4 * 512
    assert builtin.resolve_path("builtin:nqueens6") == folder
    assert capsys.readouterr().out == ""  # cached: not built again


def test_a_folder_built_by_another_recipe_is_built_again(cache, capsys):
    """A cache left by an older recipe (here: 6-queens built with 2 copies per solution under the
    name of the 512-copy recipe) is replaced, not trained on."""
    builtin.RECIPES["nqueens6"].build(cache / "nqueens6", n=6, repeats=2)
    assert read_metadata(cache / "nqueens6").splits["train"].num_rows == 8
    folder = builtin.resolve_path("builtin:nqueens6")
    assert "again: it was built by another recipe" in capsys.readouterr().out
    assert read_metadata(folder).splits["train"].num_rows == 4 * 512


def test_an_unknown_builtin_names_the_known_ones(cache):
    with pytest.raises(ConfigError, match="unknown built-in dataset; expected one of builtin:sudoku4"):
        builtin.resolve_path("builtin:sudoku5")
    assert not cache.exists()
