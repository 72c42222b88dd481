"""Every model family trained end to end on the same small task: held-out accuracy and wall time.

    python bench/zoo.py                              # sudoku4-{urm,trm,hrm,gram,transformer}
    python bench/zoo.py sudoku4-urm sudoku4-trm --set train.steps=1000 --json zoo.json

Each preset runs as a user runs it, `urm-ray train PRESET` in a fresh process (Ray start-up,
Ray Train worker, Ray Data stream, evaluation of the EMA weights on the held-out split, MLflow
logging, teardown), so the wall time is what a user waits. Runs go to a temporary folder and
MLflow store unless --out is given.
"""

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from urm_ray.config import load_config
from urm_ray.data import builtin, stream
from urm_ray.data.config import DataConfig
from urm_ray.models.registry import TaskSpec, build_model

FAMILIES = ["sudoku4-urm", "sudoku4-trm", "sudoku4-hrm", "sudoku4-gram", "sudoku4-transformer"]


def parameters(preset: str, overrides: list[str]) -> int:
    """Trainable parameters of the preset's model on its dataset's vocabulary."""
    cfg = load_config(preset, overrides)
    meta = stream.load_meta(DataConfig(path=builtin.resolve_path(cfg.data.path)))
    task = TaskSpec(vocab_size=meta.vocab_size, seq_len=meta.seq_len,
                    num_puzzle_identifiers=meta.num_puzzle_identifiers)
    return sum(p.numel() for p in build_model(cfg.model, task).parameters())


def train(preset: str, overrides: list[str], out: Path) -> dict[str, Any]:
    """One `urm-ray train` in a fresh process; returns its printed summary plus the wall time."""
    command = [sys.executable, "-m", "urm_ray.cli", "train", preset, *overrides,
               f"train.run_name=zoo-{preset}", f"checkpoint.storage_path={out / 'runs'}",
               f"tracking.tracking_uri=sqlite:///{out / 'mlflow.db'}", "tracking.experiment=zoo"]
    start = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True)
    wall = time.perf_counter() - start
    if done.returncode != 0:
        raise RuntimeError(f"{preset} failed (exit {done.returncode}):\n{done.stderr[-3000:]}")
    summary = json.loads(done.stdout[done.stdout.index("{"):])
    return {"preset": preset, "wall_s": round(wall, 1), **summary}


def table(rows: list[dict[str, Any]]) -> str:
    lines = ["| preset | params | steps | held-out exact | held-out token | wall time |",
             "|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| `{r['preset']}` | {r['params']:,} | {r['step']} | "
                     f"{100 * r['eval/exact_accuracy']:.1f} % | {100 * r['eval/token_accuracy']:.1f} % | "
                     f"{r['wall_s'] / 60:.1f} min |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("presets", nargs="*", default=FAMILIES, help="presets or YAML paths")
    parser.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE",
                        help="overrides applied to every preset")
    parser.add_argument("--out", help="keep runs and the MLflow store here (default: a temp dir)")
    parser.add_argument("--json", help="also write the results to this file")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as scratch:
        out = Path(args.out or scratch).resolve()
        rows = []
        for preset in args.presets:
            row = {**train(preset, args.set, out), "params": parameters(preset, args.set)}
            print(json.dumps(row), flush=True)
            rows.append(row)
    print(table(rows))
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))
    return rows


if __name__ == "__main__":
    main()
