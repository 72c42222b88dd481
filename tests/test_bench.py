"""bench/throughput.py on a tiny URM: the JSON it writes and the FLOPs it counts.

No timing thresholds: only that the rates are positive and that the counted FLOPs follow the loop
structure (one more loop adds a pass; each truncated loop drops exactly one backward pass).
"""

import importlib.util
import json
from pathlib import Path

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

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
            "--vocab", "6", "--seq-len", "16", "--steps", "1", "--warmup", "0", "--threads", "1"]
    return throughput.main(args)["flops_per_step"]


def test_json_from_dataset_metadata(tmp_path: Path):
    data = tmp_path / "s4"
    sudoku.build_generated(data, size=4, num_train=20, num_test=5, blanks=8, seed=0)
    out = tmp_path / "bench.json"
    throughput.main(["sudoku4-urm", *TINY, f"data.path={data}", "train.num_workers=2",
                   "--steps", "2", "--warmup", "1", "--threads", "1", "--json", str(out)])
    result = json.loads(out.read_text())
    assert (result["vocab_size"], result["seq_len"], result["tokens_per_row"]) == (6, 16, 16)
    assert result["batch_per_worker"] == 4  # global 8 over 2 workers
    for key in ("samples_per_s", "tokens_per_s", "achieved_gflops", "mfu", "peak_gflops",
                "step_s_mean", "step_s_p50", "cpu_share", "peak_rss_mib"):
        assert result[key] > 0, key
    assert result["flops_per_step"] > 0 and result["parameters"] > 0
    assert result["tokens_per_s"] == pytest.approx(16 * result["samples_per_s"])
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


def test_depthwise_conv_backward_counts_like_two_forwards():
    conv = torch.nn.Conv1d(64, 64, kernel_size=2, groups=64, padding=1)
    x = torch.randn(4, 64, 16, requires_grad=True)
    with FlopCounterMode(display=False, custom_mapping=throughput.FLOP_FIXES) as counter:
        conv(x).sum().backward()
    counts = {str(op): n for op, n in counter.get_flop_counts()["Global"].items()}
    assert counts["aten.convolution_backward"] == 2 * counts["aten.convolution"]
