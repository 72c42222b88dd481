"""The benchmark scripts in their small modes: bench/throughput.py on a tiny URM (the JSON it writes
and the FLOPs it counts), GRAM's width bench, vs_official's ratios, and bench/gpu_check.sh's dry run.

No timing thresholds: only that the rates are positive and that the counted FLOPs follow the loop
structure (one more loop adds a pass; each truncated loop drops exactly one backward pass).
"""

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from urm_ray.data.tasks import sudoku

# bench/ holds scripts, not a package
_SPEC = importlib.util.spec_from_file_location(
    "throughput", Path(__file__).resolve().parents[1] / "bench" / "throughput.py")
throughput = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(throughput)
TINY = ["model.hidden_size=32", "model.num_heads=2", "model.num_layers=1", "model.expansion=1.0",
        "train.global_batch_size=8"]


def _flops(loops: int, truncation: int) -> int:
    args = ["sudoku4-urm", *TINY, f"model.loops={loops}", f"model.truncation={truncation}",
            "--vocab", "6", "--seq-len", "16", "--steps", "1", "--rounds", "1", "--warmup", "1",
            "--threads", "1", "--modes", "eager"]
    return throughput.main(args)["flops_per_step"]


def test_json_from_dataset_metadata(tmp_path: Path):
    data = tmp_path / "s4"
    sudoku.build_generated(data, size=4, num_train=20, num_test=5, blanks=8, seed=0)
    out = tmp_path / "bench.json"
    throughput.main(["sudoku4-urm", *TINY, f"data.path={data}", "resources.num_workers=2",
                   "--steps", "2", "--rounds", "2", "--warmup", "1", "--threads", "1", "--json", str(out)])
    result = json.loads(out.read_text())
    assert (result["vocab_size"], result["seq_len"], result["tokens_per_row"]) == (6, 16, 16)
    assert result["batch_per_worker"] == 4  # global 8 over 2 workers
    for mode in ("eager", "compiled"):  # both sides, side by side
        for key in ("samples_per_s", "tokens_per_s", "mfu", "warmup_s"):
            assert result[f"{mode}_{key}"] > 0, f"{mode}_{key}"
        assert result[f"{mode}_tokens_per_s"] == pytest.approx(16 * result[f"{mode}_samples_per_s"])
    for key in ("peak_gflops", "cpu_share", "peak_rss_mib", "compiled_over_eager"):
        assert result[key] > 0, key
    assert result["flops_per_step"] > 0 and result["parameters"] > 0
    # attention scores are the only thing the analytic count leaves out
    assert result["analytic_flops_per_step"] == pytest.approx(result["flops_per_step"], rel=0.1)


def test_flops_follow_loops_and_truncation(monkeypatch):
    monkeypatch.setattr(throughput, "matmul_peak", lambda device, bf16: 1.0)  # not under test
    full = {loops: _flops(loops, 0) for loops in (2, 3, 4)}
    assert full[2] < full[3] < full[4]
    assert full[4] - full[3] == full[3] - full[2]  # every loop adds the same forward + backward
    truncated = {n: _flops(4, n) for n in (1, 2)}
    assert full[4] > truncated[1] > truncated[2]  # TBPTL: forward-only loops save the backward
    backward = full[4] - truncated[1]
    assert truncated[1] - truncated[2] == backward
    forward_and_backward = full[4] - full[3]
    assert 0.5 < backward / forward_and_backward < 0.8  # backward ~ 2x forward


def test_presets_are_the_reference_configs():
    args = throughput.parse(["--preset", "a", "train.seed=3"])
    assert args.config == "sudoku4-urm" and (args.vocab, args.seq_len) == (11, 81)
    assert "model.hidden_size=128" in args.overrides and args.overrides[-1] == "train.seed=3"
    with pytest.raises(SystemExit):
        throughput.parse(["--steps", "1"])  # neither a config nor a preset


def test_two_precisions_side_by_side(monkeypatch):
    """--precisions fp32 bf16: a side per precision, each MFU against its own dtype's peak."""
    monkeypatch.setattr(throughput, "matmul_peak", lambda device, bf16: 400.0 if bf16 else 100.0)
    result = throughput.main(["sudoku4-urm", *TINY, "--vocab", "6", "--seq-len", "16", "--steps", "1",
                              "--rounds", "2", "--warmup", "1", "--threads", "1", "--modes", "eager",
                              "--precisions", "fp32", "bf16"])
    assert result["dtype"] == "fp32 bf16"
    assert (result["peak_gflops_fp32"], result["peak_gflops_bf16"]) == (100.0, 400.0)
    for precision, peak in (("fp32", 100.0), ("bf16", 400.0)):
        rate = result[f"eager_{precision}_samples_per_s"]
        assert rate > 0
        assert result[f"eager_{precision}_mfu"] == pytest.approx(result["flops_per_step"] * rate / 8 / 1e9 / peak)
    assert result["bf16_over_fp32_eager"] > 0 and "eager_samples_per_s" not in result
    with pytest.raises(SystemExit):
        throughput.parse(["--preset", "b", "--precisions", "bf16", "bf16"])


_WIDTH = importlib.util.spec_from_file_location(
    "gram_sampling", Path(__file__).resolve().parents[1] / "bench" / "gram_sampling.py")
width = importlib.util.module_from_spec(_WIDTH)
_WIDTH.loader.exec_module(width)


def test_width_bench_replays_every_trajectorys_products(tmp_path: Path):
    """bench/gram_sampling.py: N trajectories run N times the products of one, and their replay
    (the floor of the latency) is timed beside the calls."""
    data = tmp_path / "s4"
    sudoku.build_generated(data, size=4, num_train=20, num_test=5, blanks=8, seed=0)
    tiny = ["model.hidden_size=32", "model.num_heads=2", "model.num_layers=1", "model.expansion=1.0",
            "model.latent_dim=4", f"data.path={data}"]
    out = tmp_path / "width.json"
    result = width.main(["sudoku4-gram", *tiny, "--num", "1", "3", "--rounds", "2", "--calls", "1",
                         "--threads", "1", "--json", str(out)])
    assert json.loads(out.read_text()) == result
    one, three = result["results"]
    # per token: 4 segments x 2 cycles x (2 + 1) stack passes of one layer (qkv 32x96, out 32x32,
    # gate-up 32x512, down 256x32, and on CPU attention's two products over 16 keys of width 32),
    # and 8 prior heads (32x512, 256x8); the rest is the small heads
    core = 4 * 2 * 3 * (32 * 96 + 32 * 32 + 32 * 512 + 256 * 32 + 2 * 16 * 32) + 8 * (32 * 512 + 256 * 8)
    assert one["flop"] == pytest.approx(2 * 16 * core, rel=0.01)
    assert three["flop"] == 3 * one["flop"]
    assert one["over_n1"] == 1.0
    for row in (one, three):
        assert row["ms"] > 0 and row["matmul_ms"] > 0 and row["floor_over_n1"] > 0


def test_vs_official_ratios_are_per_round_medians_after_the_skipped_rounds():
    spec = importlib.util.spec_from_file_location(
        "vs_official", Path(__file__).resolve().parents[1] / "bench" / "vs_official.py")
    vs = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(vs)
    seconds = {"ours": [9.0, 1.0, 2.0, 1.0], "official32": [9.0, 1.5, 2.0, 3.0]}
    summary = vs.summarize(seconds, rows=8, skip=1)
    assert summary["samples_per_s"] == pytest.approx({"ours": 8.0, "official32": 4.0})
    assert summary["ratios"]["ours/official32"] == pytest.approx({"median": 1.5, "min": 1.0, "max": 3.0})
    assert list(summary["ratios"]) == ["ours/official32"]  # only pairs with both sides


# what a bare GPU machine lacks: bench/gpu_check.sh must run without them
ABSENT_ON_GPU = ("yaml", "tqdm", "pydantic", "ray", "mlflow", "optuna")
GPU_STEPS = {"env", "parity_fp32", "bf16_error", "flash", "sync_debug", "ddp", "gram_sampling",
             "throughput_eager_fp32", "throughput_eager_bf16", "throughput_compiled_bf16",
             "throughput_compiled_fp32", "throughput_bf16_states", "vs_official"}


@pytest.mark.slow
def test_gpu_check_dry_run_writes_every_steps_rows(tmp_path: Path):
    """bench/gpu_check.sh --dry-run: every step runs at tiny size on the CPU, each in its own
    process, without the packages a bare GPU machine lacks (made unimportable here), and writes
    its rows; the summary table lists them."""
    bare = tmp_path / "bare"
    bare.mkdir()  # a None in sys.modules makes `import name` fail and find_spec answer None
    (bare / "sitecustomize.py").write_text(f"import sys\nsys.modules.update(dict.fromkeys({ABSENT_ON_GPU!r}))\n")
    out = tmp_path / "out"
    script = Path(__file__).resolve().parents[1] / "bench" / "gpu_check.sh"
    env = {**os.environ, "PYTHON": sys.executable, "PYTHONPATH": str(bare)}
    done = subprocess.run(["bash", str(script), "--dry-run", str(out)], env=env, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    rows = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    steps = {row["step"]: row["status"] for row in rows if row["check"] == "step"}
    assert steps == dict.fromkeys(GPU_STEPS, "ok"), (out / "log.txt").read_text()[-3000:]
    checks: dict[str, list[dict]] = {}
    for row in rows:
        checks.setdefault(row["check"], []).append(row)
    assert set(checks["env"][0]["missing"]) >= set(ABSENT_ON_GPU)
    for check, items in (("parity_fp32", 2), ("bf16_error", 6), ("ddp", 2), ("gram_sampling", 2),
                         ("matmul", 5), ("throughput", 9), ("flash", 1)):
        assert [row["status"] for row in checks[check]] == ["ok"] * items, checks[check]
    assert all(row["loss_rel_err"] == 0 for row in checks["parity_fp32"] + checks["ddp"])
    assert {row["compare"] for row in checks["bf16_error"]} == {
        "eager bf16 vs eager fp32", "eager bf16 states vs eager fp32", "compiled bf16 vs eager bf16"}
    assert checks["flash"][0]["flash_calls"] > 0
    assert [row["status"] for row in checks["sync_debug"]] == ["skipped"] * 2  # no device to wait for
    modes = {(r["shape"], r["mode"], r["precision"]) for r in checks["throughput"] if r["samples_per_s"] > 0}
    assert len(modes) == 9 and ("arc", "eager", "bf16 states") in modes
    assert [row["reason"] for row in checks["vs_official"]] in (
        ["harness not present"], ["the official code needs pydantic, which is not installed"])
    summary = (out / "summary.md").read_text()
    assert "| parity_fp32 | urm cpu | ok |" in summary and f"{len(rows)} rows, 0 not ok" in summary
