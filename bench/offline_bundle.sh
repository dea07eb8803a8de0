#!/usr/bin/env bash
# Pack the project's dependencies for a GPU node that already has CUDA torch and
# transformers but cannot reach a package index (an air-gapped node, a lent test
# machine): one .tar.xz of a site-packages folder, built here for the node's Python.
#
#   bench/offline_bundle.sh OUT.tar.xz [PYTHON_VERSION]        (default 3.12)
#
# On the node:
#   mkdir -p /tmp/site && tar -xJf OUT.tar.xz -C /tmp/site
#   PYTHONPATH=/tmp/site PY=python3 bench/gpu_smoke.sh
#
# What it leaves out: what such a node's image brings (torch, numpy, transformers,
# tokenizers, safetensors, huggingface_hub, pyarrow, pandas and the like), PyAV (video
# prompts only), matplotlib and pytest. To keep the bundle small (Ray's wheel alone is
# about 80 MB), Ray loses its Java jars, the libraries this project never imports
# (rllib, tune, train, serve, llm, data) and the dashboard's source maps, and its three
# native binaries are stripped of symbols. Measured: 45 MB, unpacked in 3-4 s on an
# H200 node, where the flow, Ray and Prefect's embedded API ran from it
# (docs/launch.md section 7).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT_FILE=$(realpath -m "${1:?usage: bench/offline_bundle.sh OUT.tar.xz [PYTHON_VERSION]}")
PYVER=${2:-3.12}
PY=${PY:-python3}

ON_THE_NODE='^(torch|numpy|transformers|tokenizers|safetensors|huggingface_hub|hf-xet|pyarrow|pandas|av|matplotlib|contourpy|kiwisolver|fonttools|pillow|pytest|pluggy|iniconfig|cycler|pyparsing|sympy|mpmath|networkx|filelock|regex|tqdm|packaging|Pygments|PyYAML|protobuf|xxhash|Markdown|python-dateutil|six|idna|urllib3|requests|charset-normalizer|MarkupSafe|Jinja2|attrs|msgpack)=='
WORK=$(mktemp -d /tmp/offline-bundle.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
grep -vE '^\s*(#|$)' requirements.lock | sed 's/ .*//' | grep -vE "$ON_THE_NODE" > "$WORK/packages.txt"
echo "offline_bundle: $(wc -l < "$WORK/packages.txt") packages for Python $PYVER"
PLATFORMS=(--platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64
           --platform manylinux2014_x86_64 --platform manylinux1_x86_64)
"$PY" -m pip install -q --no-deps --no-compile --only-binary=:all: --python-version "$PYVER" --implementation cp \
    "${PLATFORMS[@]}" --target "$WORK/site" -r "$WORK/packages.txt"
cd "$WORK/site"
rm -rf bin ray/jars ray/rllib ray/tune ray/train ray/serve ray/llm ray/data ray/dashboard/client/build/static/js/*.map
find . -name __pycache__ -prune -exec rm -rf {} +
strip --strip-unneeded ray/core/src/ray/gcs/gcs_server ray/core/src/ray/raylet/raylet ray/_raylet.so
echo "offline_bundle: $(du -sh . | cut -f1) unpacked; compressing (about 2 minutes on 2 cores)"
tar -cf - . | xz -9 -T0 > "$OUT_FILE"
echo "offline_bundle: wrote $OUT_FILE ($(du -h "$OUT_FILE" | cut -f1))"
