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
#   bash experiments/bench/gpu_session.sh smoke  # both parts' code on the CPU, in about
#        # a minute, nothing written: check this script before a GPU is lent
set -euo pipefail
cd "$(dirname "$0")/../.."
part=${1:?"which part: 1, 2 or smoke"}
out=${OUT:-experiments/results}
card=$(python -c 'import re, torch
name = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"
print((re.findall(r"\b[A-Z]+\d+[A-Za-z]*\b", name) or [name.split()[-1]])[0].lower())')
case "$part" in
  1) python experiments/bench/gpu.py --models 20m,150m --rounds 8 \
       --variants fp32,bf16+fused+compile --arms 1,6,7 --out "$out/gpu-$card-states.json" ;;
  2) python experiments/bench/gpu.py --models 20m --rounds 8 \
       --variants fp32,bf16+fused+compile --arms 4,5 --out "$out/gpu-$card-batched16.json"
     python experiments/bench/batched.py --device cuda --skip-runs \
       --variant 20m,16,32,256 --out "$out/batched-$card-step.json" ;;
  smoke) python experiments/bench/gpu.py --smoke --arms 1,6,7
         python experiments/bench/gpu.py --smoke --arms 4,5
         python experiments/bench/batched.py --smoke ;;
  *) echo "gpu_session.sh: part must be 1, 2 or smoke, got '$part'" >&2; exit 2 ;;
esac
