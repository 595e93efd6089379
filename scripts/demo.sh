#!/bin/sh
# demo.sh — tern's main job on a fresh machine: installs what is missing, builds, then runs the whole
# pipeline on real data that a package ships (scikit-learn's handwritten digits, no download):
# a small CNN exported from PyTorch is made trainable (tern-autodiff), its training step optimised
# and scheduled (tern-optimize, tern-schedule), trained from the shell (tern-run --train), optimised (tern-optimize), scheduled on several streams (tern-schedule), drawn
# (tern-show -f dot) and run on the test digits, whose accuracy is printed; the same step is partitioned
# for 2 ranks (tern-partition) and trained on them (tern-dist-run). Then an imperative
# Python program on the same digits (scripts/example/eager_digits.py, on tern's eager API) is traced
# into a graph (tern-trace) and that graph optimised and scheduled. Output files go to demo-out/ (or
# the folder given as $1).
set -eu
cd "$(dirname "$0")/.."
scripts/setup.sh >&2
[ -f build/build.ninja ] || meson setup build -Dcuda=auto >/dev/null
ninja -C build >/dev/null
out=${1:-demo-out}
mkdir -p "$out"
PATH="$PWD/build/bin:$PATH"
py=.venv/bin/python

set -x
$py scripts/digits.py data "$out"
$py scripts/digits.py model "$out/cnn.onnx"
tern-show -f stats "$out/cnn.onnx"
tern-autodiff --loss cross-entropy --target label --optimizer adam --lr 3e-3 --lr-schedule cosine:675 \
	"$out/cnn.onnx" | tern-optimize | tern-schedule -o "$out/train.onnx"
tern-run --train --threads 2 "$out/train.onnx" -i x="$out/x_train.npy" -i label="$out/y_train.npy" --batch 32 --epochs 15 \
	--shuffle --val x="$out/x_test.npy" --val label="$out/y_test.npy" --log "$out/train.jsonl" -o "$out/trained.onnx"
tern-optimize --drop-training --dim N=359 "$out/trained.onnx" -o "$out/opt.onnx"
tern-schedule "$out/opt.onnx" -o "$out/sched.onnx"
tern-show -f dot "$out/sched.onnx" | dot -Tsvg -o "$out/cnn.svg"
tern-run --threads 2 -i x="$out/x_test.npy" -O "$out/test" "$out/sched.onnx"
$py scripts/digits.py accuracy "$out/test/logits.npy" "$out/y_test.npy"
# data-parallel: the same training step partitioned for 2 ranks and trained on them over MPICH
tern-autodiff --loss cross-entropy --target label --optimizer adam --lr 3e-3 "$out/cnn.onnx" |
	tern-partition --ranks 2 -o "$out/train2.onnx"
tern-dist-run -n 2 "$out/train2.onnx" -i x="$out/x_train.npy" -i label="$out/y_train.npy" --batch 32 --epochs 3 \
	--shuffle --report -o "$out/trained2.onnx"
tern-trace -v --steps 3 -o "$out/eager-step.onnx" -- $py scripts/example/eager_digits.py "$out"
tern-optimize "$out/eager-step.onnx" | tern-schedule | tern-show -f stats
set +x
echo "demo: trained $out/trained.onnx (test accuracy above), drew $out/cnn.svg, log in $out/train.jsonl;" \
	"trained $out/trained2.onnx on 2 ranks;" "traced the eager program's step into $out/eager-step.onnx" >&2
