"""text-compat: tern's text syntax against onnx's printer and parser (the onnx package in the project's
virtual environment, 1.14).

For each model (the ONNX backend node tests, small PyTorch exports made here at opset 17, and
hand-built models covering every attribute kind, tensor type, functions, metadata and training_info):

  round trip   tern-show -f text --weights, read back by tern-show -f onnx, equals the model (every
               initializer value bit for bit), and printing that text again gives the same text;
  (a) onnx     onnx.parser reads tern's text into the same model; where the model uses what onnx
               1.14's syntax cannot say (node names, quoted names, inf/nan, float16 values, ...) the
               check is skipped with the reason, and PyTorch exports are also checked renamed into
               its syntax and run in onnxruntime against the original, outputs bit for bit;
  (b) tern     tern reads onnx.printer's text into what onnx.parser makes of it;
  layout       tern's text is onnx.printer's, up to number formatting (exact floats, "1.0" for a
               float attribute) and the node names onnx 1.14 leaves out (node tests).

Needs TERN_BUILD (the build directory, for bin/tern-show). Prints failures and ends with the line
"N passed, N failed"; exits 1 when anything failed.
"""

import contextlib
import glob
import io
import os
import re
import struct
import subprocess
import sys
import tempfile
import warnings

import numpy as np
import onnx
import onnx.parser
import onnx.printer
from onnx import TensorProto, helper

BUILD = os.environ.get("TERN_BUILD")
if not BUILD:
    sys.exit("text-compat: set TERN_BUILD to the build directory")
TERN_SHOW = os.path.join(BUILD, "bin", "tern-show")
NODE_DATA = os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data", "node")
IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
UNREADABLE_NAMES = "names that are not identifiers"
TERN_EDATA = 65

passed = 0
failed = 0
skipped = {}


def check(ok, what, detail=""):
    global passed, failed
    if ok:
        passed += 1
    else:
        failed += 1
        print(f"FAIL {what}" + (f": {detail}" if detail else ""))
    return ok


def skip(reason):
    skipped[reason] = skipped.get(reason, 0) + 1


def tern_show(args, data=None):
    r = subprocess.run([TERN_SHOW, *args], input=data, capture_output=True)
    return r.returncode, r.stdout, r.stderr.decode(errors="replace").strip()


# ---------------------------------------------------------------- comparing models

# Fields no text syntax carries: dropped from both sides before comparing.
UNTEXTUAL = {
    "NodeProto": {"doc_string"},
    "GraphProto": {"doc_string", "quantization_annotation"},
    "ValueInfoProto": {"doc_string"},
    "AttributeProto": {"doc_string"},
    "TypeProto": {"denotation"},
    "Dimension": {"denotation"},
}

# Element storage per data type, for comparing values bit for bit whatever field holds them.
STORAGE = {
    TensorProto.FLOAT: "<f4", TensorProto.UINT8: "<u1", TensorProto.INT8: "<i1", TensorProto.UINT16: "<u2",
    TensorProto.INT16: "<i2", TensorProto.INT32: "<i4", TensorProto.INT64: "<i8", TensorProto.BOOL: "<u1",
    TensorProto.FLOAT16: "<u2", TensorProto.DOUBLE: "<f8", TensorProto.UINT32: "<u4", TensorProto.UINT64: "<u8",
    TensorProto.COMPLEX64: "<f4", TensorProto.COMPLEX128: "<f8", TensorProto.BFLOAT16: "<u2",
    17: "<u1", 18: "<u1", 19: "<u1", 20: "<u1",
}
FIELD = {
    "<f4": "float_data", "<f8": "double_data", "<i8": "int64_data",
}


def tensor_values(t):
    if t.data_type == TensorProto.STRING:
        return list(t.string_data)
    dt = np.dtype(STORAGE.get(t.data_type, "<u1"))
    if t.HasField("raw_data"):
        a = np.frombuffer(t.raw_data, dt)
    elif t.data_type in (TensorProto.UINT32, TensorProto.UINT64):
        a = np.array(t.uint64_data, dtype=np.uint64).astype(dt)
    elif dt.str in FIELD:
        a = np.array(getattr(t, FIELD[dt.str]), dtype=dt)
    else:
        a = np.array(t.int32_data, dtype=np.int64).astype(dt)
    return a.tobytes()


def canon(msg, drop=UNTEXTUAL):
    """The message as nested dicts: unset and default fields left out, tensors as their values."""
    if isinstance(msg, TensorProto):
        out = {"data_type": msg.data_type, "dims": list(msg.dims)}
        if msg.name:
            out["name"] = msg.name
        if msg.data_location == TensorProto.EXTERNAL:
            out["external"] = [(e.key, e.value) for e in msg.external_data]
        else:
            out["values"] = tensor_values(msg)
        return out
    out = {}
    dropped = drop.get(msg.DESCRIPTOR.name, ())
    for f in msg.DESCRIPTOR.fields:
        if f.name in dropped:
            continue
        v = getattr(msg, f.name)
        if f.label == f.LABEL_REPEATED:
            if len(v) == 0:
                continue
            if f.type == f.TYPE_MESSAGE:
                out[f.name] = [canon(x, drop) for x in v]
            elif f.type == f.TYPE_FLOAT:
                out[f.name] = [struct.pack("<f", x) for x in v]
            else:
                out[f.name] = list(v)
        elif f.type == f.TYPE_MESSAGE:
            # An empty TypeProto says no more than a missing one, and the text has no form for it.
            if msg.HasField(f.name) and not (f.message_type.name == "TypeProto" and v.ByteSize() == 0):
                out[f.name] = canon(v, drop)
        elif f.containing_oneof is not None:
            if msg.HasField(f.name):
                out[f.name] = v
        elif f.type == f.TYPE_FLOAT:
            if struct.pack("<f", v) != struct.pack("<f", f.default_value):
                out[f.name] = struct.pack("<f", v)
        elif v != f.default_value:
            out[f.name] = v
    return out


def first_difference(a, b, path="model"):
    if type(a) is not type(b):
        return f"{path}: {a!r:.80} != {b!r:.80}"
    if isinstance(a, dict):
        for k in sorted(set(a) | set(b)):
            if k not in a or k not in b:
                return f"{path}.{k}: only on the {'left' if k in a else 'right'}"
            d = first_difference(a[k], b[k], f"{path}.{k}")
            if d:
                return d
        return None
    if isinstance(a, list):
        if len(a) != len(b):
            return f"{path}: {len(a)} items != {len(b)}"
        for i, (x, y) in enumerate(zip(a, b)):
            d = first_difference(x, y, f"{path}[{i}]")
            if d:
                return d
        return None
    return None if a == b else f"{path}: {a!r:.80} != {b!r:.80}"


def same_model(a, b, drop=UNTEXTUAL):
    return first_difference(canon(a, drop), canon(b, drop))


# ---------------------------------------------------------------- what onnx 1.14's syntax cannot say

def graphs_of(g):
    yield g
    for n in g.node:
        for a in n.attribute:
            if a.HasField("g"):
                yield from graphs_of(a.g)
            for s in a.graphs:
                yield from graphs_of(s)


def all_graphs(m):
    yield from graphs_of(m.graph)
    for f in m.functions:
        fg = helper.make_graph(f.node, f.name, [], [])
        yield from (g for g in graphs_of(fg) if g is not fg)
        yield fg


def special_float(x, tiny):
    return not np.isfinite(x) or (x != 0 and abs(x) < tiny)


def tensor_reason(t):
    if t.data_type in (TensorProto.FLOAT16, TensorProto.BFLOAT16, TensorProto.COMPLEX64, TensorProto.COMPLEX128,
                       17, 18, 19, 20):
        return "tensor types its reader lacks (float16, bfloat16, complex, float8)"
    if t.data_type in (TensorProto.FLOAT, TensorProto.DOUBLE):
        dt = np.float32 if t.data_type == TensorProto.FLOAT else np.float64
        a = np.frombuffer(tensor_values(t), dt)
        if any(special_float(x, np.finfo(dt).tiny) for x in a):
            return "inf, nan or subnormal values"
    if t.data_location == TensorProto.EXTERNAL:
        return "external data"
    return None


def dims_of(tp):
    which = tp.WhichOneof("value")
    if which in ("tensor_type", "sparse_tensor_type"):
        yield from getattr(tp, which).shape.dim
    elif which in ("sequence_type", "optional_type"):
        yield from dims_of(getattr(tp, which).elem_type)
    elif which == "map_type":
        yield from dims_of(tp.map_type.value_type)


def type_names(tp):
    return [d.dim_param for d in dims_of(tp) if d.HasField("dim_param")]


def outside_onnx_114(m):
    """What in this model onnx 1.14's syntax cannot say (a set of reasons, empty when none)."""
    reasons = set()
    tiny = np.finfo(np.float32).tiny
    for g in all_graphs(m):
        names = [g.name] + [t.name for t in g.initializer]
        for vi in list(g.input) + list(g.output) + list(g.value_info):
            names.append(vi.name)
            names.extend(type_names(vi.type))
        for t in g.initializer:
            reasons.add(tensor_reason(t))
        for n in g.node:
            if n.HasField("name"):
                reasons.add("node names")
            if (n.input and n.input[0] == "") or (n.output and n.output[0] == ""):
                reasons.add("an omitted first input or output")
            names += [x for x in list(n.input) + list(n.output) if x]
            for a in n.attribute:
                if a.type in (a.FLOATS, a.INTS, a.STRINGS) and not (a.floats or a.ints or a.strings):
                    reasons.add("empty list attributes")
                if a.type in (a.GRAPHS, a.TENSORS, a.TYPE_PROTOS, a.SPARSE_TENSOR, a.SPARSE_TENSORS):
                    reasons.add("attributes holding lists of graphs, tensors or types")
                if (a.type == a.FLOAT and special_float(a.f, tiny)) or any(special_float(x, tiny) for x in a.floats):
                    reasons.add("inf, nan or subnormal values")
                if a.HasField("t"):
                    reasons.add(tensor_reason(a.t))
                    if a.t.name:
                        names.append(a.t.name)
        if not all(IDENT.match(x) for x in names):
            reasons.add(UNREADABLE_NAMES)
    reasons.discard(None)
    return reasons


# ---------------------------------------------------------------- the checks

def number_free(text):
    """Text with every number rewritten as onnx's printer writes it (6 significant digits)."""
    def fmt(mo):
        s = mo.group(0)
        try:
            return "%g" % float(s)
        except ValueError:
            return s
    # Node names onnx 1.14 leaves out; a lone empty name it writes as no name at all.
    text = re.sub(r"(?m)^(\s*)\[[^\]]*\] ", r"\1", text).replace('("")', "()")
    return re.sub(r"-?(?:\d+\.?\d*(?:e[+-]?\d+)?|inf|nan)", fmt, text)


def initializers_as_constants(m):
    m = onnx.ModelProto.FromString(m.SerializeToString())
    for g in all_graphs(m):
        if not len(g.initializer):
            continue
        names = {t.name for t in g.initializer}
        constants = [helper.make_node("Constant", [], [t.name], value=t) for t in g.initializer]
        for c in constants:
            c.attribute[0].t.ClearField("name")
        kept = [vi for vi in g.input if vi.name not in names]
        del g.input[:]
        g.input.extend(kept)
        nodes = constants + list(g.node)
        del g.node[:]
        g.node.extend(nodes)
        del g.initializer[:]
    return m


def check_model(name, model_path, compare_layout=False):
    original = onnx.load(model_path)
    rc, text, err = tern_show(["-f", "text", "--weights", model_path])
    if rc == TERN_EDATA and model_path in err:
        # The loader refuses the binary model itself: a matter for the conformance suite, not the text.
        skip("tern refuses the binary model: " + err.split(": ")[-1])
        return None
    if not check(rc == 0, f"{name}: tern-show -f text --weights", err):
        return None
    text_s = text.decode()

    # tern reads its own text back into the same model, and prints it again the same way
    rc, binary, err = tern_show(["-f", "onnx", "-"], text)
    if check(rc == 0, f"{name}: tern reads its text", err):
        back = onnx.ModelProto()
        back.ParseFromString(binary)
        diff = same_model(original, back)
        check(diff is None, f"{name}: tern's text round trip", diff)
    rc, again, err = tern_show(["-f", "text", "--weights", "-"], text)
    check(rc == 0 and again == text, f"{name}: printing tern's text again gives the same text", err)

    # (a) onnx reads tern's text
    drop = dict(UNTEXTUAL, ModelProto={"training_info"})
    try:
        parsed = onnx.parser.parse_model(text_s)
    except Exception as e:  # onnx raises its own ParseError or a bare exception from C++
        reasons = outside_onnx_114(original)
        if reasons:
            skip(f"(a) onnx 1.14 cannot read {min(reasons)}")
        else:
            check(False, f"{name}: onnx.parser reads tern's text", str(e).splitlines()[-1][:200])
    else:
        diff = same_model(original, parsed, drop)
        check(diff is None, f"{name}: onnx.parser reads tern's text into the same model", diff)

    # (b) tern reads onnx's text. onnx 1.14 leaves initializers out of it, so they go in as Constant
    # nodes, which it does write.
    printable = initializers_as_constants(original)
    onnx_text = onnx.printer.to_text(printable)
    try:
        reference = onnx.parser.parse_model(onnx_text)
    except Exception:
        reference = None
        if UNREADABLE_NAMES in outside_onnx_114(printable):
            skip("(b) onnx 1.14 writes names that are not identifiers bare: nothing can read them")
            onnx_text = None
    if onnx_text is not None:
        rc, binary, err = tern_show(["-f", "onnx", "-"], onnx_text.encode())
        if rc != 0 and reference is not None:
            # onnx's text can change a model (a float attribute 2.0 written "2" reads back as an int)
            # into one tern refuses: then tern must refuse onnx's reading of it the same way.
            ref_rc, _, ref_err = tern_show(["-f", "onnx", "-"], reference.SerializeToString())
            check(ref_rc == rc and ref_err == err, f"{name}: tern reads onnx.printer's text", err)
        else:
            check(rc == 0, f"{name}: tern reads onnx.printer's text", err)
        if rc == 0 and reference is not None:
            mine = onnx.ModelProto()
            mine.ParseFromString(binary)
            diff = same_model(reference, mine, {})
            check(diff is None, f"{name}: tern reads onnx's text as onnx.parser does", diff)

    if compare_layout:
        check(number_free(text_s) == number_free(onnx_text + "\n"), f"{name}: layout is onnx.printer's")
    return original


# ---------------------------------------------------------------- models

def node_tests():
    paths = sorted(glob.glob(os.path.join(NODE_DATA, "*", "model.onnx")))
    refused = sum(check_model(os.path.basename(os.path.dirname(p)), p, compare_layout=True) is None for p in paths)
    check(refused * 50 <= len(paths), f"tern-show reads at least 98% of the node tests (refused {refused})")


def torch_models(tmp):
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            import torch
    except ImportError:
        skip("PyTorch exports: torch is not installed")
        return []
    torch.manual_seed(0)

    class ConvNet(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = torch.nn.Conv2d(3, 8, 3, padding=1)
            self.bn = torch.nn.BatchNorm2d(8)
            self.fc = torch.nn.Linear(8 * 4 * 4, 10)

        def forward(self, x):
            y = torch.nn.functional.max_pool2d(torch.relu(self.bn(self.conv(x))), 2)
            return torch.softmax(self.fc(y.flatten(1)), -1)

    class Recurrent(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = torch.nn.Embedding(50, 16)
            self.lstm = torch.nn.LSTM(16, 12, batch_first=True)
            self.head = torch.nn.Linear(12, 4)

        def forward(self, tokens):
            out, _ = self.lstm(self.embed(tokens))
            return self.head(out[:, -1])

    class Attention(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.attn = torch.nn.MultiheadAttention(16, 2, batch_first=True)
            self.norm = torch.nn.LayerNorm(16)

        def forward(self, x):
            y, _ = self.attn(x, x, x, need_weights=False)
            return self.norm(x + y)

    class Looping(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.randn(4, 4))

        def forward(self, x, n: int):
            for _ in range(n):
                x = torch.tanh(x @ self.w)
            if x.sum() > 0:
                x = x * 2.0
            return x

    models = [
        ("torch_convnet", ConvNet().eval(), (torch.randn(2, 3, 8, 8),), ["x"], {"x": {0: "batch"}}),
        ("torch_recurrent", Recurrent().eval(), (torch.randint(0, 50, (2, 7)),), ["tokens"],
         {"tokens": {0: "batch", 1: "time"}}),
        ("torch_attention", Attention().eval(), (torch.randn(2, 5, 16),), ["x"], {}),
        ("torch_looping", torch.jit.script(Looping()), (torch.randn(3, 4), 3), ["x", "n"], {}),
    ]
    paths = []
    for name, module, args, inputs, axes in models:
        path = os.path.join(tmp, name + ".onnx")
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()), \
                warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.onnx.export(module, args, path, opset_version=17, input_names=inputs, dynamic_axes=axes)
        paths.append((name, path))
    return paths


def rename_for_onnx_114(m):
    """The model with every name an identifier and no node names, which onnx 1.14's syntax can hold."""
    m = onnx.ModelProto.FromString(m.SerializeToString())
    names = {}

    def ident(s):
        if not s or IDENT.match(s):
            return s
        return names.setdefault(s, f"v{len(names)}")

    for g in all_graphs(m):
        g.name = ident(g.name) or "graph"
        for t in g.initializer:
            t.name = ident(t.name)
        for vi in list(g.input) + list(g.output) + list(g.value_info):
            vi.name = ident(vi.name)
            for d in dims_of(vi.type):
                if d.HasField("dim_param"):
                    d.dim_param = ident(d.dim_param)
        for n in g.node:
            n.ClearField("name")
            n.input[:] = [ident(x) for x in n.input]
            n.output[:] = [ident(x) for x in n.output]
    return m


def run_ort(model, feeds):
    import onnxruntime as ort
    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    session = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    return session.run(None, feeds)


def random_feeds(model):
    rng = np.random.default_rng(1)
    feeds = {}
    initializers = {t.name for t in model.graph.initializer}
    for vi in model.graph.input:
        if vi.name in initializers:
            continue
        tt = vi.type.tensor_type
        shape = [d.dim_value if d.HasField("dim_value") else 2 for d in tt.shape.dim]
        if tt.elem_type == TensorProto.FLOAT:
            feeds[vi.name] = rng.standard_normal(shape).astype(np.float32)
        else:
            feeds[vi.name] = rng.integers(0, 3 if not shape else 10, shape).astype(np.int64)
    return feeds


def torch_checks(tmp):
    for name, path in torch_models(tmp):
        original = check_model(name, path)
        if original is None:
            continue
        # (a) on the same weights in names onnx 1.14 can read, then the same outputs in onnxruntime
        renamed = rename_for_onnx_114(original)
        renamed_path = os.path.join(tmp, name + "-renamed.onnx")
        onnx.save(renamed, renamed_path)
        rc, text, err = tern_show(["-f", "text", "--weights", renamed_path])
        if not check(rc == 0, f"{name} renamed: tern-show", err):
            continue
        try:
            parsed = onnx.parser.parse_model(text.decode())
        except Exception as e:
            check(False, f"{name} renamed: onnx.parser reads tern's text", str(e).splitlines()[-1][:200])
            continue
        diff = same_model(renamed, parsed, dict(UNTEXTUAL, ModelProto={"training_info"}))
        check(diff is None, f"{name} renamed: onnx.parser reads tern's text into the same model", diff)
        feeds = random_feeds(renamed)
        want = run_ort(renamed, feeds)
        got = run_ort(parsed, feeds)
        check(all(np.array_equal(a, b) and a.dtype == b.dtype for a, b in zip(want, got)),
              f"{name}: onnxruntime outputs of onnx's reading of tern's text are the original's")


def tensor(name, dtype, dims, values, raw=False):
    return helper.make_tensor(name, dtype, dims, values, raw=raw)


def float_bits(values, dtype):
    return np.array(values, dtype=dtype)


def with_attributes(node, *attributes):
    node.attribute.extend(attributes)
    return node


def map_type(key, value):
    t = onnx.TypeProto()
    t.map_type.key_type = key
    t.map_type.value_type.CopyFrom(value)
    return t


def custom_node(then, orelse):
    """A node of another domain with an attribute of every kind, empty lists and omitted values."""
    node = helper.make_node(
        "Custom", ["x", "", "x", ""], ["", "c1", ""], domain="com.example", name="custom",
        i=-5, f=3.0, f_nan=float("nan"), s='text with "quotes" and \\',
        tp=helper.make_sequence_type_proto(helper.make_tensor_type_proto(TensorProto.INT64, ["K"])),
        tps=[helper.make_tensor_type_proto(TensorProto.FLOAT, None),
             map_type(TensorProto.STRING, helper.make_optional_type_proto(
                 helper.make_tensor_type_proto(TensorProto.DOUBLE, [])))],
        ts=[helper.make_tensor("a", TensorProto.INT32, [1], [1]), helper.make_tensor("", TensorProto.STRING, [], [b"s"])],
        gs=[then, orelse])
    for name, kind in (("empty_ints", onnx.AttributeProto.INTS), ("empty_floats", onnx.AttributeProto.FLOATS),
                       ("empty_strings", onnx.AttributeProto.STRINGS), ("empty_graphs", onnx.AttributeProto.GRAPHS)):
        node.attribute.add(name=name, type=kind)
    return node


def hand_built(tmp):
    """Models that exercise what node tests and exports leave out."""
    f32 = float_bits([np.inf, -np.inf, np.nan, -0.0, 1e-45, 3.4028235e38, 0.1, -1.5e-39], np.float32)
    f64 = float_bits([np.inf, np.nan, -0.0, 5e-324, 1.7976931348623157e308, 0.1], np.float64)
    f16 = np.array([0.5, -2.0, 65504.0, np.inf, np.nan, 6e-8], dtype=np.float16)
    initializers = [
        tensor("f32_raw", TensorProto.FLOAT, [8], f32.tobytes(), raw=True),
        helper.make_tensor("f32_field", TensorProto.FLOAT, [2, 4], f32.tolist()),
        tensor("f64_raw", TensorProto.DOUBLE, [6], f64.tobytes(), raw=True),
        helper.make_tensor("f64_field", TensorProto.DOUBLE, [6], f64.tolist()),
        tensor("f16_raw", TensorProto.FLOAT16, [6], f16.tobytes(), raw=True),
        helper.make_tensor("f16_field", TensorProto.FLOAT16, [6], f16.tolist()),
        helper.make_tensor("bf16", TensorProto.BFLOAT16, [2], [1.0, -np.inf]),
        tensor("i8_raw", TensorProto.INT8, [3], np.array([-128, 0, 127], np.int8).tobytes(), raw=True),
        tensor("u8_raw", TensorProto.UINT8, [2], np.array([0, 255], np.uint8).tobytes(), raw=True),
        helper.make_tensor("i16", TensorProto.INT16, [2], [-32768, 32767]),
        tensor("u16_raw", TensorProto.UINT16, [2], np.array([0, 65535], np.uint16).tobytes(), raw=True),
        helper.make_tensor("i32", TensorProto.INT32, [2], [-2147483648, 2147483647]),
        tensor("i64_raw", TensorProto.INT64, [2], np.array([-2**63, 2**63 - 1], np.int64).tobytes(), raw=True),
        helper.make_tensor("u32", TensorProto.UINT32, [2], [0, 4294967295]),
        tensor("u64_raw", TensorProto.UINT64, [2], np.array([0, 2**64 - 1], np.uint64).tobytes(), raw=True),
        helper.make_tensor("flags", TensorProto.BOOL, [3], [True, False, True]),
        helper.make_tensor("words", TensorProto.STRING, [3], [b'say "hi"', b"back\\slash", b"two\nlines"]),
        helper.make_tensor("c64", TensorProto.COMPLEX64, [2], [1 + 2j, -0.5j]),
        helper.make_tensor("scalar", TensorProto.FLOAT, [], [2.5]),
        helper.make_tensor("empty", TensorProto.FLOAT, [0, 3], []),
        helper.make_tensor("odd name.with/chars", TensorProto.INT64, [1], [7]),
    ]
    then = helper.make_graph([helper.make_node("Identity", ["x"], ["t"])], "then_branch", [],
                             [helper.make_tensor_value_info("t", TensorProto.FLOAT, ["N", 4])])
    orelse = helper.make_graph([helper.make_node("Neg", ["x"], ["e"])], "float", [],
                               [helper.make_tensor_value_info("e", TensorProto.FLOAT, ["N", 4])])
    body = helper.make_graph(
        [helper.make_node("Add", ["acc", "x_t"], ["acc_out"]), helper.make_node("Identity", ["acc_out"], ["y_t"])],
        "", [helper.make_tensor_value_info("acc", TensorProto.FLOAT, [4]),
             helper.make_tensor_value_info("x_t", TensorProto.FLOAT, [4])],
        [helper.make_tensor_value_info("acc_out", TensorProto.FLOAT, [4]),
         helper.make_tensor_value_info("y_t", TensorProto.FLOAT, [4])])
    nodes = [
        helper.make_node("If", ["cond"], ["branch"], name="choose", then_branch=then, else_branch=orelse),
        helper.make_node("Scan", ["zeros", "x"], ["sum", "scanned"], name='scan "quoted"', body=body,
                         num_scan_inputs=1),
        helper.make_node("Constant", [], ["const"], value=helper.make_tensor("", TensorProto.FLOAT, [2], [1, 2])),
        helper.make_node("Constant", [], ["floats"], value_floats=[1.0, -0.0, 2.5, np.inf]),
        helper.make_node("Constant", [], ["strs"], value_strings=["a", 'b"c']),
        custom_node(then, orelse),
        helper.make_node("Square", ["x"], ["squared"], domain="local.fns"),
        helper.make_node("Weird", ["x"], ["w_out"], domain="my-domain.v2", name=""),
    ]
    graph = helper.make_graph(
        nodes, "kitchen sink",
        [helper.make_tensor_value_info("cond", TensorProto.BOOL, []),
         helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4]),
         helper.make_tensor_value_info("zeros", TensorProto.FLOAT, [4]),
         helper.make_value_info("untyped", onnx.TypeProto()),
         helper.make_tensor_value_info("any_rank", TensorProto.FLOAT, None),
         helper.make_tensor_value_info("unknown_dim", TensorProto.FLOAT, [None, "M", 3]),
         helper.make_value_info("float", onnx.TypeProto()),
         helper.make_value_info("seq", helper.make_sequence_type_proto(
             helper.make_tensor_type_proto(TensorProto.FLOAT, ["N"]))),
         helper.make_value_info("sparse", helper.make_sparse_tensor_type_proto(TensorProto.FLOAT, [3, 3]))],
        [helper.make_tensor_value_info("branch", TensorProto.FLOAT, ["N", 4]),
         helper.make_tensor_value_info("sum", TensorProto.FLOAT, [4])],
        initializers,
        value_info=[helper.make_tensor_value_info("squared", TensorProto.FLOAT, ["N", 4])])
    square = helper.make_function(
        "local.fns", "Square", ["X"], ["Y"],
        [helper.make_node("Mul", ["X", "X"], ["Y"]),
         with_attributes(helper.make_node("LeakyRelu", ["Y"], ["Z"]),
                         onnx.AttributeProto(name="alpha", ref_attr_name="alpha", type=onnx.AttributeProto.FLOAT))],
        [helper.make_opsetid("", 17)], attributes=["alpha"])
    square.doc_string = "squares\nits input"
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.example", 1),
                                                    helper.make_opsetid("local.fns", 1),
                                                    helper.make_opsetid("my-domain.v2", 1)],
                              functions=[square], producer_name="text-compat", producer_version="1",
                              domain="org.example", model_version=3, doc_string='a "model"\nwith doc')
    helper.set_model_props(model, {"tern.schedule": "stream 0: a b\nstream 1: c", "key \"q\"": "v\\"})
    training = onnx.TrainingInfoProto()
    training.algorithm.CopyFrom(helper.make_graph(
        [helper.make_node("Sub", ["w", "g"], ["w_new"])], "step",
        [helper.make_tensor_value_info("g", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("w_new", TensorProto.FLOAT, [2])],
        [helper.make_tensor("w", TensorProto.FLOAT, [2], [0.25, 0.75])]))
    training.initialization.CopyFrom(helper.make_graph(
        [helper.make_node("Constant", [], ["w_init"], value_float=0.0)], "init", [],
        [helper.make_tensor_value_info("w_init", TensorProto.FLOAT, [])]))
    training.update_binding.add(key="w", value="w_new")
    training.initialization_binding.add(key="w", value="w_init")
    model.training_info.append(training)
    kitchen = os.path.join(tmp, "kitchen_sink.onnx")
    onnx.save(model, kitchen)

    # What onnx 1.14's syntax can say, with each kind of value it reads.
    plain = helper.make_graph(
        [helper.make_node("Add", ["x", "w"], ["y"]),
         helper.make_node("Loop", ["trip", "keep", "y"], ["out"], body=helper.make_graph(
             [helper.make_node("Identity", ["c"], ["c_out"]), helper.make_node("Mul", ["v", "w"], ["v_out"])],
             "loop_body", [helper.make_tensor_value_info("i", TensorProto.INT64, []),
                           helper.make_tensor_value_info("c", TensorProto.BOOL, []),
                           helper.make_tensor_value_info("v", TensorProto.FLOAT, ["N"])],
             [helper.make_tensor_value_info("c_out", TensorProto.BOOL, []),
              helper.make_tensor_value_info("v_out", TensorProto.FLOAT, ["N"])])),
         helper.make_node("Constant", [], ["k"], value=helper.make_tensor("kt", TensorProto.INT64, [2], [3, -4])),
         helper.make_node("LeakyRelu", ["out"], ["z"], alpha=2.0),
         helper.make_node("Twice", ["z"], ["twice"], domain="local", scale=3)],
        "plain",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N"]),
         helper.make_tensor_value_info("trip", TensorProto.INT64, []),
         helper.make_tensor_value_info("keep", TensorProto.BOOL, [])],
        [helper.make_tensor_value_info("twice", TensorProto.FLOAT, ["N"])],
        [helper.make_tensor("w", TensorProto.FLOAT, [1], [0.1]),
         tensor("d", TensorProto.DOUBLE, [2], np.array([0.1, -1e300]).tobytes(), raw=True),
         helper.make_tensor("i8", TensorProto.INT8, [2], [-3, 4]),
         helper.make_tensor("u64", TensorProto.UINT64, [1], [2**64 - 1]),
         helper.make_tensor("names", TensorProto.STRING, [2], [b"a b", b'q"'])])
    twice = helper.make_function(
        "local", "Twice", ["X"], ["Y"],
        [with_attributes(helper.make_node("Constant", [], ["s"]),
                         onnx.AttributeProto(name="value_float", ref_attr_name="scale",
                                             type=onnx.AttributeProto.FLOAT)),
         helper.make_node("Mul", ["X", "s"], ["Y"])],
        [helper.make_opsetid("", 17)], attributes=["scale"])
    plain_model = helper.make_model(plain, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("local", 1)],
                                    functions=[twice], producer_name="text-compat")
    helper.set_model_props(plain_model, {"tern.partition": "rank 0"})
    # onnx reads the training_info lines as comments, tern reads them
    plain_model.training_info.append(training)
    plain_path = os.path.join(tmp, "onnx_114_syntax.onnx")
    onnx.save(plain_model, plain_path)
    return [("kitchen_sink", kitchen), ("onnx_114_syntax", plain_path)]


def hand_built_checks(tmp):
    for name, path in hand_built(tmp):
        check_model(name, path)
    # Without weights a large tensor is elided, and reading that text back is refused, naming the place.
    big = helper.make_model(helper.make_graph(
        [helper.make_node("Identity", ["w"], ["y"])], "g", [],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [100])],
        [helper.make_tensor("w", TensorProto.FLOAT, [100], np.arange(100, dtype=np.float32))]))
    big_path = os.path.join(tmp, "big.onnx")
    onnx.save(big, big_path)
    rc, text, err = tern_show(["-f", "text", big_path])
    check(rc == 0 and b"float[100] w = ...," not in text and b"float[100] w = ..." in text,
          "without --weights a 100-element initializer is elided", text.decode()[:300])
    rc, _, err = tern_show(["-f", "onnx", "-"], text)
    check(rc == 65 and re.search(r"line \d+, column \d+", err) and "without weights" in err,
          "reading elided text fails with line and column", err)


def main():
    with tempfile.TemporaryDirectory() as tmp:
        hand_built_checks(tmp)
        torch_checks(tmp)
        node_tests()
    for reason, n in sorted(skipped.items()):
        print(f"skipped {n}: {reason}")
    print(f"{passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
