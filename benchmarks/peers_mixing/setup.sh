#!/usr/bin/env bash
# The peers benchmarks/mixing.py compares with (HF datasets, MosaicML Streaming): one virtualenv
# each under .venv/ here, made by ../peer_venvs.sh (see there): their pins clash (Streaming's
# transformers<5 wants huggingface-hub<1, HF datasets 5.2 wants >=1.31).
exec bash "$(dirname "$0")/../peer_venvs.sh" "$(dirname "$0")"
