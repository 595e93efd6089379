#!/bin/sh
# setup.sh — installs everything tern needs on a Debian machine, idempotently:
# Debian packages with apt-get, Python packages into the project-local virtual environment .venv
# (never into the system Python). Usage: scripts/setup.sh [--no-python | --bench]
# --bench also makes .venv-bench: the newest onnxruntime from PyPI, which the benchmarks measure against.
set -eu
cd "$(dirname "$0")/.."

apt_packages="meson ninja-build pkg-config gcc clang protobuf-c-compiler libprotobuf-c-dev libonnx-dev
 libgraphviz-dev graphviz libopenblas-dev mpich libmpich-dev python3 python3-dev python3-venv python3-pip
 python3-numpy python3-torch python3-torchvision python3-sklearn libclang-rt-14-dev valgrind iproute2"

SUDO=""
[ "$(id -u)" = 0 ] || SUDO=sudo
missing=""
for p in $apt_packages; do
	dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
done
if [ -n "$missing" ]; then
	echo "setup: installing Debian packages:$missing" >&2
	$SUDO apt-get update -qq
	DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq $missing >/dev/null
fi

[ "${1:-}" = "--no-python" ] && exit 0

# The virtual environment sees Debian's torch and numpy (system site packages) and adds the pinned
# ONNX tools from PyPI. The pins live in scripts/requirements.txt.
if [ ! -x .venv/bin/python ]; then
	/usr/bin/python3 -m venv --system-site-packages .venv
fi
if ! .venv/bin/python -c 'import onnx, onnxruntime' 2>/dev/null ||
   ! cmp -s scripts/requirements.txt .venv/.requirements 2>/dev/null; then
	.venv/bin/python -m pip install -q --disable-pip-version-check -r scripts/requirements.txt
	cp scripts/requirements.txt .venv/.requirements
fi

# The benchmarks' peers: the newest onnxruntime release, upgraded when PyPI has a newer one, and
# oneDNN for bench_kernels.py's per-kernel comparison (tests/bench/dnnl_conv is built when it is there).
if [ "${1:-}" = "--bench" ]; then
	dpkg-query -W -f='${Status}' libdnnl-dev 2>/dev/null | grep -q "install ok installed" ||
		DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq libdnnl-dev >/dev/null
	[ -x .venv-bench/bin/python ] || /usr/bin/python3 -m venv --system-site-packages .venv-bench
	.venv-bench/bin/python -m pip install -q --disable-pip-version-check --upgrade onnxruntime
	# bench_train.py's third peer: onnxruntime-training (its own module onnxruntime, so its own
	# environment; it needs Debian's torch, and numpy 1 and onnx 1.14 for that torch)
	[ -x .venv-ort-training/bin/python ] || /usr/bin/python3 -m venv --system-site-packages .venv-ort-training
	.venv-ort-training/bin/python -c 'import onnxruntime.training' 2>/dev/null ||
		.venv-ort-training/bin/python -m pip install -q --disable-pip-version-check onnxruntime-training-cpu==1.19.2 \
			onnx==1.14.1 'numpy<2'
fi
