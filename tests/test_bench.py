"""bench/throughput.py on a tiny URM: the JSON it writes and the FLOPs it counts.

No timing thresholds: only that the rates are positive and that the counted FLOPs follow the loop
structure (one more loop adds a pass; each truncated loop drops exactly one backward pass).
"""

import importlib.util
import json
from pathlib import Path

import pytest

from urm_ray.data.tasks import sudoku

# bench/ holds scripts, not a package
_SPEC = importlib.util.spec_from_file_location(
    "throughput", Path(__file__).resolve().parents[1] / "bench" / "throughput.py")
throughput = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(throughput)
_PARITY = importlib.util.spec_from_file_location(
    "gpu_parity", Path(__file__).resolve().parents[1] / "bench" / "gpu_parity.py")
parity = importlib.util.module_from_spec(_PARITY)
_PARITY.loader.exec_module(parity)
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
    throughput.main(["sudoku4-urm", *TINY, f"data.path={data}", "train.num_workers=2",
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


def test_gpu_parity_harness_on_cpu_bf16():
    """bench/gpu_parity.py's comparison, run on the CPU: fp32 equals itself, bf16 autocast is close."""
    fp32 = parity.main(["--device", "cpu", "--no-bf16", "--eager", "--families", "urm", "gram"])
    assert [row["loss_rel_err"] for row in fp32] == [0.0, 0.0] and all(row["ok"] for row in fp32)
    bf16 = parity.main(["--device", "cpu", "--eager", "--families", "urm"])[0]
    assert 0 < bf16["loss_rel_err"] < 1e-2 and 0 < bf16["logits_rel_err"] < 3e-2
    assert bf16["argmax_agree"] > 0.9


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
