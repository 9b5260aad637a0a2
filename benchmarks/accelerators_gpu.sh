#!/usr/bin/env bash
# Homes with accelerators on a lent GPU machine (issue 42; docs/pipeline_accelerators.md): no Flower, Ray,
# Hydra or Debian's Fashion-MNIST there, and nothing can be installed from a registry.
#
# Here, once:   .venv/bin/python -m benchmarks.accelerator_homes --slice-data .gpu/data   (Fashion-MNIST's first
#               4,000 training and 1,000 test images: the runs train on the first batch x rounds)
#               python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#                 --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 -d .whl \
#                 cryptography==50.0.2 cffi==2.1.1 pycparser==3.12           (.gpu/ and .whl/ are not tracked)
# There:        bash benchmarks/accelerators_gpu.sh          (the device tool: carry=[".gpu", ".whl"])
# Back here:    cp <files_at>/pipeline_accelerators.json benchmarks/results/, and the tables from
#               <files_at>/pipeline_accelerators.md into docs/pipeline_accelerators.md
#
# 1. benchmarks.accelerator_homes: MobileNetV2 and EfficientNet-B0 on a CPU, a GPU and a mixed home (planner error,
#    speed-up); 2. the recovery tests (a kill mid-backward, mid-forward, in replication, ...) with every device of
#    their homes on the GPU; 3. the CUDA tests; 4. whether NVIDIA MPS can slow a GPU device as a quota slows a CPU.
set -uo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-outputs/accelerators_gpu}"
mkdir -p "$out"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  || exit 1
export PYTHONPATH="/tmp/site:$PWD" PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
python3 -c "import torch; print('torch', torch.__version__, torch.cuda.get_device_name(0))"
cp benchmarks/results/pipeline_accelerators.json docs/pipeline_accelerators.md "$out/"
timeout "${HOMES_S:-360}" python3 -m benchmarks.accelerator_homes --data-root .gpu/data \
  --json "$out/pipeline_accelerators.json" --doc "$out/pipeline_accelerators.md" 2>&1 | tee "$out/homes.log"
ECOFL_TEST_ACCELERATOR=cuda timeout "${TESTS_S:-150}" python3 -m pytest -q -p no:cacheprovider -n 8 \
  tests/test_runtime_recovery_anytime.py tests/test_accelerator.py tests/test_batched_training.py \
  tests/test_accelerator_devices.py 2>&1 | tee "$out/tests.log"
{ command -v nvidia-cuda-mps-control || echo "nvidia-cuda-mps-control: not on this machine";
  ls /usr/local/nvidia/bin 2>/dev/null; } 2>&1 | tee "$out/mps.log"
