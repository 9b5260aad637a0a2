#!/usr/bin/env bash
# benchmarks/sim_speed.py's rows on a GPU machine without Flower, Ray, Hydra or Debian's Fashion-MNIST
# (this platform's lent GPU machines: torch is there, nothing can be installed from a registry).
#
# Here, once:   mkdir -p .gpu/data/FashionMNIST/raw && cp /usr/share/datasets/fashion-mnist/*.gz .gpu/data/FashionMNIST/raw/
#               (.gpu/ is ignored by git; the device tool carries it: carry=[".gpu"])
# There:        bash benchmarks/sim_speed_gpu.sh        # writes $OUT/sim_speed.json, $OUT/sim_speed.md, the plot
# Back here:    cp <files_at>/sim_speed.json benchmarks/results/ && .venv/bin/python -m benchmarks.sim_speed table
#
# The Fig. 7 runs go through the in-process transport (the same event loop, no Flower: its numbers are
# Flower's, tests/test_simulation.py); the rows already measured here are kept (rows merge by machine).
set -euo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-outputs/sim_speed_gpu}"
mkdir -p "$out"
cp benchmarks/results/sim_speed.json "$out/sim_speed.json"
cp docs/sim_speed.md "$out/sim_speed.md"
run() { PYTHONUNBUFFERED=1 python3 -m benchmarks.sim_speed "$@" --dataset-root .gpu/data \
          --json "$out/sim_speed.json" --doc "$out/sim_speed.md"; }
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
run homes
run fig7 --engine in-process --device cuda --batch-homes on
run fig7 --engine in-process --device cuda --batch-homes off
