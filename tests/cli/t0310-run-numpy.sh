#!/bin/sh
# tern-run's tensor files against NumPy and ONNX's own readers and writers: what np.save writes tern
# reads, what tern writes np.load and onnx.numpy_helper read, for every dtype and odd shapes.
test_description='tern-run and NumPy tensor files'
. "$(dirname "$0")/test-lib.sh"

test_expect_success PYTHON 'set up identity graphs and arrays of every dtype' '
	"$TERN_PYTHON" - <<-\EOF
	import numpy as np, onnx
	from onnx import helper as h, TensorProto as T
	types = {"f2": T.FLOAT16, "f4": T.FLOAT, "f8": T.DOUBLE, "i1": T.INT8, "i2": T.INT16, "i4": T.INT32,
	         "i8": T.INT64, "u1": T.UINT8, "u2": T.UINT16, "u4": T.UINT32, "u8": T.UINT64, "b1": T.BOOL}
	shapes = [(), (0,), (7,), (2, 3), (2, 0, 3), (3, 1, 2, 2)]
	rng = np.random.default_rng(3)
	for code, elem in types.items():
	    g = h.make_graph([h.make_node("Identity", ["x"], ["y"])], "id",
	                     [h.make_tensor_value_info("x", elem, None)], [h.make_tensor_value_info("y", elem, None)])
	    onnx.save(h.make_model(g, opset_imports=[h.make_opsetid("", 17)]), "id-%s.onnx" % code)
	    for k, shape in enumerate(shapes):
	        if code == "b1":
	            a = rng.integers(0, 2, shape).astype(bool)
	        elif code[0] == "f":
	            a = (rng.standard_normal(shape) * 100).astype(code)
	        else:
	            a = rng.integers(0, 100, shape).astype(code)
	        np.save("in-%s-%d.npy" % (code, k), a)
	EOF
'

test_expect_success PYTHON 'np.save -> tern-run -> file identical to np.save, for every dtype and shape' '
	for f in in-*.npy
	do
		code=$(echo $f | cut -d- -f2) &&
		rm -rf out && tern-run -i $f -O out id-$code.onnx &&
		cmp $f out/y.npy || return 1
	done
'

test_expect_success PYTHON 'tern-run writes .pb that onnx reads as the same array' '
	for f in in-*.npy
	do
		code=$(echo $f | cut -d- -f2) &&
		tern-run -i $f -O pb-${f%.npy} --output-format pb id-$code.onnx || return 1
	done &&
	"$TERN_PYTHON" - <<-\EOF
	import glob, numpy as np, onnx
	from onnx import numpy_helper
	for f in glob.glob("in-*.npy"):
	    want = np.load(f)
	    t = onnx.load_tensor("pb-%s/y.pb" % f[:-4])
	    got = numpy_helper.to_array(t)
	    assert t.name == "y", t.name
	    assert got.dtype == want.dtype and got.shape == want.shape, (f, got.dtype, got.shape)
	    assert np.array_equal(got, want), f
	EOF
'

test_expect_success PYTHON 'tern-run reads .pb written by onnx' '
	"$TERN_PYTHON" - <<-\EOF &&
	import glob, numpy as np, onnx
	from onnx import numpy_helper
	for f in glob.glob("in-*.npy"):
	    onnx.save_tensor(numpy_helper.from_array(np.load(f), "x"), f[:-4] + ".pb")
	EOF
	for f in in-*.pb
	do
		code=$(echo $f | cut -d- -f2) &&
		rm -rf out && tern-run -i $f -O out id-$code.onnx &&
		cmp ${f%.pb}.npy out/y.npy || return 1
	done
'

test_expect_success PYTHON 'versions 2.0 and 3.0, Fortran order and big-endian files read as NumPy reads them' '
	"$TERN_PYTHON" - <<-\EOF &&
	import numpy as np
	from numpy.lib import format
	a = np.arange(24, dtype="<i4").reshape(2, 3, 4) * 1000003
	np.save("c.npy", a)
	for version in [(2, 0), (3, 0)]:
	    with open("v%d.npy" % version[0], "wb") as f:
	        format.write_array(f, a, version=version)
	np.save("fortran.npy", np.asfortranarray(a))
	np.save("big.npy", a.astype(">i4"))
	np.save("big-fortran.npy", np.asfortranarray(a.astype(">i4")))
	EOF
	for f in v2 v3 fortran big big-fortran
	do
		rm -rf out && tern-run -i $f.npy -O out id-i4.onnx &&
		cmp c.npy out/y.npy || return 1
	done
'

test_expect_success PYTHON 'float16 NaN, infinity, -0 and subnormals survive' '
	"$TERN_PYTHON" - <<-\EOF &&
	import numpy as np
	np.save("special.npy", np.array([np.nan, np.inf, -np.inf, -0.0, 6e-8, 65504], np.float16))
	EOF
	rm -rf out && tern-run -i special.npy -O out id-f2.onnx &&
	cmp special.npy out/y.npy
'

test_expect_success PYTHON 'random inputs: floats in [-1, 1), integers 0 to 3, booleans' '
	"$TERN_PYTHON" - <<-\EOF &&
	import onnx
	from onnx import helper as h, TensorProto as T
	ins = [h.make_tensor_value_info(n, t, [1000]) for n, t in [("f", T.FLOAT), ("d", T.DOUBLE), ("hf", T.FLOAT16), ("i", T.INT64), ("u", T.UINT8), ("b", T.BOOL)]]
	outs = [h.make_tensor_value_info(v.name + "_out", v.type.tensor_type.elem_type, [1000]) for v in ins]
	nodes = [h.make_node("Identity", [v.name], [v.name + "_out"]) for v in ins]
	onnx.save(h.make_model(h.make_graph(nodes, "r", ins, outs), opset_imports=[h.make_opsetid("", 17)]), "rand.onnx")
	EOF
	tern-run --random -O rand rand.onnx &&
	"$TERN_PYTHON" - <<-\EOF
	import numpy as np
	for n in ["f", "d", "hf"]:
	    a = np.load("rand/%s_out.npy" % n)
	    assert a.min() >= -1 and a.max() < 1 and a.std() > 0.4, (n, a.min(), a.max(), a.std())
	for n in ["i", "u"]:
	    a = np.load("rand/%s_out.npy" % n)
	    assert set(np.unique(a)) == {0, 1, 2, 3}, (n, np.unique(a))
	b = np.load("rand/b_out.npy")
	assert b.dtype == bool and 300 < b.sum() < 700
	EOF
'

test_expect_success PYTHON 'output names become safe file names' '
	"$TERN_PYTHON" - <<-\EOF &&
	import onnx
	from onnx import helper as h, TensorProto as T
	names = ["a/b:0", "..", ".hidden", "a_b_0"]
	x = h.make_tensor_value_info("x", T.FLOAT, [2])
	nodes = [h.make_node("Identity", ["x"], [n]) for n in names]
	outs = [h.make_tensor_value_info(n, T.FLOAT, [2]) for n in names]
	onnx.save(h.make_model(h.make_graph(nodes, "names", [x], outs), opset_imports=[h.make_opsetid("", 17)]), "names.onnx")
	EOF
	tern-run --random -O names names.onnx &&
	(cd names && ls) >actual &&
	cat >expect <<-\EOF &&
	__.npy
	_hidden.npy
	a_b_0.npy
	a_b_0_3.npy
	EOF
	sort actual >sorted &&
	sort expect >expect.sorted &&
	test_cmp expect.sorted sorted
'

test_expect_success PYTHON 'an ONNX backend test case gives its expected outputs' '
	node=$("$TERN_PYTHON" -c "import onnx.backend.test, os; print(os.path.join(os.path.dirname(onnx.backend.test.__file__), \"data\", \"node\"))") &&
	d=$node/test_add_bcast &&
	tern-run -i $d/test_data_set_0/input_0.pb -i $d/test_data_set_0/input_1.pb -O add --output-format pb $d/model.onnx &&
	"$TERN_PYTHON" -c "import onnx, numpy as np, sys; from onnx import numpy_helper as nh; a = nh.to_array(onnx.load_tensor(\"add/sum.pb\")); b = nh.to_array(onnx.load_tensor(sys.argv[1])); assert a.shape == b.shape and np.allclose(a, b)" $d/test_data_set_0/output_0.pb
'

test_done
