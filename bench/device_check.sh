#!/bin/sh
# The device check on one GPU, no network, no Ray or pydantic needed (bench/device_check.py): writes bench/results/device.md.
cd "$(dirname "$0")/.." && exec "${PYTHON:-python3}" bench/device_check.py --device cuda "$@"
