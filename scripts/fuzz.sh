#!/bin/bash
# fuzz.sh — builds tern's libFuzzer targets with clang (the library compiled again with coverage,
# AddressSanitizer and UndefinedBehaviorSanitizer) and runs them.
#
# Usage: scripts/fuzz.sh [--build DIR] [--short | --runs N | --time SECONDS] [TARGET...] [-- ARGS]
#
#   TARGET     fuzz_text (the text syntax reader) or fuzz_onnx (the loader on any bytes, then validation
#              and both writers); both when none is named
#   --build    where objects, binaries, seeds, the growing corpus and crashes go (build-fuzz)
#   --short    20 seconds per target: the fuzz suite's check (the default)
#   --runs N   N inputs per target, e.g. --runs 1000000
#   --time S   S seconds per target
#   ARGS       passed to libFuzzer (-jobs=2, -max_len=4096, ...)
#
# Seeds: the ONNX node tests (binary models, and their text as tern writes it) and tests/fuzz/seeds
# (text *.txt, binary *.onnx).
# New inputs are kept in DIR/corpus/TARGET, crashing ones in DIR/crashes. Exits 77 (skipped) when
# clang with libFuzzer is missing, non-zero when a target crashes, leaks or breaks its checks.
set -euo pipefail

src=$(cd "$(dirname "$0")/.." && pwd)
build=$src/build-fuzz
seconds=20
runs=
targets=()
while [ $# -gt 0 ]; do
	case $1 in
	--build) build=$2; shift 2 ;;
	--short) seconds=20; runs=; shift ;;
	--runs) runs=$2; seconds=; shift 2 ;;
	--time) seconds=$2; runs=; shift 2 ;;
	fuzz_text | fuzz_onnx) targets+=("$1"); shift ;;
	--) shift; break ;;
	-h | --help) sed -n '2,19s/^# \{0,1\}//p' "$0"; exit 0 ;;
	*) echo "fuzz.sh: unknown argument '$1' (see --help)" >&2; exit 64 ;;
	esac
done
[ ${#targets[@]} -gt 0 ] || targets=(fuzz_text fuzz_onnx)
extra=("$@")

cc=${FUZZ_CC:-clang}
mkdir -p "$build/gen" "$build/seeds/onnx" "$build/seeds/text" "$build/crashes"
if ! command -v "$cc" >/dev/null ||
	! echo 'int LLVMFuzzerTestOneInput(const char *d, unsigned long n) { return 0; }' |
	"$cc" -x c -fsanitize=fuzzer - -o "$build/probe" 2>/dev/null; then
	echo "fuzz.sh: $cc with libFuzzer (-fsanitize=fuzzer) is not available: skipped" >&2
	exit 77
fi

# Generated sources: the protobuf-c code and a configuration with no optional backend.
proto=/usr/include/onnx/onnx.proto
if [ ! "$build/gen/onnx.pb-c.c" -nt "$proto" ]; then
	protoc-c --proto_path="$(dirname "$proto")" --c_out="$build/gen" "$proto"
fi
if [ ! "$build/gen/values.pb-c.c" -nt "$src/formats/values.proto" ]; then
	protoc-c --proto_path="$src/formats" --proto_path="$(dirname "$proto")" --c_out="$build/gen" "$src/formats/values.proto"
fi
{
	echo "#pragma once"
	sed -n "s/^ *version: '\([^']*\)'.*/#define TERN_VERSION \"\1\"/p" "$src/meson.build"
	grep -o "conf.set10('[A-Z_]*'" "$src/meson.build" | sed "s/conf.set10('\(.*\)'/#define \1 0/"
} >"$build/gen/tern_config.h.new"
if cmp -s "$build/gen/tern_config.h.new" "$build/gen/tern_config.h"; then
	rm "$build/gen/tern_config.h.new"
else
	mv "$build/gen/tern_config.h.new" "$build/gen/tern_config.h"
fi

# The library's sources, as lib/meson.build lists them.
lib_sources=$(sed -n "/^lib_src = files(/,/^)/p" "$src/lib/meson.build" | grep -o "'[^']*\.c'" | tr -d "'")

sanitize="-fsanitize=address,undefined -fno-sanitize-recover=all"
# The targets parse and print graphs and run no kernel: TERN_FEW_KERNEL_VARIANTS compiles the blocked
# convolution's kernels at one tile width instead of dozens (clang with the sanitizers takes minutes on
# every dozen).
cat >"$build/Makefile" <<EOF
CC = $cc
CFLAGS = -g -O1 -std=c11 -D_GNU_SOURCE -DTERN_FEW_KERNEL_VARIANTS -fno-omit-frame-pointer $sanitize -w \\
	-I$build/gen -I$src/lib -I$src $(pkg-config --cflags libcgraph libprotobuf-c)
LIBS = $(pkg-config --libs libcgraph libprotobuf-c) -lm -lpthread
OBJ = $build/obj/onnx.pb-c.o $build/obj/values.pb-c.o $(for f in $lib_sources; do printf '%s ' "$build/obj/${f%.c}.o"; done)

all: $build/fuzz_text $build/fuzz_onnx $build/seed_text

$build/obj/%.pb-c.o: $build/gen/%.pb-c.c
	@mkdir -p \$(@D)
	\$(CC) \$(CFLAGS) -fsanitize=fuzzer-no-link -MMD -c \$< -o \$@

$build/obj/%.o: $src/lib/%.c $build/gen/tern_config.h
	@mkdir -p \$(@D)
	\$(CC) \$(CFLAGS) -fsanitize=fuzzer-no-link -MMD -c \$< -o \$@

$build/%: $src/tests/fuzz/%.c \$(OBJ)
	\$(CC) \$(CFLAGS) -fsanitize=fuzzer $< \$(OBJ) \$(LIBS) -o \$@

$build/seed_text: $src/tests/fuzz/seed_text.c \$(OBJ)
	\$(CC) \$(CFLAGS) $< \$(OBJ) \$(LIBS) -o \$@

-include \$(OBJ:.o=.d)
EOF
make -s -j"${FUZZ_JOBS:-2}" -f "$build/Makefile" all

# Seeds, made once.
node=$(ls -d "$src"/.venv/lib/python3*/site-packages/onnx/backend/test/data/node 2>/dev/null | head -n 1 || true)
if [ -n "$node" ] && [ -z "$(ls -A "$build/seeds/onnx")" ]; then
	for model in "$node"/*/model.onnx; do
		name=$(basename "$(dirname "$model")")
		cp "$model" "$build/seeds/onnx/$name.onnx"
	done
	find "$build/seeds/onnx" -name '*.onnx' -size +64k -delete
	"$build/seed_text" "$build/seeds/text" "$build/seeds/onnx"/*.onnx
fi
cp "$src"/tests/fuzz/seeds/*.txt "$build/seeds/text/"
# binary seeds: inputs that once broke a check (kept so that they stay fixed)
cp "$src"/tests/fuzz/seeds/*.onnx "$build/seeds/onnx/"

status=0
for target in "${targets[@]}"; do
	mkdir -p "$build/corpus/$target"
	args=(-artifact_prefix="$build/crashes/$target-" -max_len=65536 -timeout=20 -rss_limit_mb=2048
		-print_final_stats=1)
	if [ -n "$runs" ]; then
		args+=(-runs="$runs")
	else
		args+=(-max_total_time="$seconds")
	fi
	seeds=("$build/seeds/text")
	if [ "$target" = fuzz_text ]; then
		args+=(-dict="$src/tests/fuzz/text.dict")
	else
		seeds+=("$build/seeds/onnx")
	fi
	echo "fuzz.sh: $target ${runs:+$runs runs}${seconds:+$seconds seconds}"
	if ! "$build/$target" "${args[@]}" "${extra[@]}" "$build/corpus/$target" "${seeds[@]}" \
		>"$build/$target.log" 2>&1; then
		status=1
		echo "fuzz.sh: $target failed; the end of $build/$target.log:" >&2
		tail -n 40 "$build/$target.log" >&2
	fi
	grep -E '^(stat::number_of_executed_units|stat::peak_rss_mb|Done )' "$build/$target.log" || true
done
exit $status
