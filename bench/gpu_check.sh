#!/usr/bin/env bash
# The GPU check, one script, under 8 minutes on one GPU; prints a short table last.
#
#   bash bench/gpu_check.sh [OUT_DIR]        # OUT_DIR defaults to ./gpu_check
#
# 1. parity: every family's forward and loss, CUDA bf16 compiled, against CPU fp32 (loss 1e-2,
#    logits 3e-2 relative: bf16 keeps 8 significant bits)
# 2. throughput, MFU and peak GPU memory, eager and compiled, for the paper's URM (hidden 512,
#    4 layers, 8 heads, loops 8, truncation 2) on the ARC shape (900 tokens + puzzle prefix), at the
#    largest batch of 256 / 128 / 64 / 32 / 16 that fits (probed eager, one step each)
# 3. `urm-ray train sudoku4-urm` on the GPU for at most 2 minutes; it must learn
set -uo pipefail
cd "$(dirname "$0")/.."
out=${1:-gpu_check}
mkdir -p "$out"
py=${PYTHON:-python}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$out/gpu.txt"
"$py" -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)" | tee -a "$out/gpu.txt"

echo "== 1. parity (bf16 compiled vs CPU fp32)"
timeout 150 "$py" bench/gpu_parity.py --device cuda --json "$out/parity.json" || echo "parity: FAILED (rc $?)"

echo "== 2. throughput at the paper's URM size, ARC shape"
arc=(sudoku4-urm model.hidden_size=512 model.num_heads=8 model.num_layers=4 model.expansion=4
     model.loops=8 model.truncation=2 model.puzzle_emb_dim=512 --vocab 12 --seq-len 900 --device cuda)
batch=0
for b in 256 128 64 32 16; do
  if timeout 60 "$py" bench/throughput.py "${arc[@]}" train.global_batch_size=$b --modes eager \
      --rounds 1 --steps 1 --warmup 1 > "$out/probe_$b.txt" 2>&1; then batch=$b; break; fi
done
echo "largest batch that fits: $batch"
if [ "$batch" -gt 0 ]; then
  timeout 240 "$py" bench/throughput.py "${arc[@]}" train.global_batch_size=$batch --rounds 3 --steps 5 \
    --warmup 3 --json "$out/throughput.json" | tee "$out/throughput.txt" || echo "throughput: FAILED"
fi

echo "== 3. sudoku4-urm on the GPU, 2 minutes at most"
start=$(date +%s)
timeout 150 urm-ray train sudoku4-urm train.device=cuda train.storage_path="$out/runs" \
  tracking.tracking_uri="sqlite:///$PWD/$out/mlflow.db" > "$out/train.json" 2> "$out/train.log" \
  || echo "train: FAILED or cut at 150 s (rc $?)"
echo "train wall: $(( $(date +%s) - start )) s"

echo "== summary"
"$py" - "$out" <<'PY'
import json, sys
from pathlib import Path
out = Path(sys.argv[1])
def load(name):
    path = out / name
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None
print(f"GPU: {(out / 'gpu.txt').read_text().splitlines()[0]}")
print("| check | result |\n|---|---|")
for row in load("parity.json") or []:
    print(f"| parity {row['family']} | logits {row['logits_rel_err']:.1e}, loss {row['loss_rel_err']:.1e},"
          f" argmax agree {row['argmax_agree']:.1%} {'ok' if row['ok'] else 'FAIL'} |")
tp = load("throughput.json")
if tp:
    for mode in ("eager", "compiled"):
        print(f"| URM 512x4, ARC shape, batch {tp['batch_per_worker']}, {mode} | {tp[mode + '_samples_per_s']:.1f}"
              f" samples/s, MFU {tp.get(mode + '_mfu', 0):.1%}, peak {tp[mode + '_peak_mem_mib'] / 1024:.1f} GiB,"
              f" warm-up {tp[mode + '_warmup_s']:.0f} s |")
    print(f"| compiled / eager | {tp['compiled_over_eager']:.2f} |")
train = load("train.json")
if train:
    acc = train.get("eval/exact_accuracy")
    print(f"| sudoku4-urm on GPU | held-out exact {acc:.1%} at step {train.get('step')}"
          f" {'(learned)' if acc and acc > 0.5 else '(did NOT learn)'} |")
else:
    print("| sudoku4-urm on GPU | no result |")
PY
