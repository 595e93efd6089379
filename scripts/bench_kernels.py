#!/usr/bin/env python3
"""Per-kernel report: each hot kernel class as a one-node graph, run by tern-run on every
instruction-set path the machine has (TERN_ISA) and by onnxruntime, with GFLOP/s (GB/s for the
memory-bound classes) and the fraction of that path's peak on this machine.

Peaks come from tests/bench/isa_peak (built with tern): independent multiply-adds on one thread for
GFLOP/s, y += x over arrays in the first cache for GB/s, each on the path's own vector width. The
onnxruntime column runs on whatever its own dispatch picks (it has no cap), so it is a time to read
beside tern's, not a fraction of one path. A class is "within 10 %" when its fraction of the lower
path's peak is at least 0.9 times its fraction of the top path's.

Every graph's outputs are compared with onnxruntime's first (bench.py's parity bound). Measurements
alternate between the runners over --rounds rounds, each a fresh process; a time is the median over
rounds of each round's median, at one thread.

Usage: .venv/bin/python scripts/bench_kernels.py [--kernels a,b] [--rounds R] [--quick] [--json FILE]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

import bench

import numpy as np
import onnx
from onnx import TensorProto, helper

PATHS = ["avx512", "avx2", "generic"]
# oneDNN's own cap for the same instruction sets
DNNL_ISA = {"avx512": "AVX512_CORE", "avx2": "AVX2", "generic": "SSE41"}


def conv(name, c, h, w, m, k, stride=1, group=1, pad=None, optimize=False):
    pad = k // 2 if pad is None else pad
    ho, wo = (h + 2 * pad - k) // stride + 1, (w + 2 * pad - k) // stride + 1
    rng = np.random.default_rng(0)
    wt = rng.standard_normal((m, c // group, k, k), dtype=np.float32) * 0.1
    bias = rng.standard_normal(m, dtype=np.float32) * 0.1
    node = helper.make_node("Conv", ["x", "w", "b"], ["y"], kernel_shape=[k, k], strides=[stride, stride],
                            pads=[pad] * 4, group=group)
    graph = helper.make_graph([node], name, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, c, h, w])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, m, ho, wo])],
                              [onnx.numpy_helper.from_array(wt, "w"), onnx.numpy_helper.from_array(bias, "b")])
    flops = 2.0 * m * ho * wo * (c // group) * k * k
    return graph, {"x": (1, c, h, w)}, flops, None, [c, h, w, m, k, stride, group, pad]


def dnnl_measure(exe, shape, path, iters):
    """oneDNN's time for a convolution on one path: the primitive alone (activations kept in its blocked
    layout) and with the reorders from and to NCHW, as tests/bench/dnnl_conv reports them."""
    env = {k: v for k, v in bench.child_env().items() if k != "TERN_ISA"}
    env.update(OMP_NUM_THREADS="1", DNNL_MAX_CPU_ISA=DNNL_ISA[path])
    p = subprocess.run([exe, *map(str, shape), str(iters)], capture_output=True, text=True, env=env)
    if p.returncode != 0:
        raise bench.BenchError(f"dnnl_conv exit {p.returncode}: {p.stderr.strip()}")
    return json.loads(p.stdout)


def chain(name, c, h, w, m, k, count):
    """count convolutions with Relu, c > m > c > ... channels at h x w, the kind of run tern-optimize -O2
    lays out in blocks of 16 channels (tern.BlockedConv): it keeps a run with at most one layout conversion
    per four convolutions, so eight convolutions between the two conversions."""
    rng = np.random.default_rng(0)
    nodes, inits, flops, prev, chans = [], [], 0.0, "x", c
    for i in range(count):
        out = m if i % 2 == 0 else c
        wt = rng.standard_normal((out, chans, k, k), dtype=np.float32) * (1.0 / np.sqrt(chans * k * k))
        inits += [onnx.numpy_helper.from_array(wt, f"w{i}"),
                  onnx.numpy_helper.from_array(np.full(out, 0.01, np.float32), f"b{i}")]
        nodes += [helper.make_node("Conv", [prev, f"w{i}", f"b{i}"], [f"c{i}"], kernel_shape=[k, k], pads=[k // 2] * 4),
                  helper.make_node("Relu", [f"c{i}"], [f"r{i}" if i < count - 1 else "y"])]
        flops += 2.0 * out * h * w * chans * k * k
        prev, chans = f"r{i}", out
    graph = helper.make_graph(nodes, name, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, c, h, w])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, chans, h, w])], inits)
    return graph, {"x": (1, c, h, w)}, flops, None, None


def pool(name, op, c, h, w, k=0, stride=1):
    if op == "GlobalAveragePool":
        node, out = helper.make_node(op, ["x"], ["y"]), [1, c, 1, 1]
    else:
        ho = (h + 2 * (k // 2) - k) // stride + 1
        node = helper.make_node(op, ["x"], ["y"], kernel_shape=[k, k], strides=[stride, stride], pads=[k // 2] * 4)
        out = [1, c, ho, ho]
    graph = helper.make_graph([node], name, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, c, h, w])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, out)])
    return graph, {"x": (1, c, h, w)}, None, 4.0 * (c * h * w + np.prod(out)), None


def matmul(name, m, k, n):
    rng = np.random.default_rng(0)
    wt = rng.standard_normal((k, n), dtype=np.float32) * 0.1
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], name,
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, m, k])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, m, n])],
                              [onnx.numpy_helper.from_array(wt, "w")])
    return graph, {"x": (1, m, k)}, 2.0 * m * k * n, None, None


# Floating-point operations of x * sigmoid(x) an element as tern evaluates it (lib/ops/sigmoid.c): the
# exponential's range reduction (5) and degree-6 polynomial (6 multiply-adds, 12), its scaling, 1 + e,
# the reciprocal estimate and its Newton step (6), the negative side's product and the final product.
SWISH_FLOPS = 26.0


def swish(name, c, h, w):
    """x * sigmoid(x): tern-optimize makes it one fused elementwise program, one pass a block. Its time
    an element is the same with the data in the first cache as with 144 x 56 x 56 floats, on either
    path: bound by arithmetic, not memory, so it is counted in GFLOP/s."""
    nodes = [helper.make_node("Sigmoid", ["x"], ["s"]), helper.make_node("Mul", ["x", "s"], ["y"])]
    shape = [1, c, h, w]
    graph = helper.make_graph(nodes, name, [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)])
    return graph, {"x": tuple(shape)}, SWISH_FLOPS * c * h * w, None, None


def attention(name, s, heads, d):
    """softmax(Q K^T / sqrt(d)) V over heads, the pattern tern-optimize fuses into tern.Attention."""
    shape = [1, heads, s, d]
    scale = helper.make_tensor("scale", TensorProto.FLOAT, [], [1.0 / np.sqrt(d)])
    nodes = [helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 1, 3, 2]),
             helper.make_node("MatMul", ["q", "kt"], ["qk"]),
             helper.make_node("Mul", ["qk", "scale"], ["scores"]),
             helper.make_node("Softmax", ["scores"], ["p"], axis=-1),
             helper.make_node("MatMul", ["p", "v"], ["y"])]
    graph = helper.make_graph(nodes, name, [helper.make_tensor_value_info(n, TensorProto.FLOAT, shape) for n in "qkv"],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)], [scale])
    return graph, {n: tuple(shape) for n in "qkv"}, 4.0 * heads * s * s * d, None, None


# name -> (builder, arguments, run through tern-optimize -O2 first[, tern-run's environment]). The blocked
# 3 x 3 chains run as Winograd's F(2 x 2, 3 x 3) (tern-run(1), TERN_WINOGRAD); their rate counts the
# direct convolution's multiply-adds, so it can pass the peak. The "direct" rows run the direct kernel.
DIRECT = {"TERN_WINOGRAD": "0"}
KERNELS = {
    "conv1x1 96>24 56x56": (conv, (96, 56, 56, 24, 1), False),
    "conv1x1 256>64 56x56": (conv, (256, 56, 56, 64, 1), False),
    "conv3x3 64>64 56x56": (conv, (64, 56, 56, 64, 3), False),
    "conv3x3 256>256 14x14": (conv, (256, 14, 14, 256, 3), False),
    "stem 3x3s2 3>32 224x224": (conv, (3, 224, 224, 32, 3, 2), False),
    "stem 7x7s2 3>64 224x224": (conv, (3, 224, 224, 64, 7, 2), False),
    "blocked conv1x1 64<>256 56x56 x8": (chain, (64, 56, 56, 256, 1, 8), True),
    "blocked conv3x3 64>64 56x56 x8": (chain, (64, 56, 56, 64, 3, 8), True),
    "blocked conv3x3 256>256 14x14 x8": (chain, (256, 14, 14, 256, 3, 8), True),
    "blocked conv3x3 64>64 56x56 x8 direct": (chain, (64, 56, 56, 64, 3, 8), True, DIRECT),
    "blocked conv3x3 256>256 14x14 x8 direct": (chain, (256, 14, 14, 256, 3, 8), True, DIRECT),
    "depthwise 3x3 144 56x56": (conv, (144, 56, 56, 144, 3, 1, 144), False),
    "depthwise 3x3s2 96 112x112": (conv, (96, 112, 112, 96, 3, 2, 96), False),
    "depthwise 5x5 240 28x28": (conv, (240, 28, 28, 240, 5, 1, 240), False),
    "depthwise 3x3 576 7x7": (conv, (576, 7, 7, 576, 3, 1, 576), False),
    "grouped 3x3 g13 104 28x28": (conv, (104, 28, 28, 104, 3, 1, 13), False),
    "gemm 32x192 * 192x768": (matmul, (32, 192, 768), False),
    "gemm 32x768 * 768x192": (matmul, (32, 768, 192), False),
    "maxpool 3x3s2 64 112x112": (pool, ("MaxPool", 64, 112, 112, 3, 2), False),
    "avgpool global 1280 7x7": (pool, ("GlobalAveragePool", 1280, 7, 7), False),
    "fused swish 144 56x56": (swish, (144, 56, 56), True),
    "attention 32x4x48": (attention, (32, 4, 48), True),
}


def machine_paths(peak_exe):
    """{path: {"gflops", "gbps"}} for the paths this machine has (TERN_ISA unset)."""
    env = {k: v for k, v in os.environ.items() if k != "TERN_ISA"}
    out = subprocess.run([peak_exe], capture_output=True, text=True, check=True, env=env).stdout
    return json.loads(out)


def main():
    ap = argparse.ArgumentParser(description="Per-kernel GFLOP/s and fraction of peak on every instruction-set path.")
    build = os.environ.get("TERN_BUILD", "build")
    ap.add_argument("--kernels", type=bench.parse_list, default=list(KERNELS), help="comma-separated names")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--target", type=float, default=0.5, help="seconds of timed runs per measurement")
    ap.add_argument("--quick", action="store_true", help="2 rounds of about 0.2 s: a smoke test")
    ap.add_argument("--json", metavar="FILE")
    ap.add_argument("--tern-run", default=os.path.join(build, "bin", "tern-run"))
    ap.add_argument("--tern-optimize", default=os.path.join(build, "bin", "tern-optimize"))
    ap.add_argument("--isa-peak", default=os.path.join(build, "tests", "bench", "isa_peak"))
    ap.add_argument("--dnnl-conv", default=os.path.join(build, "tests", "bench", "dnnl_conv"),
                    help="oneDNN's convolutions beside tern's (built where libdnnl-dev is installed)")
    ap.add_argument("--ort-python", default=bench.BENCH_PYTHON if os.access(bench.BENCH_PYTHON, os.X_OK) else sys.executable)
    opt = ap.parse_args()
    if opt.quick:
        opt.rounds, opt.target = 2, 0.2
    for k in opt.kernels:
        if k not in KERNELS:
            sys.exit(f"bench_kernels: unknown kernel {k!r} (known: {', '.join(KERNELS)})")
    bench.ORT_PYTHON = opt.ort_python
    peaks = machine_paths(opt.isa_peak)
    paths = [p for p in PATHS if p in peaks]
    info = bench.machine()
    info["versions"] = bench.versions(opt.tern_run)
    info["peaks"] = peaks
    rows = []
    with tempfile.TemporaryDirectory(prefix="tern-kernels.") as work:
        for name in opt.kernels:
            builder, args, fuse, *env = KERNELS[name]
            bench.TERN_ENV = env[0] if env else {}
            # dnnl_shape: the convolution's arguments for tests/bench/dnnl_conv (None: not a convolution)
            graph, shapes, flops, nbytes, dnnl_shape = builder(name.replace(" ", "_"), *args)
            model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
            model.ir_version = 8
            path = os.path.join(work, "k.onnx")
            onnx.save(model, path)
            tern_path = path
            if fuse:
                tern_path = os.path.join(work, "k.opt.onnx")
                bench.run_process([opt.tern_optimize, "-O2", "-o", tern_path, path])
            rng = np.random.default_rng(1)
            inputs = {}
            for n, shape in shapes.items():
                inputs[n] = os.path.join(work, n + ".npy")
                np.save(inputs[n], rng.standard_normal(shape, dtype=np.float32))
            # parity on every path first, then a latency estimate that sizes the runs
            ort_dir = os.path.join(work, "ort")
            os.makedirs(ort_dir, exist_ok=True)
            est = bench.child_measure("ort", path, inputs, 1, 3, 1, out_dir=ort_dir)["ms"]
            for p in paths:
                bench.TERN_ISA = p
                d = os.path.join(work, "tern-" + p)
                os.makedirs(d, exist_ok=True)
                bench.tern_measure(opt.tern_run, tern_path, inputs, 1, 1, 0, out_dir=d)
                ratio, problem = bench.compare_outputs(ort_dir, d)
                if problem:
                    sys.exit(f"bench_kernels: {name} on {p}: outputs differ from onnxruntime's: {problem}")
            iters, warmup = bench.iterations(est, opt.target)

            def tern_runner(p):
                def run():
                    bench.TERN_ISA = p
                    return bench.tern_measure(opt.tern_run, tern_path, inputs, 1, iters, warmup)
                return run

            runners = {p: (tern_runner(p), opt.rounds) for p in paths}
            runners["ort"] = (lambda: bench.child_measure("ort", path, inputs, 1, iters, warmup), opt.rounds)
            if dnnl_shape and os.access(opt.dnnl_conv, os.X_OK):
                for p in paths:
                    runners["dnnl-" + p] = ((lambda p=p: dnnl_measure(opt.dnnl_conv, dnnl_shape, p, iters)), opt.rounds)
            bench.log(f"bench_kernels: {name}")
            measured = bench.alternate(runners, opt.rounds)
            res = {k: bench.summary(v)["ms"] for k, v in measured.items() if not k.startswith("dnnl-")}
            row = {"kernel": name, "ms": res, "flops": flops, "bytes": nbytes}
            dnnl = {k[5:]: v for k, v in measured.items() if k.startswith("dnnl-")}
            if dnnl:
                row["dnnl"] = {p: {"ms": statistics.median(r["ms"] for r in v),
                                   "edge_ms": statistics.median(r["edge_ms"] for r in v),
                                   "layout": v[0]["src_layout"], "impl": v[0]["impl"]} for p, v in dnnl.items()}
            for p in paths:
                if flops:
                    rate = flops / (res[p] * 1e-3) * 1e-9
                    row.setdefault("gflops", {})[p] = rate
                    row.setdefault("fraction", {})[p] = rate / peaks[p]["gflops"]
                else:
                    rate = nbytes / (res[p] * 1e-3) * 1e-9
                    row.setdefault("gbps", {})[p] = rate
                    row.setdefault("fraction", {})[p] = rate / peaks[p]["gbps"]
            rows.append(row)
    bench.TERN_ISA = None
    bench.TERN_ENV = {}
    info["load_average_end"] = os.getloadavg()

    def markdown():
        out = [*bench.header_lines(info),
               "Versions: " + ", ".join(f"{k} {v}" for k, v in info["versions"].items()) + ".",
               "Peaks (one thread): " + "; ".join(f"{p} {peaks[p]['gflops']:.1f} GFLOP/s, {peaks[p]['gbps']:.1f} GB/s"
                                                  for p in paths) + ".", ""]
        header = ["kernel", "unit"] + [f"{p} rate" for p in paths] + [f"{p} of peak" for p in paths]
        header += [f"{p} ms" for p in paths] + ["ort ms", " / ".join(paths[1:]) + f" fraction ÷ {paths[0]}'s"]
        table = []
        for r in rows:
            unit = "GFLOP/s" if r["flops"] else "GB/s"
            rates = r.get("gflops") or r.get("gbps")
            fr = r["fraction"]
            rel = [fr[p] / fr[paths[0]] for p in paths[1:]]
            table.append([r["kernel"], unit] + [bench.fmt(rates[p], 1) for p in paths]
                         + [bench.fmt(fr[p], 3) for p in paths] + [bench.fmt(r["ms"][p], 4) for p in paths]
                         + [bench.fmt(r["ms"]["ort"], 4)] + [" / ".join(bench.fmt(x, 2) for x in rel) or "—"])
        out.append(bench.markdown_table(header, table))
        if len(paths) > 1:
            lo = paths[1]
            low = [r["kernel"] for r in rows if r["fraction"][lo] < 0.9 * r["fraction"][paths[0]]]
            out += ["", f"- {lo} within 10 % of {paths[0]}'s fraction of peak on every class: "
                    + ("met" if not low else "NOT met: " + ", ".join(low))]
        with_dnnl = [r for r in rows if "dnnl" in r]
        if with_dnnl:
            out += ["", "oneDNN (tests/bench/dnnl_conv, oneDNN's own choice of layout and kernel, DNNL_MAX_CPU_ISA per "
                    "path) against tern, ms: \"alone\" keeps activations in oneDNN's layout between convolutions, "
                    "\"edges\" adds the reorders from and to NCHW that a graph pays where it enters and leaves "
                    "oneDNN; ratio = tern / oneDNN alone.", ""]
            header = ["kernel"] + [f"{p} {x}" for p in paths for x in ("tern", "dnnl alone", "dnnl edges", "ratio")]
            header.append(f"{paths[0]} dnnl kernel")
            table = []
            for r in with_dnnl:
                d = r["dnnl"]
                cells = []
                for p in paths:
                    cells += [bench.fmt(r["ms"][p], 4), bench.fmt(d[p]["ms"], 4), bench.fmt(d[p]["edge_ms"], 4),
                              bench.fmt(r["ms"][p] / d[p]["ms"], 2)]
                table.append([r["kernel"]] + cells + [f"{d[paths[0]]['impl']} ({d[paths[0]]['layout']})"])
            out.append(bench.markdown_table(header, table))
        return "\n".join(out)

    bench.write_results(opt.json, {"machine": info, "kernels": rows}, markdown)
    return 0


if __name__ == "__main__":
    sys.exit(main())
