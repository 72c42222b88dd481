"""Secrets out of records: ``redact`` for what is shown, ``strip`` for what is recorded,
``remember``/``recall`` for a process that needs the password back, and the log records and
terminal output of a process that imports urm_ray."""

from __future__ import annotations

import io
import logging
import pickle
from contextlib import redirect_stderr

import pytest

from urm_ray import redact
from urm_ray.cli import main

URLS = [  # (given, shown, recorded)
    ("postgresql://urm:s3cr3t@db:5432/mlflow", "postgresql://urm:***@db:5432/mlflow",
     "postgresql://urm@db:5432/mlflow"),
    ("https://me:tok3n@mlflow.example/", "https://me:***@mlflow.example/", "https://me@mlflow.example/"),
    ("s3://AKIA:s3cr3t@bucket/runs", "s3://AKIA:***@bucket/runs", "s3://AKIA@bucket/runs"),
    ("postgresql://urm@db/optuna?password=s3cr3t&sslmode=require",
     "postgresql://urm@db/optuna?password=***&sslmode=require", "postgresql://urm@db/optuna?sslmode=require"),
    ("postgresql://urm@db/optuna?sslmode=require&password=s3cr3t",
     "postgresql://urm@db/optuna?sslmode=require&password=***", "postgresql://urm@db/optuna?sslmode=require"),
    ("host=db password=s3cr3t dbname=x", "host=db password=*** dbname=x", "host=db dbname=x"),
    ("sqlite:////tmp/mlflow.db", "sqlite:////tmp/mlflow.db", "sqlite:////tmp/mlflow.db"),
    ("user@example.com wrote a=1", "user@example.com wrote a=1", "user@example.com wrote a=1"),
]


@pytest.mark.parametrize(("given", "shown", "recorded"), URLS)
def test_redact_shows_and_strip_records_no_secret(given: str, shown: str, recorded: str):
    assert redact.redact(given) == shown
    assert redact.strip(given) == recorded
    assert redact.strip({"a": [given, 3], "b": (given,)}) == {"a": [recorded, 3], "b": (recorded,)}


def test_a_remembered_url_is_recalled_from_its_record():
    url = "postgresql://urm:pw-recall@db:5432/optuna"
    assert redact.recall(redact.strip(url)) == redact.strip(url)  # unknown: as recorded
    redact.remember(url)
    assert redact.recall(redact.strip(url)) == url
    assert redact.recall("postgresql://other@db/optuna") == "postgresql://other@db/optuna"


def test_every_log_record_is_redacted():
    stream = io.StringIO()
    logger = logging.getLogger("urm_ray.test_redact")
    handler = logging.StreamHandler(stream)
    logger.addHandler(handler)
    try:
        logger.warning("store %s is down", "postgresql://urm:pw-logged@db/mlflow")
    finally:
        logger.removeHandler(handler)
    assert stream.getvalue() == "store postgresql://urm:***@db/mlflow is down\n"


def test_an_rdb_storage_pickles_without_its_password(tmp_path):
    """What Tune saves of a sweep's searcher holds the storage's URL without the password, and
    reads back with it in a process that remembers it."""
    from urm_ray.tune.info import storage

    url = f"sqlite:///{tmp_path / 'o.db'}?password=pw-pickled"
    blob = pickle.dumps(storage(url))
    assert b"pw-pickled" not in blob
    redact.remember(url)
    assert pickle.loads(blob).url == url


def test_the_cli_prints_no_password_in_an_error(tmp_path, capsys):
    closed = "postgresql://urm:pw-cli-error@127.0.0.1:1/optuna"
    assert main(["sweep", "quickstart", "--storage", closed, "--dir", str(tmp_path / "sweeps")]) == 2
    err = capsys.readouterr().err
    assert "postgresql://urm:***@127.0.0.1:1/optuna" in err and "pw-cli-error" not in err
    printed = io.StringIO()
    with redirect_stderr(printed), redact.redacting_output():
        import sys
        print("via", "https://a:pw-printed@host/", file=sys.stderr)
    assert printed.getvalue() == "via https://a:***@host/\n"
