"""The sweep's Optuna searcher, driven directly (no Ray cluster): early-stopped trials reach
Optuna as PRUNED with their intermediate values (Ray's OptunaSearch tells them COMPLETE), and a
restored searcher takes over the trials asked after its last checkpoint instead of asking more."""

from __future__ import annotations

import math
import pickle
import subprocess
import sys
from pathlib import Path

import optuna
import pytest
import yaml
from optuna.trial import TrialState

from urm_ray.tune.derived import Derived
from urm_ray.tune.search import FATE_ATTR, TRIAL_KEY, SweepSearch, make_sampler
from urm_ray.tune.space import load_space

METRIC = "eval/token_accuracy"


@pytest.fixture
def space(tmp_path: Path):
    data = {
        "base": "sudoku4-urm",
        "overrides": {"train.steps": 30, "eval.every": 10},
        "params": {"model.loops": {"type": "int", "low": 2, "high": 6},
                   "model.truncation": {"type": "int", "low": 0, "high": "model.loops - 1"},
                   "optim.lr": {"type": "log_float", "low": 1.0e-4, "high": 3.0e-3}},
        "objectives": [{"metric": METRIC, "mode": "max"}],
        "scheduler": {"grace_steps": 10, "reduction_factor": 2},
    }
    path = tmp_path / "space.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return load_space(str(path))


def _searcher(space, tmp_path: Path, **kwargs) -> SweepSearch:
    storage = optuna.storages.RDBStorage(f"sqlite:///{tmp_path / 'optuna.db'}")
    return SweepSearch(space, storage, "s", make_sampler(space, "random"), **kwargs)


def _study(tmp_path: Path) -> optuna.Study:
    return optuna.load_study(study_name="s", storage=f"sqlite:///{tmp_path / 'optuna.db'}")


def test_suggestions_carry_the_trial_number_and_respect_bounds(space, tmp_path: Path):
    searcher = _searcher(space, tmp_path)
    configs = [searcher.suggest(f"tune{i}") for i in range(5)]
    assert [c[TRIAL_KEY] for c in configs] == [0, 1, 2, 3, 4]
    assert all(0 <= c["model.truncation"] < c["model.loops"] for c in configs)


def test_stopped_trial_is_pruned_not_complete(space, tmp_path: Path):
    searcher = _searcher(space, tmp_path)
    for trial_id in ("a", "b", "c"):
        searcher.suggest(trial_id)
    searcher.on_trial_result("a", {"step": 5, "train/lm_loss": 2.0})  # before the first eval
    searcher.on_trial_result("a", {"step": 10, METRIC: 0.2})
    # ASHA's stop: Tune hands the stopping result to on_trial_complete, not on_trial_result
    searcher.on_trial_complete("a", {"step": 20, METRIC: 0.3})
    searcher.on_trial_complete("b", {"step": 30, METRIC: 0.5})
    searcher.on_trial_complete("c", None, error=True)
    a, b, c = _study(tmp_path).trials
    assert a.state == TrialState.PRUNED and a.intermediate_values == {10: 0.2, 20: 0.3}
    assert a.value == 0.3 and a.user_attrs[FATE_ATTR] == "pruned"
    assert b.state == TrialState.COMPLETE and b.value == 0.5 and b.user_attrs[FATE_ATTR] == "completed"
    assert c.state == TrialState.FAIL and c.user_attrs[FATE_ATTR] == "failed"


def test_rays_behaviour_is_kept_for_comparison(space, tmp_path: Path):
    searcher = _searcher(space, tmp_path, pruned_as="complete")
    searcher.suggest("a")
    searcher.on_trial_complete("a", {"step": 10, METRIC: 0.2})
    (a,) = _study(tmp_path).trials
    assert a.state == TrialState.COMPLETE and a.value == 0.2  # what biases TPE


def test_restored_searcher_takes_over_trials_asked_after_its_checkpoint(space, tmp_path: Path):
    first = _searcher(space, tmp_path)
    first.suggest("a")
    first.save(str(tmp_path / "searcher.pkl"))  # Tune's last experiment checkpoint
    lost_running = first.suggest("b")  # asked after it; the driver is then killed
    lost_finished = first.suggest("c")
    first.on_trial_complete("c", {"step": 30, METRIC: 0.4})

    second = _searcher(space, tmp_path)
    second.restore(str(tmp_path / "searcher.pkl"))
    resumed = [second.suggest("d"), second.suggest("e")]
    assert sorted(c[TRIAL_KEY] for c in resumed) == [1, 2]
    by_number = {c[TRIAL_KEY]: c for c in resumed}
    assert by_number[1] == lost_running and by_number[2] == lost_finished
    assert len(_study(tmp_path).trials) == 3  # nothing asked twice
    reads = []
    study_reads = second._ot_study.get_trials
    second._ot_study.get_trials = lambda *args, **kwargs: reads.append(1) or study_reads(*args, **kwargs)
    assert second.suggest("f")[TRIAL_KEY] == 3  # then new trials as usual
    assert second.suggest("g")[TRIAL_KEY] == 4
    assert not reads  # the take-over scan read the study once, at the first suggestion


def test_searcher_state_pickles(space, tmp_path: Path):
    searcher = _searcher(space, tmp_path)
    searcher.suggest("a")
    pickle.loads(pickle.dumps(searcher.__dict__))  # Tune saves the searcher this way


def test_multi_objective_study_with_derived_compute(tmp_path: Path):
    space = load_space("quickstart-compute")
    storage = optuna.storages.RDBStorage(f"sqlite:///{tmp_path / 'optuna.db'}")
    searcher = SweepSearch(space, storage, "mo", make_sampler(space))
    config = searcher.suggest("a")
    searcher.suggest("b")
    reported = {"eval/exact_accuracy": 0.9, "eval/q_halt_segments": 2.0, "step": 1000}  # full length
    metrics = Derived.of(space, config).add(reported)
    assert metrics["compute/passes_per_puzzle"] == 2.0 * config["model.loops"]
    searcher.on_trial_result("a", metrics)  # no intermediate values in multi-objective studies
    searcher.on_trial_complete("a", metrics)
    searcher.on_trial_complete("b", {**metrics, "step": 100})
    study = optuna.load_study(study_name="mo", storage=storage)
    a, b = study.trials
    assert a.state == TrialState.COMPLETE and a.values == [0.9, 2.0 * config["model.loops"]]
    assert b.state == TrialState.PRUNED


def test_derived_metrics_unpickle_without_torch_or_mlflow():
    """A trial on several workers hands Ray Train's controller its report callback: importing the
    callback's module and unpickling what it holds must not import torch, MLflow or the config
    there, on the trial's critical path."""
    space = load_space("quickstart-compute")
    values = {"model.loops": 4, "model.truncation": 1, "model.max_segments": 2, "optim.lr": 1e-3}
    code = ("import pickle, sys; import urm_ray.tune.derived; d = pickle.loads(sys.stdin.buffer.read()); "
            "print(d.add({'eval/q_halt_segments': 2.0})['compute/passes_per_puzzle']); "
            "print(sorted(m for m in ('torch', 'mlflow', 'optuna', 'urm_ray.config') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], input=pickle.dumps(Derived.of(space, values)),
                         capture_output=True, check=True).stdout.decode().split("\n")
    assert float(out[0]) == 2.0 * 4
    assert out[1] == "[]"


def test_a_nan_objective_is_told_as_failed_and_the_search_goes_on(space, tmp_path: Path):
    """A trial whose objective is NaN (a derived metric it could not compute) never ranks: Optuna
    records it as failed, the next suggestions come as usual."""
    from urm_ray.tune.report import ranked

    searcher = _searcher(space, tmp_path)
    searcher.suggest("a")
    searcher.suggest("b")
    searcher.on_trial_result("a", {"step": 10, METRIC: float("nan")})
    searcher.on_trial_complete("a", {"step": 30, METRIC: float("nan")})
    searcher.on_trial_complete("b", {"step": 30, METRIC: 0.5})
    assert searcher.suggest("c")[TRIAL_KEY] == 2
    study = _study(tmp_path)
    a, b, _ = study.trials
    assert a.state == TrialState.FAIL and a.intermediate_values == {} and b.state == TrialState.COMPLETE
    assert [t.number for t in ranked(study, space)] == [1]


def test_a_derived_metric_that_divides_by_zero_is_nan_with_one_warning(tmp_path: Path, caplog):
    data = {"base": "sudoku4-urm", "overrides": {"train.steps": 30, "eval.every": 10},
            "params": {"model.loops": {"type": "int", "low": 2, "high": 6}},
            "derived": {"compute/accuracy_per_segment": "eval/exact_accuracy / eval/q_halt_segments"},
            "objectives": [{"metric": "compute/accuracy_per_segment", "mode": "max"}],
            "scheduler": {"grace_steps": 10, "reduction_factor": 2}}
    path = tmp_path / "space.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    derived = Derived.of(load_space(str(path)), {"model.loops": 4})
    name = "compute/accuracy_per_segment"
    with caplog.at_level("WARNING", logger="urm_ray.tune.derived"):
        first = derived.for_tune({"eval/exact_accuracy": 0.5, "eval/q_halt_segments": 0, "step": 10}, False)
        second = derived.add({"eval/exact_accuracy": 0.6, "eval/q_halt_segments": 0, "step": 20})
        third = derived.add({"eval/exact_accuracy": 0.6, "eval/q_halt_segments": 2, "step": 30})
    assert first is not None and math.isnan(first[name]) and math.isnan(second[name])
    assert third[name] == 0.3
    (warning,) = [r.getMessage() for r in caplog.records if r.name == "urm_ray.tune.derived"]
    assert warning.startswith(f"derived metric {name} is NaN: derived.{name}=") and "divides by zero" in warning
