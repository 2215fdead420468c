#!/usr/bin/env bash
# The main job: the demo sweep on the embedded synthetic benchmark, then the comparison table.
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
bca sweep experiments/demo.yaml --resume "$@"
