"""The first and last steps of bench/gpu_check.sh: the machine's facts, and the table of results.

    python bench/gpu_report.py env --out results.jsonl       # PyTorch, CUDA, the GPU, what is installed
    python bench/gpu_report.py summary --out results.jsonl   # one table line per row written

``summary`` reads only the JSONL file (no PyTorch), so it prints whatever the steps wrote, also
after a step was cut by its timeout (the shell's ``step`` rows say which).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import platform
import shutil
import subprocess
from pathlib import Path
from typing import Any

# the fields that name a row, and the figures shown for it
ITEM = ("step", "family", "compare", "model", "shape", "mode", "precision", "side", "phase", "num", "device")
FIGURES = {
    "step": ("rc", "seconds", "timeout_s"),
    "env": ("gpu", "torch", "cuda", "memory_gib", "missing"),
    "parity_fp32": ("loss_rel_err", "grad_rel_err", "update_mismatch", "weights_rel_err"),
    "bf16_error": ("loss_rel_err", "grad_rel_err", "update_mismatch"),
    "flash": ("flash_calls", "default_ops"),
    "matmul": ("measured_tflops", "spec_tflops"),
    "throughput": ("rows", "samples_per_s", "step_ms", "peak_mem_gib", "mfu_spec", "mfu_matmul",
                   "first_step_s", "out_of_memory_at"),
    "vs_official": ("first_step_s", "samples_per_s", "ratio", "reason"),
    "gram_sampling": ("ms", "over_n1"),
    "ddp": ("loss_rel_err", "weights_rel_err"),
    "sync_debug": ("warnings", "where", "reason"),
}


def env() -> dict[str, Any]:
    import torch  # here: the summary runs without it

    facts: dict[str, Any] = {"python": platform.python_version(), "torch": torch.__version__,
                             "cuda": torch.version.cuda, "cuda_available": torch.cuda.is_available(),
                             "missing": [m for m in ("yaml", "tqdm", "pydantic", "ray", "mlflow", "optuna")
                                         if importlib.util.find_spec(m) is None]}
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        facts.update(gpu=props.name, capability=f"{props.major}.{props.minor}", sms=props.multi_processor_count,
                     memory_gib=round(props.total_memory / 2**30, 1), nccl=torch.cuda.nccl.version(),
                     cudnn=torch.backends.cudnn.version(), tf32_matmul=torch.backends.cuda.matmul.allow_tf32,
                     flash_available=torch.backends.cuda.is_flash_attention_available())
    if shutil.which("nvidia-smi"):
        smi = ["nvidia-smi", "--query-gpu=name,driver_version,clocks.sm,temperature.gpu", "--format=csv,noheader"]
        facts["nvidia_smi"] = subprocess.run(smi, capture_output=True, text=True, timeout=10).stdout.strip()
    return facts


def show(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.3g}"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {show(v)}" for k, v in value.items()) + "}"
    return str(value)


def line(row: dict[str, Any]) -> str:
    item = " ".join(str(row[k]) for k in ITEM if k in row)
    shown = [k for k in FIGURES.get(row["check"], ()) if row.get(k) not in (None, [])]
    figures = ", ".join(f"{k} {show(row[k])}" for k in shown)
    if "error" in row:
        figures = f"{figures}; {row['error'][:160]}" if figures else row["error"][:160]
    return f"| {row['check']} | {item} | {row['status']} | {figures} |"


def summary(path: Path) -> None:
    rows = [json.loads(text) for text in path.read_text().splitlines() if text.strip()]
    print("| check | item | status | figures |\n|---|---|---|---|")
    for row in rows:
        print(line(row))
    bad = sorted({row["check"] for row in rows if row["status"] not in ("ok", "skipped")})
    not_ok = sum(row["status"] not in ("ok", "skipped") for row in rows)
    print(f"\n{len(rows)} rows, {not_ok} not ok" + (f": {', '.join(bad)}" if bad else ""))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("what", choices=["env", "summary"])
    p.add_argument("--out", type=Path, required=True, help="the results JSONL file")
    p.add_argument("--dry-run", action="store_true", help="accepted, as every step takes it")
    args = p.parse_args()
    if args.what == "summary":
        summary(args.out)
        return
    row = {"check": "env", "status": "ok", **env()}
    with args.out.open("a") as f:
        f.write(json.dumps(row) + "\n")
    print(json.dumps(row))


if __name__ == "__main__":
    main()
