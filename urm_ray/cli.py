"""The ``urm-ray`` command line.

    urm-ray presets                               list the shipped training configs
    urm-ray data sudoku --out data/s4 --size 4    build a dataset (Parquet + metadata.json);
                                                  also: data maze, data nqueens, data coloring
    urm-ray data arc --source ARC_DIR --out data/arc1      ARC-AGI from Kaggle or per-task JSON
    urm-ray train sudoku4-urm model.loops=8       train (or resume) one run on Ray Train
    urm-ray eval runs/<name>/checkpoint_...       evaluate a checkpoint on its held-out split
                                                  (ARC: augmentation voting, pass@k; to MLflow)
    urm-ray sweep quickstart trials=8             hyperparameter sweep (Tune + Optuna + ASHA)
    urm-ray sweep --resume NAME                   continue an interrupted sweep
    urm-ray runs                                  the runs and sweeps in the MLflow store (also: ls)
    urm-ray best NAME                             print and export a sweep's best config
    urm-ray final NAME --seeds 3                  re-check the top configs, train the winner
    urm-ray report NAME                           a sweep's HTML report (plots, leaderboard), to MLflow too
    urm-ray study studies/sudoku4-families.yaml   sweeps, re-checks and finals to one results table
"""

from __future__ import annotations

import argparse
import gc
import json
import logging
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from urm_ray.data.tasks import registry
from urm_ray.errors import ConfigError, DataError, Interrupted, TrainingFailed
from urm_ray.redact import redacting_output
from urm_ray.eval.config import SELECTIONS

if TYPE_CHECKING:
    from urm_ray.eval.config import EvalConfig

# `urm-ray <command> --help` ends with these examples
EXAMPLES = {
    "presets": """example:
  urm-ray presets""",
    "train": """examples:
  urm-ray train sudoku4-urm                                   # 4x4 Sudoku, a few minutes on a CPU
  urm-ray train sudoku4-urm model.loops=8 train.steps=300 train.run_name=loops8
  urm-ray train sudoku4-urm train.run_name=loops8             # resume loops8 after Ctrl-C""",
    "plan": """examples:
  urm-ray plan arc1-urm --gpu a100-40 --seq-len 900 --vocab 12 --puzzles 800801   # exit 1: does not fit
  urm-ray plan arc1-urm train.micro_batch_size=24 --gpu a100-40 --seq-len 900 --vocab 12
  urm-ray plan --space urm-sudoku --gpu a10g                  # the space's heaviest trial, its data""",
    "eval": """examples:
  urm-ray eval runs/loops8/checkpoint_<time>                  # its held-out split
  urm-ray eval runs/arc/checkpoint_<time> --augmentations 100 --pass-k 1 2 --out report.json
  urm-ray eval runs/trm/checkpoint_<time> --width 16 --noise 0.2 --select q   # test-time compute
  urm-ray eval runs/trm/checkpoint_<time> --segments 32                       # deeper than trained""",
    "sample": """example:
  urm-ray sample runs/gram/checkpoint_<time> --num 64 --temperature 0.7""",
    "sweep": """examples:
  urm-ray sweep quickstart trials=8                           # a shipped space, 8 trials
  urm-ray sweep quickstart --name qs trials=4 train.steps=500  # shorter trials, named qs
  urm-ray sweep --resume qs                                   # continue after Ctrl-C
  urm-ray sweep --resume qs --trials 20                       # 20 trials in all, same study
  urm-ray sweep quickstart --warm-start qs:3 --max-device-hours 4 --price 2.5""",
    "runs": """examples:
  urm-ray runs                                                # ./mlflow.db, newest 50 runs
  urm-ray runs --experiment sweep-qs --limit 20""",
    "best": """examples:
  urm-ray best qs                                             # prints it, writes sweeps/qs/best_config.yaml
  urm-ray train sweeps/qs/best_config.yaml train.steps=2000
  urm-ray best qc --pick 5                                    # several objectives: the front, trial 5's config""",
    "final": """examples:
  urm-ray final qs                                            # the space's top configs and seeds
  urm-ray final qs --top 2 --seeds 3 resources.num_workers=2
  urm-ray final qc --pick 5                                   # the Pareto front's trial 5""",
    "report": """examples:
  urm-ray report qs                                           # sweeps/qs/report.html, also in MLflow
  urm-ray report qs --dir /data/sweeps""",
    "study": """examples:
  urm-ray study studies/sudoku4-families.yaml                 # runs it; again: goes on where it stopped
  urm-ray study studies/paper-tasks.yaml --check              # validate only (spaces, GPU memory)""",
    "data": """examples:
  urm-ray data sudoku --out data/s4 --size 4                  # generated 4x4 Sudoku
  urm-ray data arc --source ARC_DIR --out data/arc1           # ARC-AGI (urm-ray data arc --help)""",
}


def _presets(args: argparse.Namespace) -> None:
    from urm_ray.config import preset_names, read_yaml

    for name in preset_names():
        description = read_yaml(name).get("model", {}).get("name", "?")
        print(f"{name:28s} model={description}")


def _train(args: argparse.Namespace) -> None:
    from urm_ray.config import load_config
    from urm_ray.progress import Progress
    from urm_ray.train.driver import fit

    cfg = load_config(args.config, args.overrides)
    with Progress("train", cfg.train.steps, unit="steps", live=sys.stderr.isatty()) as progress:
        result = fit(cfg, scale_up_s=args.scale_up, verbose=args.verbose, progress=progress)
        progress.phase("done")  # the bar left on the terminal: the run's whole time
    summary = {k: v for k, v in result.metrics.items() if k.startswith(registry.HELD_OUT_PREFIXES) or k == "step"}
    print(json.dumps({"run_name": result.run_name, "checkpoint": result.checkpoint_path,
                      "mlflow_run_id": result.mlflow_run_id,
                      **_ui(cfg.tracking.tracking_uri, result.mlflow_run_id), **summary}, indent=2))


def _ui(tracking_uri: str, run_id: str | None, experiment: bool = False) -> dict[str, str]:
    """The run's page in MLflow's UI (``experiment``: its experiment's runs) for the printed
    summary; none when tracking is off."""
    from urm_ray.config import resolve_tracking_uri
    from urm_ray.tracking import run_ui_url

    if not run_id:
        return {}
    return {"mlflow_ui": run_ui_url(resolve_tracking_uri(tracking_uri), run_id, experiment)}


def _plan(args: argparse.Namespace) -> None:
    """Exit 1 when it does not fit (a script can stop there), 0 when it does."""
    from urm_ray.config import load_config
    from urm_ray.tune.plan import check_gpu, heaviest, plan, task_shape
    from urm_ray.tune.space import load_space

    check_gpu(args.gpu)
    if args.space:
        cfg = heaviest(load_space(args.config, args.overrides))
    else:
        cfg = load_config(args.config, args.overrides)
    the_plan = plan(cfg, task_shape(cfg, args.seq_len, args.vocab, args.puzzles), args.gpu)
    print(the_plan.render(args.config))
    if not the_plan.fits:
        raise SystemExit(1)


def _eval(args: argparse.Namespace) -> None:
    """``urm-ray eval``: ``evaluate``'s mode the flags and the checkpoint's task ask for."""
    from urm_ray import evaluate

    evaluate.check_checkpoint(args.checkpoint)  # a crafted or damaged state.pt: refused before any work
    task = evaluate.task_of(args.checkpoint)
    settings, mode = _eval_mode(args, task)
    if mode == "plain":
        evaluate.check_temperature(evaluate.config_of(args.checkpoint), args.temperature)
    request = evaluate.Request(mode, args.split, args.max_rows, live=sys.stderr.isatty(),
                               temperature=args.temperature, views=args.augmentations, pass_ks=tuple(args.pass_k))
    report = evaluate.evaluate(args.checkpoint, settings, request)
    printed = report.as_dict()
    if args.out:
        Path(args.out).write_text(json.dumps(printed, indent=1) + "\n")
    if args.mlflow and mode != "plain":
        printed["mlflow_run_id"] = evaluate.log(report, args.tracking_uri)
    print(json.dumps({k: v for k, v in printed.items() if k != "tasks"}, indent=2))


def _eval_mode(args: argparse.Namespace, task: Any) -> tuple[EvalConfig, str]:
    """The test-time settings the eval flags give and the mode they ask for: ``testtime`` where
    they ask for any (``--halt-early`` too, but on a task with its own score, which takes it),
    the task's own score where it has one (ARC's voting), else the plain evaluation."""
    from urm_ray.eval.config import EvalConfig

    settings = EvalConfig(width=args.width, noise=args.noise, views=args.views, select=args.select,
                          segments=args.segments, loops=args.loops, halt_early=args.halt_early, seed=args.seed)
    asked = (args.width, args.noise, args.views, args.select, args.segments, args.loops, args.seed)
    test_time = asked != (1, 0.0, False, "vote", 0, 0, 0) or (args.halt_early and task.scoring is None)
    if test_time and task.scoring is not None:
        raise ConfigError("--width/--noise/--views/--select/--segments/--loops: an ARC checkpoint votes over augmented "
                          "versions (--augmentations); test-time settings are for the other tasks")
    if test_time and args.temperature is not None:
        raise ConfigError("--temperature with test-time settings: set the trajectories with --width")
    if task.scoring is not None and args.temperature is not None:
        raise ConfigError("--temperature: an ARC evaluation votes over augmentations and draws no prior samples")
    return settings, "testtime" if test_time else "score" if task.scoring is not None else "plain"


def _sample(args: argparse.Namespace) -> None:
    from urm_ray import evaluate
    from urm_ray.eval.config import EvalConfig

    request = evaluate.Request("sample", temperature=args.temperature, num=args.num)
    report = evaluate.evaluate(args.checkpoint, EvalConfig(seed=args.seed), request)
    printed = report.as_dict() if args.boards else report.as_dict("boards")
    print(json.dumps(printed, indent=None if args.boards else 2))


def _sweep(args: argparse.Namespace) -> None:
    from urm_ray.report import publish_after_sweep
    from urm_ray.tune.sweep import create_sweep, extend, load_sweep, resume_hint, run_sweep, set_caps

    if not args.verbose:
        quiet_optuna()
    if args.resume:
        if args.space or args.overrides or args.warm_start:
            raise ConfigError("--resume NAME continues a sweep as created; give no SPACE, overrides or "
                              "--warm-start (--trials N raises its total)")
        info, space = load_sweep(args.resume, args.dir, args.storage)
        if args.trials is not None:
            space = extend(info, space, args.trials)
    elif not args.space:
        raise ConfigError("give a search space (a YAML path or a shipped space's name) or --resume NAME")
    elif args.trials is not None:
        raise ConfigError("--trials N extends a sweep with --resume; a new sweep takes trials=N")
    else:
        info, space = create_sweep(args.space, args.overrides, args.name, args.dir, args.storage,
                                   args.warm_start)
    set_caps(info, args.max_hours, args.max_device_hours, args.price)
    print(f"sweep {info.name} in {info.folder} (MLflow experiment {info.experiment!r})", flush=True)
    outcome = run_sweep(info, space, resume=bool(args.resume), scale_up_s=args.scale_up,
                        verbose=args.verbose)
    publish_after_sweep(info, space)
    print(json.dumps({"sweep": outcome.name, "finished": outcome.finished,
                      "requested": outcome.requested, f"best {space.metric}": outcome.best_value,
                      "best_config": outcome.best_config_path,
                      **_ui(info.tracking_uri, info.parent_run_id, experiment=True)}, indent=2))
    if outcome.capped:
        print(f"stopped: {outcome.capped}; {resume_hint(outcome.name)} and a larger cap", file=sys.stderr)
    if outcome.interrupted:  # Tune stopped on Ctrl-C and saved the sweep
        print(f"interrupted: {resume_hint(outcome.name)}", file=sys.stderr)
        raise Interrupted()


def _runs(args: argparse.Namespace) -> None:
    from urm_ray.runs import list_runs, ui_hint
    from urm_ray.config import resolve_tracking_uri

    uri = resolve_tracking_uri(args.tracking_uri)
    print(list_runs(uri, args.experiment, args.limit))
    print(ui_hint(uri, args.experiment), file=sys.stderr)  # stdout: the table alone


def _best(args: argparse.Namespace) -> None:
    from urm_ray.tune.best import export_best, front_table

    trial, path, text = export_best(args.name, args.dir, args.out, args.pick)
    front = front_table(args.name, args.dir)
    if front:  # as YAML comments: stdout stays the config
        print(f"# Pareto front ({front.count(chr(10))} trials; --pick N exports trial N):")
        print("\n".join(f"# {line}" for line in front.splitlines()))
    print(text, end="")
    print(f"# trial {trial.number}: {trial.values} -> {path}", file=sys.stderr)


def _final(args: argparse.Namespace) -> None:
    from urm_ray.tune.best import FinalRequest, Launch, final

    request = FinalRequest(args.seeds, args.top, args.pick, tuple(args.overrides), args.model_name)
    outcome = final(args.name, args.dir, request,
                    Launch(scale_up_s=args.scale_up, verbose=args.verbose, live=sys.stderr.isatty()))
    summary = {k: v for k, v in outcome.metrics.items() if k.startswith(registry.HELD_OUT_PREFIXES) or k == "step"}
    print(json.dumps({"winner_trial": outcome.winner, "seed_scores": outcome.scores,
                      "mlflow_run_id": outcome.run_id, **_ui(_sweep_tracking_uri(args), outcome.run_id),
                      "registered_model": outcome.model_name,
                      "model_version": outcome.model_version, **summary}, indent=2))


def _report(args: argparse.Namespace) -> None:
    from urm_ray.report import rebuild

    print(rebuild(args.name, args.dir))


def _study(args: argparse.Namespace) -> None:
    from urm_ray.study.run import run_study
    from urm_ray.study.spec import load_study

    study = load_study(args.study)  # every row checked before Ray starts
    if args.check:
        from urm_ray.study.check import check_study

        report, fits = check_study(study, args.gpu)
        print(report)
        if not fits:
            raise SystemExit(1)
        return
    if not args.verbose:
        quiet_optuna()
    table = run_study(study, args.dir, verbose=args.verbose)
    print(table.to_markdown(), end="")
    print(f"study {study.name}: table in {Path(args.dir) / study.name}/table.md and table.csv", file=sys.stderr)


def _sweep_tracking_uri(args: argparse.Namespace) -> str:
    from urm_ray.tune.sweep import load_sweep

    return load_sweep(args.name, args.dir)[0].tracking_uri


def _command(sub: argparse._SubParsersAction, name: str, summary: str, **kwargs: Any) -> argparse.ArgumentParser:
    """A subcommand whose --help ends with its examples (``EXAMPLES``)."""
    return sub.add_parser(name, help=summary, description=summary[:1].upper() + summary[1:] + ".",
                          epilog=EXAMPLES[name], formatter_class=argparse.RawDescriptionHelpFormatter,
                          **kwargs)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="urm-ray", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    _command(sub, "presets", "list shipped training configs").set_defaults(func=_presets)
    _train_parsers(sub)
    _eval_parsers(sub)
    _sweep_parsers(sub)
    _study_parsers(sub)
    data = _command(sub, "data", "build a dataset").add_subparsers(dest="task", required=True)
    for task in registry.TASKS.values():
        task.add_builder(data)
    return parser


def _train_parsers(sub: argparse._SubParsersAction) -> None:
    train = _command(sub, "train", "train one run (resumes when train.run_name exists)")
    train.add_argument("config", help="YAML path or preset name (see `urm-ray presets`)")
    train.add_argument("overrides", nargs="*", help="dotted overrides, e.g. model.loops=8")
    _scale_up_option(train)
    _verbose_option(train)
    train.set_defaults(func=_train)

    pl = _command(sub, "plan", "whether a config or a search space fits a GPU's memory")
    pl.add_argument("config", help="YAML path or preset; with --space, a search space")
    pl.add_argument("--space", action="store_true", help="plan the space's heaviest trial")
    pl.add_argument("overrides", nargs="*", help="dotted overrides, e.g. train.micro_batch_size=48")
    pl.add_argument("--gpu", required=True, help="a10g, l4, a100-40, a100-80 or h100")
    pl.add_argument("--seq-len", type=int, default=0, help="tokens per row (default: the dataset's)")
    pl.add_argument("--vocab", type=int, default=0, help="token ids (default: the dataset's)")
    pl.add_argument("--puzzles", type=int, default=1, help="puzzle-embedding rows (default: the dataset's)")
    pl.set_defaults(func=_plan)


def _eval_parsers(sub: argparse._SubParsersAction) -> None:
    ev = _command(sub, "eval", "evaluate a checkpoint folder on its held-out split")
    ev.add_argument("checkpoint")
    ev.add_argument("--split", default="", help="split to evaluate (default: data.eval_split)")
    ev.add_argument("--max-rows", type=int, default=0, help="0 = all rows (ARC: test pairs)")
    ev.add_argument("--augmentations", type=int, default=0,
                    help="ARC: augmented versions voted per test pair (0 = data.num_augmentations)")
    ev.add_argument("--halt-early", action="store_true",
                    help="take each answer where the Q-head first says halt (ARC: also stop batches early)")
    ev.add_argument("--width", type=int, default=1,
                    help="trajectories per puzzle, run as one batch (differ by --noise, or GRAM's prior)")
    ev.add_argument("--noise", type=float, default=0.0,
                    help="std of Gaussian noise on the recurrent state after each loop/cycle (not GRAM)")
    ev.add_argument("--views", action="store_true",
                    help="trajectory i reads the task's augmentation i of the puzzle (0: itself), answers "
                         "mapped back: width from the task's symmetries (sudoku, maze, coloring)")
    ev.add_argument("--select", choices=list(SELECTIONS), default="vote",
                    help="a puzzle's answer among its trajectories: majority vote, highest Q-halt score, "
                         "the answer the model finds most likely, or the first the task's verifier "
                         "accepts (an oracle: reported apart)")
    ev.add_argument("--segments", type=int, default=0, help="ACT segments (depth; 0 = as trained)")
    ev.add_argument("--loops", type=int, default=0,
                    help="block-stack passes per segment, URM-like families (0 = as trained)")
    ev.add_argument("--seed", type=int, default=0, help="seed of the test-time noise and views")
    ev.add_argument("--pass-k", type=int, nargs="+", default=[],
                    help="ARC: report pass@k for these k (default: 1 2 10 100 1000)")
    ev.add_argument("--out", default="", help="write the full report as JSON")
    ev.add_argument("--no-mlflow", dest="mlflow", action="store_false",
                    help="ARC, test-time settings: do not log the evaluation to MLflow")
    ev.add_argument("--tracking-uri", default="", help="MLflow URI (default: the run's)")
    ev.add_argument("--temperature", type=float, default=None,
                    help="GRAM: draw the prior samples (eval.samples per row) at this temperature "
                         "(default: model.sample_temperature)")
    _verbose_option(ev)
    ev.set_defaults(func=_eval)

    sa = _command(sub, "sample", "generate boards from the empty input (GRAM) and verify them")
    sa.add_argument("checkpoint")
    sa.add_argument("--num", type=int, default=32, help="samples, drawn as one batch")
    sa.add_argument("--seed", type=int, default=0)
    sa.add_argument("--temperature", type=float, default=None,
                    help="GRAM: the prior's standard deviation times this (default: model.sample_temperature)")
    sa.add_argument("--boards", action="store_true", help="also print every sampled board")
    sa.set_defaults(func=_sample)


def _study_parsers(sub: argparse._SubParsersAction) -> None:
    st = _command(sub, "study", "run a study: its rows' sweeps, re-checks and finals, then its results table")
    st.add_argument("study", help="study YAML (studies/*.yaml)")
    st.add_argument("--resume", action="store_true",
                    help="go on where the study stopped (running it again does the same)")
    st.add_argument("--dir", default="studies", help="folder holding studies (default ./studies)")
    st.add_argument("--check", action="store_true",
                    help="validate only: every row's space loads and, with --gpu, its heaviest trial fits")
    st.add_argument("--gpu", default="", help="with --check: a10g, l4, a100-40, a100-80 or h100")
    _verbose_option(st)
    st.set_defaults(func=_study)

    runs = _command(sub, "runs", "list the runs and sweeps in the MLflow store", aliases=["ls"])
    runs.add_argument("--tracking-uri", default="",
                      help="MLflow URI (default: $MLFLOW_TRACKING_URI, else ./mlflow.db)")
    runs.add_argument("--experiment", default="", help="only this MLflow experiment")
    runs.add_argument("--limit", type=int, default=50, help="the newest N runs (default 50)")
    runs.set_defaults(func=_runs)


def _sweep_parsers(sub: argparse._SubParsersAction) -> None:
    sweep = _command(sub, "sweep", "run (or --resume) a hyperparameter sweep")
    sweep.add_argument("space", nargs="?",
                       help="search-space YAML or the name of a shipped space (urm_ray/search_spaces)")
    sweep.add_argument("overrides", nargs="*",
                       help="model./data./optim./train./tracking. keys change the base config; "
                            "others the space (trials=8, scheduler.grace_steps=50)")
    sweep.add_argument("--resume", metavar="NAME", help="continue an interrupted sweep")
    sweep.add_argument("--name", default="", help="sweep name (default: <space>-<time>)")
    sweep.add_argument("--storage", default="",
                       help="Optuna database URL (default: sqlite in the sweep folder); never "
                            "recorded with its password: with --resume, give it again, or keep the "
                            "password in PGPASSWORD or ~/.pgpass (docs/databases.md)")
    sweep.add_argument("--dir", default="sweeps", help="folder holding sweeps (default ./sweeps)")
    sweep.add_argument("--trials", type=int, default=None, metavar="N",
                       help="with --resume: raise the sweep's total to N trials (sampled by the same study)")
    sweep.add_argument("--warm-start", default="", metavar="SWEEP[:k]",
                       help="try the best k (default 3) completed trials of another sweep first")
    sweep.add_argument("--max-hours", type=float, default=None, metavar="H",
                       help="start no new trial after H hours of the sweep's wall time (a resume's too)")
    sweep.add_argument("--max-device-hours", type=float, default=None, metavar="D",
                       help="start no new trial once the finished trials used D device-hours")
    sweep.add_argument("--price", type=float, default=None, metavar="USD",
                       help="price of one device-hour: the sweep logs cost/usd")
    _scale_up_option(sweep)
    _verbose_option(sweep)
    sweep.set_defaults(func=_sweep)

    best = _command(sub, "best", "print and export the best config of a sweep")
    best.add_argument("name")
    best.add_argument("--out", default="", help="YAML file to write (default <sweep>/best_config.yaml)")
    best.add_argument("--dir", default="sweeps")
    best.add_argument("--pick", type=int, default=None, metavar="N",
                      help="the Pareto front's trial N (a sweep with several objectives; default its most "
                           "accurate)")
    best.set_defaults(func=_best)

    fin = _command(sub, "final", "re-run the top configs over seeds, train and register the winner")
    fin.add_argument("name")
    fin.add_argument("overrides", nargs="*", help="for the final run, e.g. resources.num_workers=2")
    fin.add_argument("--seeds", type=int, default=0, help="seeds per top config (default: the space's)")
    fin.add_argument("--top", type=int, default=0, help="configs to re-check (default: the space's)")
    fin.add_argument("--model-name", default="", help="registered model (default urm-ray-<sweep>)")
    fin.add_argument("--pick", type=int, default=None, metavar="N",
                     help="train the Pareto front's trial N (`urm-ray best NAME` lists the front)")
    fin.add_argument("--dir", default="sweeps")
    _scale_up_option(fin)
    _verbose_option(fin)
    fin.set_defaults(func=_final)

    rep = _command(sub, "report", "(re)build a sweep's HTML report (<sweep>/report.html) and upload it to MLflow")
    rep.add_argument("name")
    rep.add_argument("--dir", default="sweeps")
    rep.set_defaults(func=_report)


def _scale_up_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--scale-up", type=float, default=0.0, metavar="SECONDS",
                        help="on an autoscaling cluster: ask for the nodes this run needs and wait "
                             "up to SECONDS for them (default 0: use the cluster as it is)")


def _verbose_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--verbose", action="store_true",
                        help="also show the output of Ray (its workers, actors and warnings) and "
                             "MLflow's INFO messages; by default they go to Ray's log files only")


def _parse(argv: list[str] | None) -> argparse.Namespace:
    """Like parse_args, but key=value overrides may also follow options (`sweep S --name N k=v`)."""
    parser = _parser()
    args, extra = parser.parse_known_args(argv)
    if extra and (getattr(args, "command", "") not in ("sweep", "final")
                  or any(item.startswith("-") or "=" not in item for item in extra)):
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    if extra:
        args.overrides = [*args.overrides, *extra]
    return args


def main(argv: list[str] | None = None) -> int:
    with redacting_output():  # no password of a URL on the terminal, whoever prints it
        return _main(argv)


def _main(argv: list[str] | None) -> int:
    args = _parse(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s",
                        datefmt="%H:%M:%S")
    if not getattr(args, "verbose", False):
        quiet()
    func: Callable[[argparse.Namespace], None] = args.func
    try:
        func(args)
    except (ConfigError, DataError) as err:
        print(f"urm-ray: error: {err}", file=sys.stderr)
        return 2
    except TrainingFailed as err:
        print(f"urm-ray: training failed: {err}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        # Ctrl-C: the command has said what it left and how to resume (train: "rerun with
        # train.run_name=..."; sweep: "resume with ..."); a traceback under that would only hide it
        return 130  # 128 + SIGINT, as the shell reports a command that Ctrl-C stopped
    return 0


def quiet() -> None:
    """Keep the libraries' chatter off the terminal (without --verbose): MLflow's INFO messages,
    progress bars and pickle warning (``final``), matplotlib's "building the font cache" line (a
    sweep's plots), Tune's banner. Ray's output is kept in its log files by ``init_ray``,
    Optuna's by ``quiet_optuna``."""
    # read by MLflow when it is first imported (the commands import it lazily), and by the Ray
    # workers this process starts
    os.environ.setdefault("MLFLOW_LOGGING_LEVEL", "WARNING")
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")  # `final`'s registration
    # its warning against pickle: the model is pickled on purpose (tracking.register_torch_model)
    logging.getLogger("mlflow.pytorch").setLevel(logging.ERROR)
    logging.getLogger("matplotlib").setLevel(logging.ERROR)
    # Tune's new console output prints its experiment banner and TensorBoard hint even at
    # verbose=0 (`urm-ray final`'s re-check grid); its legacy reporter, at verbose=0, prints nothing
    os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")


def quiet_optuna() -> None:
    """Optuna's lines off the terminal: "A new study created in RDB ...", and the report's plots
    warning "There are no complete trials" for a sweep stopped before its first. Optuna sets its
    logger's level when first imported, so this comes after."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.ERROR)


def run() -> int:
    """The ``urm-ray`` command: ``main``, then a quick exit. The objects left at exit (torch, Ray,
    MLflow and their modules) are frozen out of the garbage collector: the interpreter's last
    collection would otherwise scan them all, 2-3 s on every command here, to free memory that
    the process returns to the OS anyway."""
    code = main()
    gc.freeze()
    return code


if __name__ == "__main__":
    sys.exit(run())
