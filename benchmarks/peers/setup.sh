#!/usr/bin/env bash
# The peers benchmarks/peers.py compares with (Lance, Ray Data, HF datasets, MosaicML Streaming,
# LitData, Petastorm, Daft): one virtualenv each under .venv/ here, made by ../peer_venvs.sh (see
# there).
exec bash "$(dirname "$0")/../peer_venvs.sh" "$(dirname "$0")"
