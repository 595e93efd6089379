#!/bin/sh
# External tensor data through every stage that writes graphs: FILE.data beside -o FILE, everything
# inline on standard output, --inline and --external-threshold, the pair replaced together or not at
# all, and one clear error for every kind of broken reference.
test_description='external data'
. "$(dirname "$0")/test-lib.sh"

# Little-endian float32 and int64 bytes from numbers, without numpy.
pack() { # FORMAT-CHAR VALUES...
	python3 -c 'import struct, sys; f = sys.argv[1]; v = sys.argv[2:]; sys.stdout.buffer.write(struct.pack("<%d%s" % (len(v), f), *[(float if f == "f" else int)(x) for x in v]))' "$@"
}

test_expect_success 'set up a graph whose weights live in a data file' '
	mkdir src &&
	pack f 0.5 -1 2 0.25 1.5 -0.75 >src/w.bin &&
	pack f 0.1 -0.2 0.3 >src/b.bin &&
	cat src/w.bin src/b.bin >src/m.data &&
	cat >src/m.txt <<-\EOF &&
	<ir_version: 8, opset_import: ["" : 17]>
	m (float[1,2] x) => (float[1,3] y)
	   <float[2,3] w = ["location": "m.data", "offset": "0", "length": "24"],
	    float[3] b = ["location": "m.data", "offset": "24", "length": "12"]>
	{
	   t = MatMul (x, w)
	   y = Add (t, b)
	}
	EOF
	npy 1,2 1 2 >x.npy &&
	tern-show -f onnx src/m.txt -o src/m.onnx &&
	test -f src/m.onnx.data &&
	tern-run src/m.onnx -i x=x.npy >expect &&
	grep "^y float\[1,3\] \[1.1, 1.8, 0.8\]" expect
'

test_expect_success 'tern-optimize -o puts the data beside its output' '
	mkdir dst &&
	tern-optimize src/m.onnx -o dst/opt.onnx &&
	test -f dst/opt.onnx.data &&
	test "$(wc -c <dst/opt.onnx.data)" -ge 36 &&
	(cd / && tern-run "$TRASH_DIRECTORY/dst/opt.onnx" -i x="$TRASH_DIRECTORY/x.npy") >actual &&
	test_cmp expect actual
'

test_expect_success 'the written graph names its data file relative to itself' '
	tern-show dst/opt.onnx >text &&
	grep "\"location\": \"opt.onnx.data\"" text &&
	! grep "m.data" text
'

test_expect_success 'tern-schedule -o and tern-show -f onnx -o carry the data too' '
	mkdir other &&
	tern-schedule dst/opt.onnx -o other/s.onnx &&
	test -f other/s.onnx.data &&
	tern-run other/s.onnx -i x=x.npy >actual &&
	test_cmp expect actual &&
	tern-show -f onnx src/m.onnx -o other/show.onnx &&
	tern-run other/show.onnx -i x=x.npy >actual &&
	test_cmp expect actual
'

test_expect_success 'a pipe carries small models inline' '
	tern-optimize src/m.onnx | tern-schedule | tern-run -i x=x.npy >actual &&
	test_cmp expect actual &&
	tern-optimize src/m.onnx >inline.onnx &&
	tern-show inline.onnx >text &&
	! grep location text
'

test_expect_success '--inline keeps every tensor in the graph file' '
	tern-optimize --inline src/m.onnx -o dst/in.onnx &&
	! test -e dst/in.onnx.data &&
	tern-run dst/in.onnx -i x=x.npy >actual &&
	test_cmp expect actual
'

test_expect_success '--external-threshold moves big tensors of an inline graph out' '
	tern-show -f onnx --inline src/m.onnx -o plain.onnx &&
	tern-show -f onnx --external-threshold 16 plain.onnx -o dst/t.onnx &&
	test "$(wc -c <dst/t.onnx.data)" -eq 24 &&
	tern-show dst/t.onnx >text &&
	grep "w = \[\"location\"" text &&
	grep "b = {" text &&
	tern-run dst/t.onnx -i x=x.npy >actual &&
	test_cmp expect actual &&
	tern-show -f onnx --external-threshold 1k plain.onnx -o dst/k.onnx &&
	! test -e dst/k.onnx.data
'

test_expect_success 'a bad --external-threshold is a usage error' '
	test_expect_code 64 tern-optimize --external-threshold 12x src/m.onnx -o dst/bad.onnx 2>err &&
	grep "external-threshold" err &&
	! test -e dst/bad.onnx
'

test_expect_success 'tern-show -w prints mapped weights in full' '
	tern-show -w src/m.onnx >text &&
	grep "w = {0.5" text
'

test_expect_success 'optimising in place keeps the pair whole' '
	cp src/m.onnx src/m.onnx.data . &&
	tern-optimize m.onnx -o m.onnx &&
	tern-run m.onnx -i x=x.npy >actual &&
	test_cmp expect actual &&
	tern-optimize m.onnx -o m.onnx &&
	tern-run m.onnx -i x=x.npy >actual &&
	test_cmp expect actual
'

test_expect_success 'a failed write leaves neither file behind, and the old pair as it was' '
	tern-optimize src/m.onnx -o dst/keep.onnx &&
	cp dst/keep.onnx keep.before && cp dst/keep.onnx.data keep.data.before &&
	big=$(python3 -c "print(\" \".join(str(i % 7) for i in range(20000)))") &&
	pack f $big >src/big.bin &&
	cat >src/big.txt <<-\EOF &&
	<ir_version: 8, opset_import: ["" : 17]>
	big (float[1,20000] x) => (float[1,20000] y)
	   <float[1,20000] w = ["location": "big.bin", "offset": "0", "length": "80000"]>
	{
	   y = Add (x, w)
	}
	EOF
	(ulimit -f 40 && tern-optimize src/big.txt -o dst/keep.onnx) 2>err;
	test $? = 74 &&
	grep "write failed" err &&
	test "$(wc -l <err)" = 1 &&
	cmp keep.before dst/keep.onnx &&
	cmp keep.data.before dst/keep.onnx.data &&
	(ulimit -f 40 && tern-optimize src/big.txt -o dst/new.onnx) 2>err;
	test $? = 74 &&
	! test -e dst/new.onnx && ! test -e dst/new.onnx.data &&
	test -z "$(ls -A dst | grep "^\.")"
'

test_expect_success 'a missing data file is one error line naming the tensor (65)' '
	mkdir gone && cp src/m.txt gone/ &&
	test_expect_code 65 tern-run gone/m.txt --random 2>err &&
	test "$(wc -l <err)" = 1 &&
	grep "gone/m.txt: tensor .w.: cannot open external data .gone/m.data.: No such file" err
'

test_expect_success 'a short data file, a bad length or a path out of the folder is refused (65)' '
	mkdir short && cp src/m.txt short/ && head -c 30 src/m.data >short/m.data &&
	test_expect_code 65 tern-show short/m.txt 2>err &&
	grep "tensor .b.: external data .short/m.data. has 30 bytes, the tensor needs 12 at offset 24" err &&
	sed "s/\"length\": \"24\"/\"length\": \"20\"/" src/m.txt >src/len.txt &&
	test_expect_code 65 tern-show src/len.txt 2>err &&
	grep "external data length 20, its shape needs 24 bytes" err &&
	sed "s/\"m.data\"/\"..\/m.data\"/" src/m.txt >src/up.txt &&
	test_expect_code 65 tern-show src/up.txt 2>err &&
	grep "leaves the model.s folder" err &&
	sed "s/\"offset\": \"24\"/\"offset\": \"-4\"/" src/m.txt >src/neg.txt &&
	test_expect_code 65 tern-show src/neg.txt 2>err &&
	grep "offset .-4. is not a byte count" err
'

test_expect_success 'forty external tensors in one data file' '
	mkdir many &&
	python3 - <<-\EOF &&
	import struct
	n = 40
	with open("many/m.data", "wb") as f:
	    for i in range(n):
	        f.write(struct.pack("<4f", i, 1, 2, 3))
	ws = ",\n    ".join("float[4] w%d = [\"location\": \"m.data\", \"offset\": \"%d\", \"length\": \"16\"]" % (i, 16 * i)
	                    for i in range(n))
	body = "\n".join("   a%d = Add (a%d, w%d)" % (i + 1, i, i) for i in range(n))
	with open("many/m.txt", "w") as f:
	    f.write("<ir_version: 8, opset_import: [\"\" : 17]>\nmany (float[4] x) => (float[4] y)\n   <%s>\n{\n"
	            "   a0 = Identity (x)\n%s\n   y = Identity (a%d)\n}\n" % (ws, body, n))
	EOF
	npy 4 0 0 0 0 >z.npy &&
	tern-run many/m.txt -i x=z.npy >expect.many &&
	grep "^y float\[4\] \[780, 40, 80, 120\]" expect.many &&
	tern-optimize -O0 many/m.txt -o dst/many.onnx &&
	test "$(wc -c <dst/many.onnx.data)" -ge 2500 &&
	tern-run dst/many.onnx -i x=z.npy >actual &&
	test_cmp expect.many actual &&
	tern-optimize many/m.txt | tern-run -i x=z.npy >actual &&
	test_cmp expect.many actual
'

test_expect_success PYTHON 'onnx reads what tern wrote, with the same values' '
	"$TERN_PYTHON" - <<-\EOF
	import numpy as np, onnx
	from onnx import numpy_helper
	for path in ["other/show.onnx", "dst/t.onnx"]:
	    onnx.checker.check_model(path, full_check=True)
	    m = onnx.load(path)
	    w = {t.name: numpy_helper.to_array(t) for t in m.graph.initializer}
	    assert np.array_equal(w["w"], np.array([[0.5, -1, 2], [0.25, 1.5, -0.75]], np.float32)), w
	    assert np.allclose(w["b"], [0.1, -0.2, 0.3]), w
	EOF
'

test_done
