"""bench/sweep_efficiency.py's accounting: trial-steps spent until the target is first reached."""

import runpy
from pathlib import Path

BENCH = runpy.run_path(str(Path(__file__).resolve().parents[1] / "bench" / "sweep_efficiency.py"))


def test_steps_to_target_counts_every_trials_progress_so_far():
    rows = [  # (seconds, trial, step, metric)
        (1.0, 0, 50, None), (2.0, 1, 50, 0.2), (3.0, 0, 100, 0.4),
        (4.0, 1, 100, 0.9), (5.0, 0, 150, 0.95),
    ]
    assert BENCH["steps_to_target"](rows, 0.9, "max") == 200  # trial 0 at 100 + trial 1 at 100
    assert BENCH["steps_to_target"](rows, 0.99, "max") is None
    assert BENCH["steps_to_target"](rows, 0.3, "min") == 100  # 0.2 at t=2: 50 + 50


def test_summary_per_arm():
    runs = [{"arm": "random", "steps_to_target": {"0.8": 300}, "total_trial_steps": 600,
             "best": 0.9, "pruned": 0, "wall_s": 10.0},
            {"arm": "random", "steps_to_target": {"0.8": None}, "total_trial_steps": 600,
             "best": 0.5, "pruned": 0, "wall_s": 12.0}]
    summary = BENCH["summarize"](runs)["random"]
    assert summary["target 0.8: reached"] == "1/2" and summary["target 0.8: mean trial-steps"] == 300
    assert summary["mean_best"] == 0.7


def test_tpe_ask_bench_times_each_point_on_a_study_of_that_size(tmp_path: Path):
    import json

    import optuna

    tpe = runpy.run_path(str(Path(__file__).resolve().parents[1] / "bench" / "tpe_ask.py"))
    url = f"sqlite:///{tmp_path / 'tpe.db'}"
    out = tmp_path / "rows.json"
    rows = tpe["main"](["--storage", url, "--points", "5,12", "--asks", "2", "--running", "3",
                        "--json", str(out)])
    assert [r["finished"] for r in rows] == [5, 12] and json.loads(out.read_text()) == rows
    assert all(r["cpu_ms"] > 0 and r["wall_ms"] > 0 for r in rows)
    (summary,) = optuna.get_all_study_summaries(url)
    # 3 left running, 5 added + 2 asked, then 5 more added (to 12) + 2 asked
    assert summary.n_trials == 3 + 5 + 2 + 5 + 2
