#!/bin/sh
# Convolutions on activations in blocks of 16 channels: tern.ToBlocks, tern.FromBlocks and
# tern.BlockedConv against plain Conv on every instruction-set path (its Winograd path against the
# direct one too), the blocked-conv pass of
# tern-optimize (what it converts, what it leaves, outputs unchanged), and bad blocked input.
test_description='blocked convolutions'
. "$(dirname "$0")/test-lib.sh"

compare() { # compare A.npy B.npy: relative difference below 1e-5 of the largest value
	"$TERN_PYTHON" -c "
import sys, numpy as np
a, b = np.load(sys.argv[1]), np.load(sys.argv[2])
e = np.abs(a - b).max() / max(np.abs(a).max(), 1e-12)
print(sys.argv[1], 'relative difference', e)
sys.exit(0 if a.shape == b.shape and e < 1e-5 else 1)" "$1" "$2"
}

test_expect_success PYTHON 'make the models' '
	mkdir pairs &&
	"$TERN_PYTHON" "$TEST_DIRECTORY/make-blocked.py" pairs pairs >count &&
	"$TERN_PYTHON" "$TEST_DIRECTORY/make-blocked.py" net net.onnx &&
	"$TERN_PYTHON" "$TEST_DIRECTORY/make-blocked.py" pair2 pair2.onnx
'

test_expect_success PYTHON 'BlockedConv equals Conv: strides, dilations, pads, bias, residual, activations, padded channels, depthwise, planar input' '
	n=$(cat count) && i=0 &&
	while [ $i -lt $n ]; do
		for isa in avx512 avx2 generic; do
			for kind in plain blocked; do
				TERN_ISA=$isa tern-run --random --optimize 0 --threads 2 -O $kind-$i-$isa pairs/c$i.$kind.onnx || return 1
			done &&
			compare plain-$i-$isa/y.npy blocked-$i-$isa/y.npy || return 1
		done
		i=$((i + 1))
	done
'

test_expect_success PYTHON 'Winograd F(2 x 2, 3 x 3) runs where chosen: other rounding than the direct sums, the same values' '
	for i in $("$TERN_PYTHON" "$TEST_DIRECTORY/make-blocked.py" winograd); do
		for isa in avx512 avx2 generic; do
			TERN_ISA=$isa TERN_WINOGRAD=0 tern-run --random --optimize 0 --threads 2 -O direct-$i-$isa \
				pairs/c$i.blocked.onnx &&
			! cmp -s direct-$i-$isa/y.npy blocked-$i-$isa/y.npy &&
			compare direct-$i-$isa/y.npy blocked-$i-$isa/y.npy || return 1
		done
	done
'

test_expect_success PYTHON 'BlockedMaxPool and BlockedAveragePool equal MaxPool and AveragePool: strides, dilations, pads, ceil_mode, count_include_pad, padded channels' '
	mkdir pools &&
	n=$("$TERN_PYTHON" "$TEST_DIRECTORY/make-blocked.py" pools pools) && i=0 &&
	while [ $i -lt $n ]; do
		for isa in avx512 avx2 generic; do
			for kind in plain blocked; do
				TERN_ISA=$isa tern-run --random --optimize 0 --threads 2 -O $kind-p$i-$isa pools/p$i.$kind.onnx || return 1
			done &&
			compare plain-p$i-$isa/y.npy blocked-p$i-$isa/y.npy || return 1
		done
		i=$((i + 1))
	done
'

test_expect_success PYTHON 'the pass blocks a run of convolutions through Relu, Add and Concat' '
	tern-optimize -o net.opt.onnx net.onnx &&
	tern-show net.opt.onnx >net.opt.txt &&
	test $(grep -c "= tern.BlockedConv" net.opt.txt) = 12 &&
	test $(grep -c "= tern.ToBlocks" net.opt.txt) = 1 &&
	grep "^ *y = tern.FromBlocks <channels = 16>" net.opt.txt &&
	grep "^ *side = tern.FromBlocks <channels = 32> (side_b16)" net.opt.txt &&
	grep "= Concat <axis = 1>" net.opt.txt &&
	"$TERN_PYTHON" -c "import onnx; onnx.checker.check_model(onnx.load(\"net.opt.onnx\"))"
'

test_expect_success PYTHON 'outputs of the blocked graph equal the plain one, whatever the path and threads' '
	tern-run --random --optimize 0 -O plain net.onnx &&
	for isa in avx512 avx2 generic; do
		for t in 1 2; do
			TERN_ISA=$isa tern-run --random --optimize 0 --threads $t -O b-$isa-$t net.opt.onnx &&
			compare plain/y.npy b-$isa-$t/y.npy && compare plain/side.npy b-$isa-$t/side.npy || return 1
		done
	done
'

test_expect_success PYTHON 'two convolutions stay planar, and optimising again changes nothing' '
	tern-optimize -o pair2.opt.onnx pair2.onnx &&
	! tern-show pair2.opt.onnx | grep Blocked &&
	tern-optimize -o net.opt2.onnx net.opt.onnx &&
	tern-show net.opt.onnx >a.txt && tern-show net.opt2.onnx >b.txt && test_cmp a.txt b.txt
'

test_expect_success PYTHON 'convolutions with an activation the blocked kernel lacks stay planar and run' '
	"$TERN_PYTHON" "$TEST_DIRECTORY/make-blocked.py" elu elu.onnx &&
	tern-optimize -o elu.opt.onnx elu.onnx &&
	! tern-show elu.opt.onnx | grep Blocked &&
	tern-run --random -O elu-plain --optimize 0 elu.onnx &&
	tern-run --random -O elu-opt elu.onnx &&
	compare elu-plain/e8.npy elu-opt/e8.npy
'

test_expect_success PYTHON 'inverted residual blocks: a stem on planar input, depthwise, padded channels, squeeze-and-excitation' '
	"$TERN_PYTHON" "$TEST_DIRECTORY/make-blocked.py" mobile mobile.onnx &&
	tern-optimize -o mobile.opt.onnx mobile.onnx &&
	tern-show mobile.opt.onnx >mobile.txt &&
	test $(grep -c "= tern.BlockedConv" mobile.txt) = 13 &&
	grep "stem_b16 = tern.BlockedConv <.*> (x, stem_w, stem_b)" mobile.txt &&
	! grep "= tern.ToBlocks" mobile.txt &&
	test $(grep -c "= tern.BlockedConv <.*group = 72" mobile.txt) = 2 &&
	test $(grep -c "= tern.BlockedScale" mobile.txt) = 2 &&
	test $(grep -c "= tern.BlockedGlobalAveragePool" mobile.txt) = 3 &&
	grep "^ *y = tern.FromBlocks <channels = 48>" mobile.txt &&
	tern-run --random --optimize 0 -O mobile-plain mobile.onnx &&
	for isa in avx512 avx2 generic; do
		for t in 1 2; do
			TERN_ISA=$isa tern-run --random --optimize 0 --threads $t -O mobile-$isa-$t mobile.opt.onnx &&
			compare mobile-plain/y.npy mobile-$isa-$t/y.npy || return 1
		done
	done
'

test_expect_success 'bad blocked input is one line naming the node, exit 65' '
	cat >bad.txt <<-\EOF &&
	<ir_version: 8, opset_import: ["" : 17, "tern" : 1]>
	bad (float[1,32,4,4] x) => (float[1,40,4,4] y)
	{
	   b = tern.ToBlocks (x)
	   y = tern.FromBlocks <channels = 40> (b)
	}
	EOF
	test_expect_code 65 tern-run --random bad.txt 2>err &&
	test $(wc -l <err) = 1 && grep "channels" err &&
	cat >bad2.txt <<-\EOF &&
	<ir_version: 8, opset_import: ["" : 17, "tern" : 1]>
	bad2 (float[1,32,4,4] x, float[16,32,1,1] w) => (float[1,16,4,4] y)
	{
	   c = tern.BlockedConv <kernel_shape = [1, 1]> (x, w)
	   y = Identity (c)
	}
	EOF
	test_expect_code 65 tern-run --random bad2.txt 2>err2 &&
	test $(wc -l <err2) = 1 && grep "blocks of 16" err2 &&
	cat >bad3.txt <<-\EOF &&
	<ir_version: 8, opset_import: ["" : 17, "tern" : 1]>
	bad3 (float[1,32,4,4] x, float[1,16,1,1] s) => (float[1,32,4,4] y)
	{
	   b = tern.ToBlocks (x)
	   sb = tern.ToBlocks (s)
	   c = tern.BlockedScale (b, sb)
	   y = tern.FromBlocks <channels = 32> (c)
	}
	EOF
	test_expect_code 65 tern-run --random bad3.txt 2>err3 &&
	test $(wc -l <err3) = 1 && grep "one value per channel" err3 &&
	cat >bad4.txt <<-\EOF &&
	<ir_version: 8, opset_import: ["" : 17, "tern" : 1]>
	bad4 (float[1,32,4,4] x, float[16,32,1,1] w) => (float[1,16,4,4] y)
	{
	   b = tern.ToBlocks (x)
	   c = tern.BlockedConv <kernel_shape = [1, 1]> (b, w)
	   y = tern.FromBlocks <channels = 16> (c)
	}
	EOF
	test_expect_code 65 tern-run --random bad4.txt 2>err4 &&
	test $(wc -l <err4) = 1 && grep "must be constants" err4
'

test_done
