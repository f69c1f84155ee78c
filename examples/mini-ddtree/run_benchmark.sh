#!/usr/bin/env bash
# Run the benchmark grid through torchrun, one .pt per (dataset, model pair, temperature, mode) under $RUN_DIR.
# Extra arguments are passed to every benchmark.py run, e.g. `bash run_benchmark.sh --max-new-tokens 8`.
# Exits non-zero when any run failed (the other runs still go ahead).

set -u
set -o pipefail

cd "$(dirname "$0")"

export HF_HUB_OFFLINE=1
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"

NPROC_PER_NODE="${NPROC_PER_NODE:-1}"
MASTER_PORT="${MASTER_PORT:-29600}"
LOG_DIR="${LOG_DIR:-logs}"
RUN_DIR="${RUN_DIR:-runs}"
MODEL_DIR="${MODEL_DIR:-models}"
PYTHON="${PYTHON:-python3}"
read -r -a TORCHRUN <<< "${TORCHRUN:-torchrun}"   # e.g. TORCHRUN="python3 -m torch.distributed.run"
read -r -a MODES <<< "${MODES:-sdpa}"            # add flash_attn on hosts that have the flash_attn package
read -r -a TASKS <<< "${TASKS:-mini:8}"           # dataset:max_samples, datasets are data/<name>.jsonl
read -r -a TEMPERATURES <<< "${TEMPERATURES:-0.0}"

MODEL_DRAFT_PAIRS=(
  "${MODEL_DIR}/qwen3.5-hybrid|${MODEL_DIR}/qwen3.5-hybrid-draft"
  "${MODEL_DIR}/qwen3-attn|${MODEL_DIR}/qwen3-attn-draft"
)

COMMON_BENCHMARK_ARGS=(
  --max-new-tokens "${MAX_NEW_TOKENS:-64}"
  --tree-budget "${TREE_BUDGET:-4,8}"
)

mkdir -p "$LOG_DIR" "$RUN_DIR"

# make_models.py returns at once when MODEL_DIR already holds a build of the same recipe.
"$PYTHON" make_models.py --out "$MODEL_DIR" ${TARGET_STEPS:+--target-steps "$TARGET_STEPS"} \
  ${DISTILL_STEPS:+--distill-steps "$DISTILL_STEPS"} || exit 1

slugify() {
  local value="$1"
  value="${value//\//_}"
  value="${value//:/_}"
  value="${value// /_}"
  echo "$value"
}

failures=0

run_benchmark() {
  local dataset_name="$1"
  local max_samples="$2"
  local model_name="$3"
  local draft_name="$4"
  local mode_name="$5"
  local save_path="$6"
  local log_path="$7"
  shift 7

  echo "========================================================"
  echo "Running Benchmark: dataset=${dataset_name} max_samples=${max_samples} model=${model_name} draft=${draft_name} mode=${mode_name}"
  echo "========================================================"

  if [[ -f "${save_path}" ]]; then
    echo "Skipping existing run: ${save_path}"
    return
  fi

  if ! "${TORCHRUN[@]}" \
    --nproc_per_node="${NPROC_PER_NODE}" \
    --master_port="${MASTER_PORT}" \
    benchmark.py \
    --dataset "${dataset_name}" \
    --max-samples "${max_samples}" \
    --model-name-or-path "${model_name}" \
    --draft-name-or-path "${draft_name}" \
    --save-path "${save_path}" \
    "${COMMON_BENCHMARK_ARGS[@]}" \
    "$@" \
    2>&1 | tee "${log_path}"; then
    echo "FAILED: ${save_path} (log: ${log_path})"
    failures=$((failures + 1))
  fi
}

for task in "${TASKS[@]}"; do
  IFS=':' read -r dataset_name max_samples <<< "${task}"

  for pair in "${MODEL_DRAFT_PAIRS[@]}"; do
    IFS='|' read -r model_name draft_name <<< "${pair}"

    model_slug="$(slugify "${model_name}")"
    draft_slug="$(slugify "${draft_name}")"
    for temperature in "${TEMPERATURES[@]}"; do
      temperature_slug="$(slugify "${temperature}")"
      run_name="${dataset_name}__${model_slug}__${draft_slug}__temp${temperature_slug}"

      for mode_name in "${MODES[@]}"; do
        mode_args=(--temperature "${temperature}")
        [[ "${mode_name}" == "flash_attn" ]] && mode_args+=(--flash-attn)
        run_benchmark \
          "${dataset_name}" \
          "${max_samples}" \
          "${model_name}" \
          "${draft_name}" \
          "${mode_name}" \
          "${RUN_DIR}/${run_name}__${mode_name}.pt" \
          "${LOG_DIR}/${run_name}__${mode_name}.log" \
          "${mode_args[@]}" \
          "$@"
      done
    done
  done
done

if (( failures > 0 )); then
  echo "${failures} benchmark run(s) failed"
  exit 1
fi
