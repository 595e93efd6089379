#!/bin/sh
# demo.sh — tern's main job on the built-in example, on a fresh machine: installs what is missing,
# builds, then loads the example model, shows it as text and statistics, draws it with Graphviz and
# runs it on the CPU. Output files go to demo-out/ (or the folder given as $1).
set -eu
cd "$(dirname "$0")/.."
scripts/setup.sh >&2
[ -f build/build.ninja ] || meson setup build -Dcuda=auto >/dev/null
ninja -C build >/dev/null
out=${1:-demo-out}
mkdir -p "$out"
PATH="$PWD/build/bin:$PATH"

set -x
tern-show -f onnx -o "$out/mlp.onnx" scripts/example/mlp.onnxtxt
tern-show -f stats "$out/mlp.onnx"
tern-show "$out/mlp.onnx"
tern-show -f dot "$out/mlp.onnx" | dot -Tsvg -o "$out/mlp.svg"
tern-run --random --seed 1 --dim N=2 --print "$out/mlp.onnx"
set +x
echo "demo: wrote $out/mlp.onnx and $out/mlp.svg" >&2
