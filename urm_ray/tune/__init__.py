"""Hyperparameter sweeps: Ray Tune over the Train driver, Optuna (TPE) + ASHA, MLflow.

    space.py      search-space YAML -> validated space, Optuna define-by-run (dependent bounds)
    params.py     one searched parameter;  expr.py  the arithmetic of bounds and derived metrics
    resources.py  CPU/GPU shares of trials, workers and Ray Data; concurrency
    search.py     Ray's OptunaSearch with pruned trials told as PRUNED and resume take-over
    trial.py      the Tune trainable: one trial = one run of the Train driver
    fate.py       each trial's fate (completed / pruned / failed) on its nested MLflow run
    table.py      the live table of trials
    sweep.py      create / run / resume a sweep;  report.py  leaderboard, best config, plots
    best.py       ``urm-ray best`` and ``urm-ray final``
"""
