"""The ``urm-ray`` command line: presets, dataset building, and clean errors (exit code 2)."""

from pathlib import Path

from urm_ray.cli import main
from urm_ray.data.store import read_metadata


def test_presets_lists_shipped_configs(capsys):
    assert main(["presets"]) == 0
    assert "sudoku4-urm" in capsys.readouterr().out


def test_data_sudoku_builds_a_dataset(tmp_path: Path):
    out = tmp_path / "s4"
    assert main(["data", "sudoku", "--out", str(out), "--size", "4", "--num-train", "50",
                 "--num-test", "10", "--blanks", "6"]) == 0
    meta = read_metadata(out)
    assert (meta.seq_len, meta.vocab_size) == (16, 6)
    assert meta.splits["train"].num_rows == 50 and meta.splits["test"].num_rows == 10


def test_bad_override_is_a_clean_error(capsys):
    assert main(["train", "sudoku4-urm", "model.truncation=9"]) == 2
    err = capsys.readouterr().err
    assert "model.truncation=9" in err and "model.loops=4" in err


def test_csv_flags_must_come_together(tmp_path: Path, capsys):
    assert main(["data", "sudoku", "--out", str(tmp_path / "x"), "--train-csv", "a.csv"]) == 2
    assert "--test-csv" in capsys.readouterr().err


def test_data_commands_refuse_an_existing_out_before_reading_input(tmp_path: Path, capsys):
    out = tmp_path / "s4"
    args = ["data", "sudoku", "--out", str(out), "--size", "4", "--num-train", "20", "--num-test", "5",
            "--blanks", "6"]
    assert main(args) == 0
    missing_csv = ["--train-csv", str(tmp_path / "no.csv"), "--test-csv", str(tmp_path / "no.csv")]
    assert main(["data", "maze", "--out", str(out), *missing_csv]) == 2  # not "no.csv not found"
    assert "already exists; pass --overwrite" in capsys.readouterr().err
    assert main([*args, "--overwrite", "--seed", "3"]) == 0


def test_eval_of_a_folder_that_is_no_checkpoint_is_a_clean_error(tmp_path: Path, capsys):
    assert main(["eval", str(tmp_path / "nope")]) == 2
    assert "not a urm_ray checkpoint folder (config.yaml is missing)" in capsys.readouterr().err


def test_runs_without_a_store_is_a_clean_error_and_creates_none(tmp_path: Path, capsys):
    store = tmp_path / "mlflow.db"
    assert main(["runs", "--tracking-uri", f"sqlite:///{store}"]) == 2
    assert f"no MLflow store at sqlite:///{store}" in capsys.readouterr().err
    assert not store.exists()
