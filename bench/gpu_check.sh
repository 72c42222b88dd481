#!/usr/bin/env bash
# The GPU check: one run of at most 10 minutes (the sum of its steps' timeouts, printed first) on
# one GPU machine that has PyTorch and nothing of this project installed, from the repository root.
#
#   bash bench/gpu_check.sh OUT_DIR              # on the GPU; OUT_DIR defaults to ./gpu_check
#   bash bench/gpu_check.sh --dry-run OUT_DIR    # every step at tiny size on the CPU (tests/test_bench.py)
#
# Every step is its own Python process under its own timeout that appends one JSON line per
# measurement to OUT_DIR/results.jsonl as it measures ({"check", "status", figures...}); its output
# goes to OUT_DIR/log.txt. A step cut by its timeout, out of memory or failing keeps the rows it
# wrote, the script adds a "step" row with its exit code, and the next step runs. The summary
# table comes last (also in OUT_DIR/summary.md). The steps (docs/benchmarks.md, "GPU check"):
#   parity_fp32   every family's step, CUDA fp32 against CPU fp32: loss, gradients, weights after
#   bf16_error    eager bf16 against eager fp32, and compiled bf16 against eager bf16
#   flash         whether flash attention runs in the model's attention at bf16
#   sync_debug    host synchronisations in each family's step (0 expected)
#   ddp           DDP + compile over NCCL at world size 1: the losses of the plain step
#   gram_sampling GRAM's N = 20 trajectories against N = 1
#   throughput    the paper's URM at the Sudoku and ARC shapes, one process per mode: samples/s,
#                 peak memory, MFU against the spec sheet and a measured matmul (matmul rows);
#                 and eager bf16 at ARC's shape with model.bf16_states (its peak memory)
#   vs_official   our step against the official URM step, bf16 compiled both (perf-vs-official)
# --dry-run: CPU, tiny sizes, two families, gloo, torch.compile's eager backend, two steps at a
# time; each step's timeout is then 300 s, a guard against a hang.
set -uo pipefail
cd "$(dirname "$0")/.."
dry=()
if [ "${1:-}" = --dry-run ]; then dry=(--dry-run); shift; fi
out=${1:-gpu_check}
mkdir -p "$out"
results="$out/results.jsonl" log="$out/log.txt"
: > "$results"
: > "$log"
py=${PYTHON:-python3}
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
families="urm hrm trm gram gram_urm transformer"
[ ${#dry[@]} -gt 0 ] && families="urm gram_urm"

# name, timeout in seconds, script in bench/ and its arguments
steps=(
  "env 15 gpu_report.py env"
  "parity_fp32 45 gpu_parity.py fp32 --families $families"
  "bf16_error 75 gpu_parity.py bf16 --families $families --compiled urm gram_urm"
  "flash 30 gpu_kernels.py flash"
  "sync_debug 25 gpu_kernels.py sync --families $families"
  "ddp 40 gpu_ddp.py"
  "gram_sampling 25 gpu_sampling.py"
  "throughput_eager_fp32 40 gpu_throughput.py --mode eager --precision fp32"
  "throughput_eager_bf16 35 gpu_throughput.py --mode eager --precision bf16"
  "throughput_compiled_bf16 95 gpu_throughput.py --mode compiled --precision bf16"
  "throughput_compiled_fp32 95 gpu_throughput.py --mode compiled --precision fp32"
  "throughput_bf16_states 20 gpu_throughput.py --mode eager --precision bf16 --bf16-states --shapes arc"
  "vs_official 55 gpu_official.py"
  "summary 5 gpu_report.py summary"
)
budget=0
for step in "${steps[@]}"; do read -r _ limit _ <<< "$step"; budget=$((budget + limit)); done
if [ ${#dry[@]} -gt 0 ]; then
  echo "dry run on the CPU: ${#steps[@]} steps, 300 s timeout each; on a GPU the budget is $budget s"
else
  echo "budget: $budget s, the sum of ${#steps[@]} steps' timeouts"
fi

# run_step NAME TIMEOUT SCRIPT ARGS: its output into the log (whole, after it ends), then its step row
run_step() {
  local name=$1 limit=$2 script=$3 args=$4 start=$SECONDS rc status
  echo "== $name (at most $limit s)"
  # shellcheck disable=SC2086  # args holds several words
  timeout -k 5 "$limit" "$py" "bench/$script" $args --out "$results" ${dry[@]+"${dry[@]}"} > "$out/.$name.log" 2>&1
  rc=$?
  { echo "== $name"; cat "$out/.$name.log"; } >> "$log" && rm "$out/.$name.log"
  case $rc in 0) status=ok ;; 124 | 137) status=timeout ;; *) status=error ;; esac
  printf '{"check": "step", "status": "%s", "step": "%s", "rc": %d, "seconds": %d, "timeout_s": %d}\n' \
    "$status" "$name" "$rc" $((SECONDS - start)) "$limit" | tee -a "$results"
}

for step in "${steps[@]}"; do
  read -r name limit script args <<< "$step"
  [ "$name" = summary ] && break
  if [ ${#dry[@]} -eq 0 ]; then
    run_step "$name" "$limit" "$script" "$args"
  else  # two at a time: on a CPU each step is mostly PyTorch's import
    run_step "$name" 300 "$script" "$args" &
    while [ "$(jobs -rp | wc -l)" -ge 2 ]; do wait -n; done
  fi
done
wait
timeout "$limit" "$py" bench/gpu_report.py summary --out "$results" | tee "$out/summary.md"
