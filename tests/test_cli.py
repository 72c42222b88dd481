"""The ``urm-ray`` command line: presets, dataset building, clean errors (exit code 2), every
subcommand's help and examples (and the README's commands), and a quiet terminal (no raylet,
Optuna or matplotlib lines unless --verbose)."""

import argparse
import os
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest

from urm_ray.cli import EXAMPLES, _parse, _parser, main
from urm_ray.config import load_config
from urm_ray.data.store import read_metadata
from urm_ray.tune.space import load_space


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


def test_a_missing_dataset_says_how_to_build_one(tmp_path: Path, capsys):
    """Before Ray starts: the path, and the `urm-ray data` command for it (the task from the
    folder's name when it says one)."""
    for folder, command in (("my-sudoku", "urm-ray data sudoku --out"), ("puzzles", "urm-ray data <task> --out")):
        assert main(["train", "sudoku4-urm", f"data.path={tmp_path / folder}"]) == 2
        err = capsys.readouterr().err
        assert f"data.path={tmp_path / folder}: no dataset there" in err, err
        assert f"{command} {tmp_path / folder} ...`" in err and "data.path=builtin:sudoku4" in err, err


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


def _subcommands() -> dict[str, argparse.ArgumentParser]:
    (sub,) = [a for a in _parser()._actions if isinstance(a, argparse._SubParsersAction)]
    return sub.choices


def test_every_subcommand_help_exits_0_and_ends_with_examples(capsys):
    for name, parser in _subcommands().items():
        with pytest.raises(SystemExit) as done:
            main([name, "--help"])
        assert done.value.code == 0, name
        text = capsys.readouterr().out
        examples = text[text.rindex("\nexample"):]  # the epilog, after the options
        shown = "runs" if name == "ls" else name  # an alias shows its command's examples
        assert f"urm-ray {shown}" in examples, (name, text)


def _example_lines() -> list[list[str]]:
    return [shlex.split(line.split("  #")[0])[1:] for text in EXAMPLES.values()
            for line in text.splitlines() if line.strip().startswith("urm-ray ")]


def test_help_examples_parse_and_their_configs_and_spaces_load():
    """What an example sets must be right: a preset's overrides build, a space's load (no Ray)."""
    lines = _example_lines()
    assert len(lines) >= 2 * len(EXAMPLES) - 2  # one or two per subcommand
    for argv in lines:
        args = _parse(argv)
        if args.command == "train" and not args.config.endswith(".yaml"):
            load_config(args.config, args.overrides)
        if args.command == "sweep" and args.space:
            load_space(args.space, args.overrides)


def _readme_commands(text: str) -> set[str]:
    """The word after `urm-ray` in the README's code (fenced blocks and inline spans), where a
    command is shown; prose such as "urm-ray is" is not code."""
    fenced = re.findall(r"```.*?```", text, flags=re.S)
    inline = re.findall(r"`[^`\n]+(?:\n[^`\n]+)?`", re.sub(r"```.*?```", "", text, flags=re.S))
    return {m for code in fenced + inline for m in re.findall(r"(?<![\w/-])urm-ray +([a-z][\w-]*)", code)}


def test_readme_names_only_existing_subcommands_and_their_help_works(capsys):
    """Every `urm-ray <command>` the README shows (whatever it says at the time) is a subcommand
    whose --help exits 0."""
    readme = Path(__file__).resolve().parents[1] / "README.md"
    named = _readme_commands(readme.read_text())
    assert named, "the README shows no `urm-ray <command>`"
    assert named <= set(_subcommands()), f"not subcommands: {sorted(named - set(_subcommands()))}"
    for name in sorted(named):
        with pytest.raises(SystemExit) as done:
            main([name, "--help"])
        assert done.value.code == 0, name
    assert _readme_commands("```\nurm-ray trian x\n```\nurm-ray is a tool; `urm-ray sweep\n--resume NAME`") == {
        "trian", "sweep"}  # the parser sees a typo in code, not prose


def _published(ray, marker: str, capfd) -> str:
    """What the driver's terminal shows after the raylet publishes a warning to every driver (as
    its worker pool does: "N PYTHON worker processes have been started ...")."""
    from ray._private.utils import publish_error_to_driver

    publish_error_to_driver("worker_pool_large", marker, ray._private.worker.global_worker.gcs_client)
    deadline = time.monotonic() + 10
    seen = ""
    while time.monotonic() < deadline and marker not in seen:
        time.sleep(0.5)
        out, err = capfd.readouterr()
        seen += out + err
    return seen


def test_raylet_warnings_stay_off_a_quiet_terminal(ray_local, capfd):
    """init_ray without verbose (the conftest's instance): a raylet warning is not printed; with
    Ray's default (what --verbose keeps) the same warning is."""
    assert "urm-quiet-marker" not in _published(ray_local, "urm-quiet-marker", capfd)
    ray_local._private.worker._worker_logs_enabled = True  # as init_ray(verbose=True) leaves it
    try:
        assert "urm-verbose-marker" in _published(ray_local, "urm-verbose-marker", capfd)
    finally:
        ray_local._private.worker._worker_logs_enabled = False


def test_optuna_and_matplotlib_stay_off_a_quiet_terminal(tmp_path: Path):
    """A sweep's first Optuna study and first matplotlib import (a fresh font cache) log a line
    each; after the CLI's quiet setup, neither does. In a fresh process: both libraries set their
    logging up once per process."""
    script = ("import logging, sys, optuna\n"
              "from urm_ray import cli\n"
              "logging.basicConfig(level=logging.INFO)\n"
              "if sys.argv[1] == 'quiet':\n"
              "    cli.quiet(); cli.quiet_optuna()\n"
              "optuna.create_study(storage=f'sqlite:///{sys.argv[2]}/optuna.db')\n"
              "import matplotlib.font_manager\n")
    said = {}
    for mode in ("default", "quiet"):
        env = {**os.environ, "MPLCONFIGDIR": str(tmp_path / mode)}  # no font cache yet
        done = subprocess.run([sys.executable, "-c", script, mode, str(tmp_path)], env=env,
                              capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-2000:]
        said[mode] = done.stdout + done.stderr
    # matplotlib logs "generated new fontManager" (INFO), and "is building the font cache" (a
    # WARNING) when that takes over 5 s, as on a busy machine
    assert "A new study created" in said["default"] and "matplotlib.font_manager" in said["default"], said
    assert "A new study created" not in said["quiet"] and "matplotlib" not in said["quiet"], said["quiet"]


LONG = "x" * 101  # over a sweep name's 100 characters (and a run name's 128 with the suffix below)


def _refused(argv: list[str], shown: str, capsys) -> None:
    """``urm-ray ARGV`` exits 2 with one line on stderr that shows ``shown``, and no traceback."""
    assert main(argv) == 2
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("urm-ray: error: "), err
    assert shown in lines[0] and "Traceback" not in err, err


@pytest.fixture
def workdir(tmp_path: Path, monkeypatch) -> Path:
    """An empty working folder inside tmp_path, with MLflow's store in it: a name that escapes
    the folder, or any run recorded, leaves something behind in tmp_path."""
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{work / 'mlflow.db'}")
    return work


def _left_behind(tmp_path: Path) -> list[str]:
    return sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*") if p.name != "work")


BAD_NAMES = ["../escaped", "/ABSOLUTE", "a'b", ".hidden", LONG]


def _bad(name: str, tmp_path: Path) -> str:
    return str(tmp_path / "absolute") if name == "/ABSOLUTE" else name


@pytest.mark.parametrize("name", BAD_NAMES)
def test_bad_sweep_names_are_refused_before_anything_is_created(name, workdir, tmp_path, capsys):
    name = _bad(name, tmp_path)
    _refused(["sweep", "quickstart", "--name", name, "trials=1"], f"--name={name!r}"[:40], capsys)
    for command in (["sweep", "--resume", name], ["best", name], ["final", name]):
        _refused(command, f"sweep name={name!r}"[:40], capsys)
    assert _left_behind(tmp_path) == []


@pytest.mark.parametrize("name", BAD_NAMES)
def test_bad_run_and_experiment_names_are_refused_before_anything_is_created(name, workdir, tmp_path, capsys):
    name = _bad(name, tmp_path) + ("x" * 28 if name == LONG else "")  # runs allow 128 characters
    for key in ("train.run_name", "tracking.experiment"):
        _refused(["train", "sudoku4-urm", f"{key}={name}"], f"{key}={name!r}"[:40], capsys)
        _refused(["sweep", "quickstart", f"{key}={name}"], f"{key}={name!r}"[:40], capsys)
    _refused(["final", "qs", "--model-name", name], f"--model-name={name!r}"[:40], capsys)
    assert _left_behind(tmp_path) == []


def _space_with_bound(folder: Path, high: str) -> Path:
    path = folder / "space.yaml"
    path.write_text(f"base: sudoku4-urm\n"
                    f"params:\n"
                    f"  model.loops: {{type: int, low: 2, high: 6}}\n"
                    f"  model.truncation: {{type: int, low: 0, high: {high!r}}}\n")
    return path


@pytest.mark.parametrize("high, shown", [
    ("max()", "model.truncation.high='max()': max() takes 2 or more arguments, got 0"),
    ("int(1e999)", "model.truncation.high='int(1e999)': holds a number too large"),
    ("-" * 5000 + "1", "nested deeper than 50"),
])
def test_a_bad_bound_is_refused_before_anything_is_created(high, shown, workdir, tmp_path, capsys):
    space = _space_with_bound(tmp_path, high)
    _refused(["sweep", str(space)], shown, capsys)
    assert _left_behind(tmp_path) == ["space.yaml"]


def test_an_override_that_is_no_yaml_value_is_refused(workdir, tmp_path, capsys):
    _refused(["train", "sudoku4-urm", "train.steps=[1"], "override train.steps='[1': not a valid YAML value",
             capsys)
    _refused(["sweep", "quickstart", "trials=[1"], "override trials='[1'", capsys)
    assert _left_behind(tmp_path) == []

