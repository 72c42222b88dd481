"""The ``urm-ray`` command line.

    urm-ray presets                               list the shipped training configs
    urm-ray data sudoku --out data/s4 --size 4    build a dataset (Parquet + metadata.json)
    urm-ray data arc --source ARC_DIR --out data/arc1      ARC-AGI from Kaggle or per-task JSON
    urm-ray train sudoku4-urm model.loops=8       train (or resume) one run on Ray Train
    urm-ray eval runs/<name>/checkpoint_...       evaluate a checkpoint on its held-out split
                                                  (ARC: augmentation voting, pass@k; to MLflow)
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Callable
from pathlib import Path

from urm_ray.errors import ConfigError, DataError


def _presets(args: argparse.Namespace) -> None:
    from urm_ray.config import preset_names, read_yaml

    for name in preset_names():
        description = read_yaml(name).get("model", {}).get("name", "?")
        print(f"{name:28s} model={description}")


def _train(args: argparse.Namespace) -> None:
    from urm_ray.config import load_config
    from urm_ray.train.driver import fit

    result = fit(load_config(args.config, args.overrides))
    summary = {k: v for k, v in result.metrics.items() if k.startswith("eval/") or k == "step"}
    print(json.dumps({"run_name": result.run_name, "checkpoint": result.checkpoint_path,
                      "mlflow_run_id": result.mlflow_run_id, **summary}, indent=2))


def _eval(args: argparse.Namespace) -> None:
    from urm_ray.train import offline

    if not offline.is_arc(args.checkpoint):
        metrics = offline.evaluate_checkpoint(args.checkpoint, split=args.split,
                                              max_rows=args.max_rows)
        print(json.dumps(metrics, indent=2))
        return
    report = offline.evaluate_arc_checkpoint(
        args.checkpoint, split=args.split, num_augmentations=args.augmentations,
        halt_early=args.halt_early, pass_ks=args.pass_k, max_pairs=args.max_rows,
    )
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=1) + "\n")
    if args.mlflow:
        run_id = offline.log_to_mlflow(args.checkpoint, report["split"], report["metrics"],
                                       report["step"], report, args.tracking_uri)
        report["mlflow_run_id"] = run_id
    print(json.dumps({k: v for k, v in report.items() if k != "tasks"}, indent=2))


def _data_arc(args: argparse.Namespace) -> None:
    from urm_ray.data.tasks import arc

    meta = arc.build(args.out, args.source, subsets=args.subsets, test_set=args.test_set,
                     prefix=args.prefix, overwrite=args.overwrite)
    print(f"wrote {args.out}: {meta.build['num_tasks']} tasks, pairs {meta.build['num_pairs']}")


def _data_sudoku(args: argparse.Namespace) -> None:
    from urm_ray.data.tasks import sudoku

    if bool(args.train_csv) != bool(args.test_csv):
        raise ConfigError("--train-csv and --test-csv go together")
    if args.train_csv:
        sudoku.build_from_csv(
            args.out, args.train_csv, args.test_csv, size=args.size, subsample=args.subsample,
            seed=args.seed,
        )
    else:
        sudoku.build_generated(
            args.out, size=args.size, num_train=args.num_train, num_test=args.num_test,
            blanks=args.blanks, seed=args.seed,
        )
    print(f"wrote {args.out}")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="urm-ray", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("presets", help="list shipped training configs").set_defaults(func=_presets)

    train = sub.add_parser("train", help="train one run (resumes when train.run_name exists)")
    train.add_argument("config", help="YAML path or preset name (see `urm-ray presets`)")
    train.add_argument("overrides", nargs="*", help="dotted overrides, e.g. model.loops=8")
    train.set_defaults(func=_train)

    ev = sub.add_parser("eval", help="evaluate a checkpoint folder on its held-out split")
    ev.add_argument("checkpoint")
    ev.add_argument("--split", default="", help="split to evaluate (default: data.eval_split)")
    ev.add_argument("--max-rows", type=int, default=0, help="0 = all rows (ARC: test pairs)")
    ev.add_argument("--augmentations", type=int, default=0,
                    help="ARC: augmented versions voted per test pair (0 = data.num_augmentations)")
    ev.add_argument("--halt-early", action="store_true",
                    help="ARC: take each answer where the Q-head halts; stop batches early")
    ev.add_argument("--pass-k", type=int, nargs="+", default=[1, 2, 10, 100, 1000],
                    help="ARC: report pass@k for these k")
    ev.add_argument("--out", default="", help="ARC: write the full report (per task) as JSON")
    ev.add_argument("--no-mlflow", dest="mlflow", action="store_false",
                    help="ARC: do not log the evaluation to MLflow")
    ev.add_argument("--tracking-uri", default="", help="MLflow URI (default: the run's)")
    ev.set_defaults(func=_eval)

    data = sub.add_parser("data", help="build a dataset").add_subparsers(dest="task", required=True)
    s = data.add_parser("sudoku", help="generate n x n Sudoku or convert a Sudoku-Extreme CSV")
    s.add_argument("--out", required=True, help="dataset folder to create")
    s.add_argument("--size", type=int, default=4, choices=[4, 6, 9])
    s.add_argument("--num-train", type=int, default=2000)
    s.add_argument("--num-test", type=int, default=500)
    s.add_argument("--blanks", type=int, default=8, help="blank cells per generated puzzle")
    s.add_argument("--train-csv", help="Sudoku-Extreme style CSV (source,question,answer,rating)")
    s.add_argument("--test-csv", help="held-out CSV (with --train-csv)")
    s.add_argument("--subsample", type=int, default=0, help="keep N training puzzles (1k setting)")
    s.add_argument("--seed", type=int, default=0)
    s.set_defaults(func=_data_sudoku)

    a = data.add_parser("arc", help="ARC-AGI from Kaggle-combined or per-task JSON files")
    a.add_argument("--source", required=True,
                   help="folder with <prefix>_<subset>_challenges.json / _solutions.json, or"
                        " with one sub-folder of <task>.json files per subset")
    a.add_argument("--out", required=True, help="dataset folder to create")
    a.add_argument("--subsets", nargs="+", default=["training", "evaluation"],
                   help="subsets to include (ARC-AGI-2: training2 evaluation2)")
    a.add_argument("--test-set", default="evaluation",
                   help="subset whose test pairs are held out (its demonstrations train)")
    a.add_argument("--prefix", default="arc-agi", help="Kaggle file prefix")
    a.add_argument("--overwrite", action="store_true", help="replace an existing --out")
    a.set_defaults(func=_data_arc)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    func: Callable[[argparse.Namespace], None] = args.func
    try:
        func(args)
    except (ConfigError, DataError) as err:
        print(f"urm-ray: error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
