#!/usr/bin/env bash
# Set up Eco-FL on a fresh Debian machine: a virtual environment in .venv with the
# package (and, with --test, the test extras), and the offline Fashion-MNIST files.
# Usage: bash scripts/setup.sh [--test]
set -euo pipefail
cd "$(dirname "$0")/.."

extras=""
[ "${1:-}" = "--test" ] && extras="[test]"

if [ ! -d /usr/share/datasets/fashion-mnist ]; then
  if command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
    echo "setup: installing Debian's dataset-fashion-mnist (offline Fashion-MNIST)"
    (apt-get update -qq && apt-get install -y -qq dataset-fashion-mnist >/dev/null) \
      || echo "setup: could not install dataset-fashion-mnist; digits still works offline"
  else
    echo "setup: Fashion-MNIST files not found. As root on Debian/Ubuntu run:"
    echo "         apt-get install dataset-fashion-mnist"
    echo "       or pass a torchvision-layout root with download allowed (see README)."
  fi
fi

python3 -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
# torch/torchvision first and pinned: on this platform's machines these exact
# releases are on local disk; any other pair would be a multi-GB download.
.venv/bin/python -m pip install -q "torch==2.14.1" "torchvision==0.29.1" \
  || .venv/bin/python -m pip install -q "torch>=2.4,<2.15" "torchvision>=0.19,<0.30"
.venv/bin/python -m pip install -q -e ".${extras}"
echo "setup: done (.venv)"
