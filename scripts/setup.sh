#!/usr/bin/env bash
# Set up Eco-FL on a fresh Debian machine: a virtual environment in .venv with the
# package (and, with --test, the test extras), and the offline Fashion-MNIST files.
# Every package is installed within constraints.txt, the versions the tests pass with, so two
# fresh machines get the same flwr, ray, torch and hydra-core. --update-constraints resolves
# afresh instead and rewrites constraints.txt (then run the tests before committing it).
# Usage: bash scripts/setup.sh [--test] [--update-constraints]
set -euo pipefail
cd "$(dirname "$0")/.."

extras=""
constraints=(-c constraints.txt)
update=0
for arg in "$@"; do
  case "$arg" in
    --test) extras="[test]" ;;
    --update-constraints) constraints=(); update=1 ;;
    *) echo "setup: unknown option $arg (use --test, --update-constraints)" >&2; exit 2 ;;
  esac
done

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
.venv/bin/python -m pip install -q "${constraints[@]}" -e ".${extras}"
if [ "$update" = 1 ]; then
  { echo "# The versions the tests pass with (pip constraints: bash scripts/setup.sh installs within them)."
    echo "# To move forward: bash scripts/setup.sh --test --update-constraints, run the tests, commit this file."
    .venv/bin/python -m pip freeze --exclude-editable; } > constraints.txt
  echo "setup: constraints.txt rewritten from a fresh resolution; run the tests before committing it"
fi
echo "setup: done (.venv)"
