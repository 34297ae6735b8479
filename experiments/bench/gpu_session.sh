#!/usr/bin/env bash
# The GPU measurements docs/gpu.md reports, sized for a short loan of one GPU: two
# parts, each well inside a 10-minute call on an H200 (part 1 about 5 minutes, part 2
# about 3), writing JSON named after the card into ${OUT:-experiments/results}.
#
#   bash experiments/bench/gpu_session.sh 1      # a whole run against the plain loop,
#        # 20m and 150m, 8 rounds, 4 workers: sync DiLoCo with the AdamW states on disk
#        # (the default while checkpoints are on; arm 1) and in memory (arm 6), and in
#        # memory without torch.compile (arm 7)
#   bash experiments/bench/gpu_session.sh 2      # 16 workers of 20m, per job and batched,
#        # against the plain loop (arms 4, 5), and one inner step of 16 replicas three ways
#   bash experiments/bench/gpu_session.sh 3      # where the time around a job goes: arm 1
#        # of part 1 (sync DiLoCo, 4 workers, 8 rounds) at 20m and 150m under cProfile, the
#        # top functions as text (gpu-CARD-profile-MODEL.txt)
#   bash experiments/bench/gpu_session.sh smoke  # every part's code on the CPU, in about
#        # a minute, nothing written: check this script before a GPU is lent
set -euo pipefail
cd "$(dirname "$0")/../.."
part=${1:?"which part: 1, 2, 3 or smoke"}
out=${OUT:-experiments/results}
card=$(python -c 'import re, torch
name = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"
print((re.findall(r"\b[A-Z]+\d+[A-Za-z]*\b", name) or [name.split()[-1]])[0].lower())')
# profile MODEL DEVICE TEXT H BATCH SEQ: one run of gpu.py's arm 1 under cProfile; the
# functions that took the most time, by their own time and with what they call, to TEXT
profile() {
  local tmp; tmp=$(mktemp -d)
  python -m cProfile -o "$tmp/run.prof" -m fedlm run --quiet --backend inprocess \
    --db "$tmp/run.db" --set model="$1" --set device="$2" --set workers=4 \
    --set inner.steps="$4" --set inner.batch_size="$5" --set data.seq_len="$6" \
    --set profile=homogeneous --set eval.batches=1 --set inner.precision=auto \
    --set inner.compile="$([ "$2" = cuda ] && echo true || echo false)" \
    --set data.partition=iid --set strategy=diloco --set updates=8 --set eval.every=8
  python -c 'import pstats, sys
stats = pstats.Stats(sys.argv[1], stream=sys.stdout)
stats.sort_stats("tottime").print_stats(40)
stats.sort_stats("cumulative").print_stats(80)' "$tmp/run.prof" > "$3"
  echo "profile of $1 on $2: $3"
  rm -rf "$tmp"
}

case "$part" in
  1) python experiments/bench/gpu.py --models 20m,150m --rounds 8 \
       --variants fp32,bf16+fused+compile --arms 1,6,7 --out "$out/gpu-$card-states.json" ;;
  2) python experiments/bench/gpu.py --models 20m --rounds 8 \
       --variants fp32,bf16+fused+compile --arms 4,5 --out "$out/gpu-$card-batched16.json"
     python experiments/bench/batched.py --device cuda --skip-runs \
       --variant 20m,16,32,256 --out "$out/batched-$card-step.json" ;;
  3) for model in 20m 150m; do profile "$model" cuda "$out/gpu-$card-profile-$model.txt" 30 32 256; done ;;
  smoke) python experiments/bench/gpu.py --smoke --arms 1,6,7
         python experiments/bench/gpu.py --smoke --arms 4,5
         python experiments/bench/batched.py --smoke
         profile tiny cpu /dev/null 2 2 32 ;;
  *) echo "gpu_session.sh: part must be 1, 2, 3 or smoke, got '$part'" >&2; exit 2 ;;
esac
