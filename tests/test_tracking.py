"""MLflow tracking: URI resolution, run reuse by name, the do-nothing tracker of other ranks, and
what a run holds from its start (config, dataset input)."""

import json
import multiprocessing
import subprocess
import sys
import time
from pathlib import Path

import mlflow.data
import yaml
from mlflow.tracking import MlflowClient

from urm_ray import tracking
from urm_ray.config import load_config, resolve_tracking_uri
from urm_ray.data import store, stream
from urm_ray.data.tasks import sudoku
from urm_ray.runs import ui_hint
from urm_ray.train.session import open_run, resolve

from together import open_runs_on_one_dataset


def test_tracking_uri_resolution(tmp_path: Path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    assert resolve_tracking_uri("") == f"sqlite:///{tmp_path / 'mlflow.db'}"
    assert resolve_tracking_uri("sqlite:///rel.db") == f"sqlite:///{tmp_path / 'rel.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://127.0.0.1:5000")
    assert resolve_tracking_uri("") == "http://127.0.0.1:5000"
    assert resolve_tracking_uri("sqlite:////abs/x.db") == "sqlite:////abs/x.db"


def test_open_run_reuses_the_named_run(tmp_path: Path):
    uri = f"sqlite:///{tmp_path / 'm.db'}"
    first = tracking.open_run(uri, "exp", "run-a", {"model.loops": 8, "betas": (0.9, 0.95)})
    tracker = tracking.run_of(uri, first).tracker(True)
    tracker.log({"train/loss": 1.5}, step=3)
    tracking.Run(uri, first).close()
    again = tracking.open_run(uri, "exp", "run-a", {"model.loops": 8})
    other = tracking.open_run(uri, "exp", "run-b", {})
    assert again == first and other != first
    run = MlflowClient(uri).get_run(first)
    assert run.data.params == {"model.loops": "8", "betas": "[0.9, 0.95]"}
    assert run.data.metrics == {"train/loss": 1.5}
    assert run.info.status == "RUNNING"


def test_other_ranks_get_a_null_tracker(tmp_path: Path):
    assert isinstance(tracking.run_of("sqlite:///x.db", "abc").tracker(False), tracking.NullTracker)
    assert isinstance(tracking.run_of("sqlite:///x.db", "").tracker(True), tracking.NullTracker)


def test_a_worker_loads_no_mlflow_optuna_tune_or_dynamo_until_it_needs_them(tmp_path: Path):
    """Every Ray Train worker of a run imports the loop afresh: a rank other than 0 never logs,
    and rank 0 loads MLflow in its writer thread at the first write, not before its first step."""
    uri = f"sqlite:///{tmp_path / 'm.db'}"
    run_id = tracking.open_run(uri, "e", "r", {})
    worker = ("import sys; from urm_ray.train import loop; from urm_ray import tracking\n"
              "heavy = ('mlflow', 'optuna', 'ray.tune', 'torch._dynamo')\n"
              "other = tracking.run_of(sys.argv[1], sys.argv[2]).tracker(False)\n"
              "other.log({'train/lr': 1.0}, 1); other.close()\n"
              "zero = tracking.run_of(sys.argv[1], sys.argv[2]).tracker(True)\n"
              "print([m for m in heavy if m in sys.modules])\n"
              "zero.log({'train/lr': 1.0}, 1); zero.close()\n"
              "print([m for m in heavy if m in sys.modules])\n")
    out = subprocess.run([sys.executable, "-c", worker, uri, run_id], capture_output=True, text=True,
                         timeout=300, check=True).stdout.split("\n")
    assert out[:2] == ["[]", "['mlflow']"]
    assert [m.step for m in MlflowClient(uri).get_metric_history(run_id, "train/lr")] == [1]


def test_a_restarted_worker_logs_each_step_once(tmp_path: Path):
    """A run restored from its step-10 checkpoint after a crash at step 15 replays steps 11-15:
    MLflow keeps the first value of each step, and the steps after the crash are logged."""
    uri = f"sqlite:///{tmp_path / 'm.db'}"
    run_id = tracking.open_run(uri, "exp", "crashy", {})
    before = tracking.run_of(uri, run_id).tracker(True)
    for step in (5, 10, 15):
        before.log({"train/lr": 1.0, "train/lm_loss": float(step)}, step)
    after = tracking.run_of(uri, run_id).tracker(True)  # the restarted worker
    for step in (15, 20):
        after.log({"train/lr": 1.0, "train/lm_loss": 100.0 + step}, step)
    history = MlflowClient(uri).get_metric_history(run_id, "train/lm_loss")
    assert [(m.step, m.value) for m in history] == [(5, 5.0), (10, 10.0), (15, 15.0), (20, 120.0)]


def test_log_dataset_records_one_input_that_mlflow_reads_back(tmp_path: Path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # artifacts of an SQLite store go to ./mlruns
    uri = f"sqlite:///{tmp_path / 'm.db'}"
    run_id = tracking.open_run(uri, "exp", "run", {})
    for _ in range(2):  # a resumed run logs it again
        tracking.Run(uri, run_id).log_dataset("sudoku4", "/data/sudoku4", "0123abcd", {"task": "sudoku"})
    inputs = MlflowClient(uri).get_run(run_id).inputs.dataset_inputs
    assert len(inputs) == 1
    assert [(t.key, t.value) for t in inputs[0].tags] == [("mlflow.data.context", "training")]
    dataset = inputs[0].dataset
    assert (dataset.name, dataset.digest) == ("sudoku4", "0123abcd")
    assert json.loads(dataset.profile) == {"task": "sudoku"}
    assert mlflow.data.get_source(dataset).uri == "/data/sudoku4"


def test_runs_starting_together_in_a_new_experiment_on_one_dataset_all_record_it(tmp_path: Path):
    """A sweep's concurrent trials (or two users' runs) start at once: MLflow's get-or-create of
    the experiment and its check-then-insert of the dataset race (unique-key failures in most
    rounds, unhandled): every run must open and record its dataset all the same."""
    uri = f"sqlite:///{tmp_path / 'm.db'}"
    client = MlflowClient(uri)
    client.search_experiments()  # creates the store's tables once, before the race
    rounds, names = 12, ["a", "b"]
    context = multiprocessing.get_context("spawn")
    barrier, failures = context.Barrier(len(names)), context.Queue()
    procs = [context.Process(target=open_runs_on_one_dataset, args=(uri, name, rounds, barrier, failures))
             for name in names]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join(timeout=120)
    errors = [failures.get() for _ in range(failures.qsize())]
    assert not errors, errors
    assert all(proc.exitcode == 0 for proc in procs)
    for k in range(rounds):
        experiment = client.get_experiment_by_name(f"race-{k:03d}")
        runs = client.search_runs([experiment.experiment_id])
        assert sorted(r.info.run_name for r in runs) == names
        for run in runs:
            assert [d.dataset.digest for d in run.inputs.dataset_inputs] == [f"d{k:03d}"]


def test_a_run_holds_its_config_and_dataset_before_training(tmp_path: Path, monkeypatch):
    """What the driver records when it opens the run, so that a run which crashes in its first
    step still shows what it was and what it read."""
    monkeypatch.chdir(tmp_path)
    data = tmp_path / "sudoku4"
    sudoku.build_generated(data, size=4, num_train=20, num_test=5, blanks=8, seed=1)
    cfg = resolve(load_config("sudoku4-urm", [f"data.path={data}", "tracking.tracking_uri=sqlite:///m.db",
                                              "train.run_name=crashy"]))
    uri = cfg.tracking.tracking_uri
    run_id = open_run(cfg, stream.load_meta(cfg.data), None).id
    client = MlflowClient(uri)
    saved = yaml.safe_load(Path(client.download_artifacts(run_id, "config.yaml", str(tmp_path))).read_text())
    assert saved["data"]["path"] == str(data) and saved["train"]["run_name"] == "crashy"
    run = client.get_run(run_id)
    assert run.info.status == "RUNNING" and run.data.params["data.path"] == str(data)
    experiment = client.get_experiment(run.info.experiment_id)  # MLflow's UI: a training experiment
    assert experiment.tags[tracking.EXPERIMENT_KIND_TAG] == "custom_model_development"
    (dataset,) = [i.dataset for i in run.inputs.dataset_inputs]
    assert (dataset.name, dataset.digest) == ("sudoku4", store.metadata_digest(data))
    assert json.loads(dataset.profile) == {"task": "sudoku", "seq_len": 16, "vocab_size": 6,
                                           "num_rows": {"train": 20, "test": 5}}


def test_a_new_sqlite_store_is_created_by_one_command_at_a_time(tmp_path: Path):
    """While one command holds the store's creation lock, another waits before creating tables;
    four commands opening one new store at once all succeed."""
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    opener = ("import sys; from mlflow import MlflowClient; from urm_ray import tracking\n"
              "with tracking.store_opening(sys.argv[1]): pass\n"
              "print(len(MlflowClient(sys.argv[1]).search_experiments()))")
    with tracking.sqlite_creation_lock(uri):
        waiting = subprocess.Popen([sys.executable, "-c", opener, uri], stdout=subprocess.PIPE, text=True)
        time.sleep(3)  # long enough to import MLflow and create the tables, were it not waiting
        assert waiting.poll() is None and not (tmp_path / "mlflow.db").exists()
    assert waiting.communicate(timeout=120)[0].strip() == "1"  # the Default experiment
    fresh = f"sqlite:///{tmp_path / 'fresh' / 'mlflow.db'}"
    (tmp_path / "fresh").mkdir()
    together = [subprocess.Popen([sys.executable, "-c", opener, fresh], stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True) for _ in range(4)]
    for proc in together:
        out, err = proc.communicate(timeout=180)
        assert proc.returncode == 0, err[-2000:]


def test_the_store_opening_reads_the_runs_record_meanwhile(tmp_path: Path):
    """While the block runs the store opens (created when new) and the run's record is read; the
    block's value returns it afterwards: None for a run that does not exist yet."""
    uri = f"sqlite:///{tmp_path / 'm.db'}"
    with tracking.store_opening(uri, ("exp", "absent")) as previous:
        pass
    assert previous() is None and (tmp_path / "m.db").is_file()
    run_id = tracking.open_run(uri, "exp", "there", {"train.steps": 4}, {"k": "v"})
    with tracking.store_opening(uri, ("exp", "there")) as previous:
        pass
    found = previous()
    assert (found.run_id, found.status, found.params, found.tags["k"]) == (run_id, "RUNNING", {"train.steps": "4"}, "v")


def test_every_experiment_a_run_opens_is_marked_model_training(tmp_path: Path):
    """MLflow's experiment kind: set on the experiments urm_ray creates and on those it finds
    unmarked; an experiment a user marked otherwise keeps its kind."""
    uri = f"sqlite:///{tmp_path / 'm.db'}"
    client = MlflowClient(uri)
    tracking.open_run(uri, "fresh", "run", {})
    client.create_experiment("made-before")  # by hand, or by an older urm_ray
    tracking.open_run(uri, "made-before", "run", {})
    client.create_experiment("marked", tags={tracking.EXPERIMENT_KIND_TAG: "genai_development"})
    tracking.open_run(uri, "marked", "run", {})
    kinds = {e.name: e.tags.get(tracking.EXPERIMENT_KIND_TAG) for e in client.search_experiments()}
    assert kinds == {"fresh": "custom_model_development", "made-before": "custom_model_development",
                     "marked": "genai_development", "Default": None}


def test_ui_links_open_the_model_training_view(tmp_path: Path):
    uri = f"sqlite:///{tmp_path / 'm.db'}"
    run_id = tracking.open_run(uri, "exp", "run", {})
    experiment_id = MlflowClient(uri).get_experiment_by_name("exp").experiment_id
    assert tracking.run_ui_url(uri, run_id) == (
        f"http://127.0.0.1:5000/#/experiments/{experiment_id}/runs/{run_id}?workflowType=machine_learning")
    assert tracking.run_ui_url(uri, run_id, experiment=True) == (  # a sweep: its trials' list
        f"http://127.0.0.1:5000/#/experiments/{experiment_id}?workflowType=machine_learning")
    assert tracking.ui_url("http://mlflow.lan:5000/", "7") == (
        "http://mlflow.lan:5000/#/experiments/7?workflowType=machine_learning")
    hint = ui_hint(uri).splitlines()
    assert hint == [f"MLflow UI: mlflow ui --backend-store-uri {uri}, then open",
                    f"  exp  http://127.0.0.1:5000/#/experiments/{experiment_id}?workflowType=machine_learning"]


def test_runs_lists_a_sweep_as_one_row_however_many_trials_it_has(tmp_path: Path, monkeypatch):
    from urm_ray.runs import list_runs

    monkeypatch.setattr(tracking, "_PAGE", 50)  # the trials fill more than two pages
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    tracking.open_run(uri, "plain", "before", {"train.steps": 10})
    parent = tracking.open_run(uri, "sweep-big", "big", {"trials": 120},
                               {tracking.KIND_TAG: "sweep", tracking.SWEEP_TAG: "big"})
    for number in range(120):
        tracking.open_run(uri, "sweep-big", f"big-t{number:03d}", {},
                          {tracking.PARENT_TAG: parent, tracking.KIND_TAG: "trial", tracking.TRIAL_TAG: str(number)})
    tracking.open_run(uri, "plain", "after", {"train.steps": 10})
    names = [line.split()[1] for line in list_runs(uri).splitlines()[1:]]
    assert names == ["after", "big", "before"]
    assert len(list_runs(uri, "sweep-big", limit=200).splitlines()) == 1 + 121  # the sweep and its trials
