"""Shared pytest fixtures."""

import shutil
from pathlib import Path

import pytest
import torch

REFERENCE_DIR = Path(__file__).resolve().parent / "fixtures" / "reference"


@pytest.fixture
def reference_dir() -> Path:
    """The official-code fixtures (tests/fixtures/reference); a missing file fails its test."""
    return REFERENCE_DIR


@pytest.fixture
def model_batch():
    """Factory for a random model batch {inputs, labels, puzzle_identifiers} matching a TaskSpec."""

    def make(task, size: int = 2, seed: int = 0) -> dict:
        gen = torch.Generator().manual_seed(seed)
        inputs = torch.randint(0, task.vocab_size, (size, task.seq_len), generator=gen)
        ids = torch.randint(0, task.num_puzzle_identifiers, (size,), generator=gen)
        return {"inputs": inputs, "labels": inputs.clone(), "puzzle_identifiers": ids}

    return make


@pytest.fixture(scope="session")
def ray_local():
    """A private 2-CPU Ray instance for the whole pytest session, started as the CLI starts one
    (``init_ray``: never attaches to a running cluster; a single-worker run trains in-process)."""
    import os

    import ray

    from urm_ray.cluster import init_ray

    if ray.is_initialized():
        yield ray
        return
    init_ray(num_cpus=2)
    yield ray
    ray.shutdown()
    os.environ.pop("RAY_API_SERVER_ADDRESS", None)


@pytest.fixture(scope="session")
def sudoku_data(tmp_path_factory):
    """Factory for a generated 4x4 Sudoku dataset, built once per pytest session for each set of
    arguments and shared by every test that asks for the same one: tests read it, never write it."""
    from urm_ray.data.tasks import sudoku

    built: dict[tuple, Path] = {}

    def make(num_train: int = 64, num_test: int = 8, blanks: int = 6, seed: int = 1) -> Path:
        key = (num_train, num_test, blanks, seed)
        if key not in built:
            out = tmp_path_factory.mktemp("sudoku4") / "sudoku4"
            sudoku.build_generated(out, size=4, num_train=num_train, num_test=num_test, blanks=blanks, seed=seed)
            built[key] = out
        return built[key]

    return make


@pytest.fixture(scope="session")
def sudoku4(sudoku_data) -> Path:
    """The small 4x4 Sudoku dataset most training tests run on (64 train, 8 test puzzles)."""
    return sudoku_data()


@pytest.fixture(scope="session")
def postgres_server():
    """A private PostgreSQL server on 127.0.0.1 for the whole pytest session (tests/postgres.py:
    its own port and data folder; as root, run as the ``postgres`` system user), with password
    authentication as a shared server has: its URLs carry the password (``.password``), which no
    record may keep. Tests create their own databases in it (``postgres_server.create_database(name)``
    returns the URL)."""
    import secrets

    from postgres import find_binaries, start_server

    if find_binaries() is None:
        pytest.skip("PostgreSQL is not installed: no initdb/postgres in /usr/lib/postgresql/*/bin "
                    "or on PATH (apt-get install postgresql)")
    server = start_server(password=f"pw-{secrets.token_hex(8)}")
    yield server
    server.stop()


@pytest.fixture
def load_shipped(tmp_path: Path):
    """``load_space`` for a shipped space by name or path; an evaluation sweep's space (it names
    a ``checkpoint``) gets a folder holding a trained run's config.yaml and a state.pt, all its
    validation reads."""
    import yaml

    from urm_ray.config import dump_yaml, load_config
    from urm_ray.tune.space import find_space, load_space

    folder = tmp_path / "checkpoint_0"
    folder.mkdir()
    (folder / "config.yaml").write_text(dump_yaml(load_config("sudoku4-trm")))
    shutil.copy(Path(__file__).resolve().parent / "fixtures" / "checkpoint-v1" / "state.pt", folder)

    def load(source: str):
        evaluates = "checkpoint" in yaml.safe_load(find_space(source).read_text())
        return load_space(source, [f"checkpoint={folder}"] if evaluates else [])

    return load
