#!/usr/bin/env python3
"""Latency and memory of tern-run against onnxruntime and PyTorch eager on the same models and inputs.

Per model and thread count, measurements alternate between the runners in rounds (the order rotates
each round); every measurement is a fresh process that loads the model, runs W untimed and N timed
iterations, and exits. A runner's latency is the median over rounds of each round's median; its memory
is the largest peak RSS (ru_maxrss of the whole process, read by this script with wait4) over the
rounds. "net MB" subtracts the same runner's peak RSS on a one-node graph, i.e. what the runtime
itself (and, for onnxruntime, the Python interpreter and its imports) costs before any model.

onnxruntime: CPUExecutionProvider, intra_op_num_threads=T, inter_op_num_threads=1, sequential
execution, graph optimisation level ORT_ENABLE_ALL (its default). PyTorch: torch.set_num_threads(T),
torch.no_grad(), the torchvision/nn modules with the very weights the ONNX files were exported with.
Once per model the three runners' outputs are compared (parity tolerance: 1e-4 * max|ort| + 1e-5).

The overhead micro-benchmark runs a chain of 1,000 elementwise nodes (Add of a constant and Relu,
alternating) on a 16-element float tensor and a one-node graph; nanoseconds per node are
(t(chain) - t(one node)) / 999, so the fixed cost of a call is left out for both runtimes.

OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE are removed from the children's environment.

Usage: .venv/bin/python scripts/bench.py [--models a,b] [--threads 1,2] [--rounds R] [--iters N]
                                         [--quick] [--no-torch] [--optimize] [--json FILE]
tern-run is $TERN_BUILD/bin/tern-run (TERN_BUILD defaults to build); models are exported on first
use into $TERN_BUILD/tests/models/cache, as the models test suite does.
"""
import argparse
import datetime
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time

SCRIPTS = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, SCRIPTS)
sys.path.insert(0, os.path.join(SCRIPTS, "..", "tests", "models"))

DEFAULT_MODELS = ["resnet50", "mobilenet_v2", "inception_v3", "efficientnet_b0", "googlenet",
                  "transformer_encoder", "lstm_lm", "mnasnet", "mobilenet_v3_small", "squeezenet",
                  "regnet_y_400mf", "resnet18", "shufflenet_v2", "transformer_d192", "gru_lm"]
# onnxruntime is measured in this interpreter when it exists: scripts/setup.sh --bench puts the newest
# release from PyPI there (the test suite's .venv keeps the pinned one its conformance data needs).
BENCH_PYTHON = os.path.join(SCRIPTS, "..", ".venv-bench", "bin", "python")
CHAIN_NODES = 1000
AS_GIVEN = ("--optimize", "0")  # tern-run without its in-memory rewrite
CHAIN_SIZE = 16
DROPPED_ENV = ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")


class BenchError(Exception):
    pass


# ---------------------------------------------------------------- processes


TERN_ISA = None  # --isa: the instruction-set cap tern-run runs under
TERN_ENV = {}  # more environment for tern-run (bench_kernels: TERN_WINOGRAD=0 for the direct kernel)
ORT_PYTHON = sys.executable  # --ort-python


def child_env():
    env = dict(os.environ)
    for k in DROPPED_ENV:
        env.pop(k, None)
    if TERN_ISA:
        env["TERN_ISA"] = TERN_ISA
    env.update(TERN_ENV)
    return env


# A forked child's ru_maxrss starts at its parent's RSS at the fork and keeps it across exec, so the
# measured processes are started by a small launcher: GNU time where installed, else a bare Python
# whose own RSS (about 10 MB) is then the floor of every figure.
LAUNCHER = (["/usr/bin/time", "-f", "%M %U %S %e", "-o"] if os.access("/usr/bin/time", os.X_OK) else
            [sys.executable, "-S", "-E", "-c",
             "import os, subprocess, sys, time\n"
             "t = time.monotonic()\n"
             "p = subprocess.Popen(sys.argv[2:])\n"
             "_, status, ru = os.wait4(p.pid, 0)\n"
             "with open(sys.argv[1], 'w') as f:\n"
             "    print(ru.ru_maxrss, ru.ru_utime, ru.ru_stime, time.monotonic() - t, file=f)\n"
             "sys.exit(os.waitstatus_to_exitcode(status))\n"])


def run_process(cmd):
    """Runs cmd to completion; returns (stdout, peak RSS in MB, CPU seconds, wall seconds) of that
    process alone."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err, \
            tempfile.NamedTemporaryFile("r") as usage:
        p = subprocess.run([*LAUNCHER, usage.name, *cmd], stdout=out, stderr=err, env=child_env())
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read().decode(), err.read().decode(errors="replace")
        fields = usage.read().split()
    if p.returncode != 0:
        lines = stderr.strip().splitlines()
        raise BenchError(f"{os.path.basename(cmd[0])} exit {p.returncode}: {lines[-1] if lines else '(no message)'}")
    maxrss_kb, user, system, wall = (float(x) for x in fields[-4:])
    return stdout, maxrss_kb / 1024.0, user + system, wall


def tern_measure(tern_run, model, inputs, threads, iters, warmup, extra=(), out_dir=None):
    """One tern-run process; returns {"ms": median latency, "mb": peak RSS, "cores": CPU/wall}."""
    cmd = [tern_run]
    for name, path in inputs.items():
        cmd += ["-i", f"{name}={path}"]
    cmd += ["--iters", str(iters), "--warmup", str(warmup), "--threads", str(threads), "--json", *extra]
    if out_dir:
        cmd += ["-O", out_dir]
    cmd.append(model)
    try:
        stdout, mb, cpu, wall = run_process(cmd)
    except BenchError as e:
        raise BenchError(f"{e} (on {os.path.basename(model)}, --threads {threads}{''.join(' ' + x for x in extra)})")
    report = json.loads(stdout)
    return {"ms": report["latency_ms"]["median"], "min_ms": report["latency_ms"]["min"], "mb": mb,
            "cores": cpu / wall if wall else float("nan")}


def child_measure(runner, model, inputs, threads, iters, warmup, name=None, weights=None, out_dir=None):
    """One onnxruntime or PyTorch process (this script in --child mode)."""
    spec = {"runner": runner, "model": model, "inputs": inputs, "threads": threads, "iters": iters,
            "warmup": warmup, "name": name, "weights": weights, "out": out_dir}
    python = ORT_PYTHON if runner == "ort" else sys.executable
    stdout, mb, _, _ = run_process([python, os.path.abspath(__file__), "--child", json.dumps(spec)])
    report = json.loads(stdout)
    return {"ms": statistics.median(report["times_ms"]), "min_ms": min(report["times_ms"]), "mb": mb,
            "cores": report["cores"]}


def child(spec):
    """Body of an onnxruntime or PyTorch measurement process; prints its timings as JSON."""
    import numpy as np

    feeds = {n: np.load(f) for n, f in spec["inputs"].items()}
    threads = spec["threads"]
    if spec["runner"] == "ort":
        import onnxruntime as ort

        so = ort.SessionOptions()
        so.intra_op_num_threads = threads
        so.inter_op_num_threads = 1
        so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        sess = ort.InferenceSession(spec["model"], so, providers=["CPUExecutionProvider"])
        names = [o.name for o in sess.get_outputs()]

        def run():
            return sess.run(names, feeds)
    else:
        import torch
        import export_models

        torch.set_num_threads(threads)
        torch.set_grad_enabled(False)
        build, model_inputs = export_models.MODELS[spec["name"]]
        module = build()
        module.load_state_dict(torch.load(spec["weights"]))
        module.eval()
        args = tuple(torch.from_numpy(feeds[i.name]) for i in model_inputs)
        names = ["output"]

        def run():
            return [module(*args).numpy()]

    for _ in range(spec["warmup"]):
        run()
    times = []
    cpu0, wall0 = time.process_time(), time.perf_counter()
    for _ in range(spec["iters"]):
        t0 = time.perf_counter()
        outputs = run()
        times.append((time.perf_counter() - t0) * 1e3)
    cores = (time.process_time() - cpu0) / (time.perf_counter() - wall0)
    if spec["out"]:
        for n, v in zip(names, outputs):
            np.save(os.path.join(spec["out"], n + ".npy"), v)
    print(json.dumps({"times_ms": times, "cores": cores}))


# ---------------------------------------------------------------- measurement plan


def iterations(latency_ms, target_s, fixed=None):
    """Timed iterations so that one measurement lasts about target_s, and its warm-up."""
    n = fixed or max(3, min(20000, round(target_s * 1e3 / max(latency_ms, 1e-3))))
    return n, max(2, min(n // 5, 200))


def alternate(runners, rounds):
    """Calls each runner once per round, rotating the order; returns {name: [result per round]}."""
    names = list(runners)
    results = {n: [] for n in names}
    for r in range(rounds):
        for n in names[r % len(names):] + names[: r % len(names)]:
            if len(results[n]) < runners[n][1]:
                results[n].append(runners[n][0]())
    return results


def summary(results):
    """Median over rounds of the per-round medians; the fastest run; the largest peak RSS; the median
    CPU use."""
    return {
        "ms": statistics.median(r["ms"] for r in results),
        "min_ms": min(r["min_ms"] for r in results),
        "round_ms": [r["ms"] for r in results],
        "mb": max(r["mb"] for r in results),
        "cores": statistics.median(r["cores"] for r in results),
    }


def geomean(values):
    values = list(values)
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else float("nan")


def machine():
    cpu, flags = "unknown", set()
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
            elif line.startswith("flags"):
                flags = set(line.split(":", 1)[1].split())
    cpu += " (" + next((isa for isa in ("avx512f", "avx2", "sse4_2") if isa in flags), "baseline x86-64") + ")"
    return {
        "date": datetime.datetime.now().astimezone().isoformat(timespec="minutes"),
        "nproc": os.cpu_count(),
        "cpu": cpu,
        "kernel": platform.release(),
        "load_average": os.getloadavg(),
        "removed_env": [f"{k}={os.environ[k]}" for k in DROPPED_ENV if k in os.environ],
        "kept_env": [f"{k}={v}" for k, v in sorted(os.environ.items())
                     if k.startswith(("OPENBLAS", "OMP_", "MKL_", "GOTO")) and k not in DROPPED_ENV],
    }


def markdown_table(header, rows):
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" if i == 0 else "---:" for i in range(len(header))) + "|"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def fmt(v, digits=2):
    return "—" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:.{digits}f}"


def parse_list(text, convert=str):
    return [convert(x) for x in text.split(",") if x]


def compare_outputs(want_dir, got_dir):
    """Parity comparison of two folders of NAME.npy; returns (error / bound, problem or None)."""
    import numpy as np
    from parity import compare

    load = lambda d: {f[: -len(".npy")]: np.load(os.path.join(d, f)) for f in os.listdir(d)}
    err, bound, problem = compare(load(want_dir), load(got_dir))
    if problem is None and not err <= bound:
        problem = f"max error {err:.3g} above bound {bound:.3g}"
    return err / bound, problem


def save_inputs(work, name, model_inputs):
    import numpy as np
    from parity import make_inputs

    files = {}
    for n, v in make_inputs(model_inputs).items():
        files[n] = os.path.join(work, f"{name}.{n}.npy")
        np.save(files[n], v)
    return files


# ---------------------------------------------------------------- this benchmark's models


def save_torch_weights(cache, name):
    """The state dict of the module export_models exported as name.onnx: same seed, same calibration."""
    path = os.path.join(cache, name + ".pt")
    if os.path.exists(path):
        return path
    import torch
    import export_models

    build, model_inputs = export_models.MODELS[name]
    torch.manual_seed(export_models.SEED)
    module = build()
    export_models.calibrate_batchnorm(module, model_inputs)
    module.eval()
    torch.save(module.state_dict(), path + ".tmp")
    os.replace(path + ".tmp", path)
    return path


def write_chain(path, nodes):
    """A chain of nodes alternating Add (a 16-element constant) and Relu on a 16-element tensor."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper

    ops = []
    for i in range(nodes):
        src, dst = f"t{i}" if i else "x", "y" if i == nodes - 1 else f"t{i + 1}"
        if i % 2 == 0:
            ops.append(helper.make_node("Add", [src, "c"], [dst], name=f"add{i}"))
        else:
            ops.append(helper.make_node("Relu", [src], [dst], name=f"relu{i}"))
    c = helper.make_tensor("c", TensorProto.FLOAT, [CHAIN_SIZE], np.linspace(-0.5, 0.5, CHAIN_SIZE, dtype=np.float32))
    graph = helper.make_graph(ops, f"chain{nodes}", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [CHAIN_SIZE])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [CHAIN_SIZE])], [c])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.checker.check_model(model)
    onnx.save(model, path)
    return path


def ort_optimized_nodes(path):
    """How many nodes onnxruntime runs after its ORT_ENABLE_ALL optimisation of path."""
    import onnx
    import onnxruntime as ort

    with tempfile.TemporaryDirectory() as d:
        so = ort.SessionOptions()
        so.intra_op_num_threads = 1
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        so.optimized_model_filepath = os.path.join(d, "opt.onnx")
        ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
        return len(onnx.load(so.optimized_model_filepath).graph.node)


def check_model(opt, work, name, model, tern_model, inputs, weights):
    """Runs every runner once on the same inputs and compares with onnxruntime; returns the latencies
    seen (the iteration counts are sized from them) and the error ratios."""
    dirs = {r: tempfile.mkdtemp(prefix=f"{name}.{r}.", dir=work) for r in ("tern", "ort", "torch")}
    seen = {"tern": tern_measure(opt.tern_run, tern_model, inputs, 1, 3, 1, out_dir=dirs["tern"])["ms"],
            "ort": child_measure("ort", model, inputs, 1, 3, 1, out_dir=dirs["ort"])["ms"]}
    check = {"tern": compare_outputs(dirs["ort"], dirs["tern"])}
    if weights:
        seen["torch"] = child_measure("torch", model, inputs, 1, 3, 1, name=name, weights=weights,
                                      out_dir=dirs["torch"])["ms"]
        check["torch"] = compare_outputs(dirs["ort"], dirs["torch"])
    for d in dirs.values():
        for f in os.listdir(d):
            os.unlink(os.path.join(d, f))
        os.rmdir(d)
    return seen, check


def measure(opt, model, inputs, threads, seen, name=None, weights=None, tern_model=None, tern_extra=()):
    """Alternating rounds of tern (on tern_model when given, with tern_extra options), onnxruntime and
    (with weights) PyTorch at one thread count."""
    n, w = iterations(max(seen["tern"], seen["ort"]), opt.target, opt.iters)
    runners = {
        "tern": (lambda: tern_measure(opt.tern_run, tern_model or model, inputs, threads, n, w, tern_extra),
                 opt.rounds),
        "ort": (lambda: child_measure("ort", model, inputs, threads, n, w), opt.rounds),
    }
    if weights:
        tn, tw = iterations(seen["torch"], opt.target, opt.iters)
        runners["torch"] = (lambda: child_measure("torch", model, inputs, threads, tn, tw, name, weights),
                            min(opt.rounds, opt.torch_rounds))
    res = {k: summary(v) for k, v in alternate(runners, opt.rounds).items()}
    res["iters"], res["warmup"] = n, w
    return res


def optimize(opt, model, work):
    """tern-optimize's rewrite of model, which tern-run then runs (onnxruntime optimises at load)."""
    out = os.path.join(work, os.path.basename(model)[: -len(".onnx")] + ".optimized.onnx")
    run_process([opt.tern_optimize, "-o", out, model])
    return out


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def run_models(opt, work, baseline):
    import export_models

    rows = []
    for name in opt.models:
        model = export_models.export(opt.cache, name)
        model_inputs = export_models.MODELS[name][1]
        inputs = save_inputs(work, name, model_inputs)
        weights = None if opt.no_torch else save_torch_weights(opt.cache, name)
        tern_model = optimize(opt, model, work) if opt.optimize else model
        seen, check = check_model(opt, work, name, model, tern_model, inputs, weights)
        for problem in (p for _, p in check.values() if p):
            raise BenchError(f"{name}: outputs differ from onnxruntime's: {problem}")
        for t in opt.threads:
            log(f"bench: {name}, {t} thread(s)")
            res = measure(opt, model, inputs, t, seen, name, weights, tern_model)
            res.update(model=name, threads=t, check={k: v[0] for k, v in check.items()})
            res["ratio"] = res["tern"]["ms"] / res["ort"]["ms"]
            res["min_ratio"] = res["tern"]["min_ms"] / res["ort"]["min_ms"]
            for r in ("tern", "ort"):
                res[r]["net_mb"] = res[r]["mb"] - baseline[r]
            rows.append(res)
    return rows


def chain_files(work):
    """The chain, the one-node graph and their input."""
    import numpy as np

    x = os.path.join(work, "chain.x.npy")
    np.save(x, np.linspace(-1, 1, CHAIN_SIZE, dtype=np.float32))
    return (write_chain(os.path.join(work, f"chain{CHAIN_NODES}.onnx"), CHAIN_NODES),
            write_chain(os.path.join(work, "chain1.onnx"), 1), {"x": x})


def baselines(opt, one_node, inputs):
    """Each runtime's peak RSS on the one-node graph: what it costs before any model."""
    return {"tern": tern_measure(opt.tern_run, one_node, inputs, 1, 3, 1)["mb"],
            "ort": child_measure("ort", one_node, inputs, 1, 3, 1)["mb"]}


def run_chain(opt, chain, one_node, inputs):
    """Overhead per node at each thread count. tern-run runs the chain as given (--optimize 0): its
    in-memory rewrite would fuse the chain into one node, and this measures what a node costs."""
    chains = []
    for t in opt.threads:
        log(f"bench: chain of {CHAIN_NODES} nodes, {t} thread(s)")
        per = {}
        for path in (chain, one_node):
            seen = {"tern": tern_measure(opt.tern_run, path, inputs, t, 20, 5, AS_GIVEN)["ms"],
                    "ort": child_measure("ort", path, inputs, t, 20, 5)["ms"]}
            per[path] = measure(opt, path, inputs, t, seen, tern_extra=AS_GIVEN)
        row = {"threads": t, "ort_nodes": ort_optimized_nodes(chain)}
        for r in ("tern", "ort"):
            long_ms, short_ms = per[chain][r]["ms"], per[one_node][r]["ms"]
            row[r] = {"chain_ms": long_ms, "one_node_ms": short_ms,
                      "ns_per_node": (long_ms - short_ms) * 1e6 / (CHAIN_NODES - 1)}
        chains.append(row)
    return chains


def versions(tern_run):
    import numpy

    ort_version = subprocess.run([ORT_PYTHON, "-c", "import onnxruntime; print(onnxruntime.__version__)"],
                                 capture_output=True, text=True, check=True).stdout.strip()
    isa = json.loads(subprocess.run([tern_run, "--json", "--random", "--dim", "N=1",
                                     os.path.join(SCRIPTS, "example", "mlp.onnxtxt")], capture_output=True,
                                    text=True, check=True, env=child_env()).stdout)["isa"]
    v = {"onnxruntime": ort_version, "tern kernels": isa, "numpy": numpy.__version__,
         "python": platform.python_version()}
    try:
        import torch

        v["torch"] = torch.__version__
    except ImportError:
        pass
    return v


def targets(rows, chains):
    lines = []
    for t in sorted({r["threads"] for r in rows}):
        sel = [r for r in rows if r["threads"] == t]
        g = geomean(r["ratio"] for r in sel)
        worst = max(sel, key=lambda r: r["ratio"])
        lines.append(f"- {t} thread{'s' if t > 1 else ''}: geometric-mean latency ratio tern/ort {g:.3f} (target ≤ 0.9): "
                     + ("met" if g <= 0.9 else "NOT met"))
        lines.append(f"- {t} thread{'s' if t > 1 else ''}: highest ratio {worst['ratio']:.3f} ({worst['model']}) "
                     "(target ≤ 1.1): " + ("met" if worst["ratio"] <= 1.1 else "NOT met"))
    for c in chains:
        ratio = c["tern"]["ns_per_node"] / c["ort"]["ns_per_node"]
        lines.append(f"- chain at {c['threads']} thread(s): tern {c['tern']['ns_per_node']:.1f} ns per node, "
                     f"{ratio:.2f} of onnxruntime's (target ≤ 0.25): " + ("met" if ratio <= 0.25 else "NOT met"))
    heavier = [f"{r['model']}/{r['threads']}" for r in rows if r["tern"]["mb"] > r["ort"]["mb"]]
    heavier_net = [f"{r['model']}/{r['threads']}" for r in rows if r["tern"]["net_mb"] > r["ort"]["net_mb"]]
    lines.append("- peak RSS tern ≤ ort on every model: " + ("met" if not heavier else "NOT met: " + ", ".join(heavier))
                 + "; net of the runtime's own baseline: " + ("met" if not heavier_net else "NOT met: " + ", ".join(heavier_net)))
    return lines


def header_lines(info):
    """The machine, the date, the load around the run and the children's environment."""
    return [f"Machine: {info['cpu']}, {info['nproc']} CPUs, Linux {info['kernel']}; {info['date']}; "
            f"load average at start {info['load_average'][0]:.2f}, at end {info['load_average_end'][0]:.2f}.",
            "Children's environment: " + (", ".join(info["removed_env"]) + " removed" if info["removed_env"] else
                                          "no OPENBLAS_CORETYPE/L2_SIZE")
            + ("; kept " + ", ".join(info["kept_env"]) if info["kept_env"] else "") + "."]


def report(opt, info, rows, chains, baseline):
    out = [*header_lines(info),
           "Versions: " + ", ".join(f"{k} {v}" for k, v in info["versions"].items()) + ".",
           f"Method: {opt.rounds} alternating rounds (PyTorch {min(opt.rounds, opt.torch_rounds)}), each a fresh process; "
           f"latency = median over rounds of each round's median (fastest: the single fastest run of each), batch 1; tern runs "
           + ("tern-optimize's output" if opt.optimize else "the graph as exported, which tern-run rewrites in memory "
              "before planning (its default --optimize 2), as onnxruntime does at ORT_ENABLE_ALL") + f"; MB = peak RSS of the whole process; "
           f"net = minus the same runtime's peak RSS on a one-node graph (tern {baseline['tern']:.1f} MB, "
           f"onnxruntime in Python {baseline['ort']:.1f} MB).", ""]
    header = ["model", "threads", "tern ms", "ort ms", "tern/ort", "fastest tern/ort", "torch ms", "tern MB", "ort MB",
              "tern net MB", "ort net MB", "iters"]
    table = []
    for r in rows:
        torch = r.get("torch", {}).get("ms")
        table.append([r["model"], r["threads"], fmt(r["tern"]["ms"], 3), fmt(r["ort"]["ms"], 3), fmt(r["ratio"], 3),
                      fmt(r["min_ratio"], 3), fmt(torch, 3), fmt(r["tern"]["mb"], 1), fmt(r["ort"]["mb"], 1), fmt(r["tern"]["net_mb"], 1),
                      fmt(r["ort"]["net_mb"], 1), r["iters"]])
    for t in opt.threads:
        sel = [r for r in rows if r["threads"] == t]
        if sel:
            torch = [r["tern"]["ms"] / r["torch"]["ms"] for r in sel if "torch" in r]
            table.append(["**geomean**", t, "", "", f"**{geomean(r['ratio'] for r in sel):.3f}**",
                          f"{geomean(r['min_ratio'] for r in sel):.3f}",
                          f"tern/torch {geomean(torch):.3f}" if torch else "", "", "", "", "", ""])
    out.append(markdown_table(header, table))
    if chains:
        out += ["", f"Overhead: a chain of {CHAIN_NODES} elementwise nodes on a {CHAIN_SIZE}-element tensor "
                f"(onnxruntime runs {chains[0]['ort_nodes']} nodes after optimisation; tern-run runs them as given, --optimize 0); "
                f"ns per node = (chain − one node) / {CHAIN_NODES - 1}.", ""]
        out.append(markdown_table(["threads", "tern ns/node", "ort ns/node", "tern chain µs", "ort chain µs",
                                   "tern 1-node µs", "ort 1-node µs"],
                                  [[c["threads"], fmt(c["tern"]["ns_per_node"], 1), fmt(c["ort"]["ns_per_node"], 1),
                                    fmt(c["tern"]["chain_ms"] * 1e3, 1), fmt(c["ort"]["chain_ms"] * 1e3, 1),
                                    fmt(c["tern"]["one_node_ms"] * 1e3, 1), fmt(c["ort"]["one_node_ms"] * 1e3, 1)]
                                   for c in chains]))
    out += ["", "CPU use during the runs (cores busy per wall second; tern: whole process, ort: timed loop):", ""]
    out.append(markdown_table(["model", "threads", "tern cores", "ort cores", "output error / bound (tern, torch)"],
                              [[r["model"], r["threads"], fmt(r["tern"]["cores"]), fmt(r["ort"]["cores"]),
                                ", ".join(f"{k} {v:.2g}" for k, v in r["check"].items())] for r in rows]))
    out += ["", "Targets (batch 1):", *targets(rows, chains)]
    return "\n".join(out)


def add_options(ap, models, tools):
    """The options both benchmarks take; tools are the tern programs they run."""
    build = os.environ.get("TERN_BUILD", "build")
    ap.add_argument("--models", type=parse_list, default=",".join(models), help="comma-separated (default: %(default)s)")
    ap.add_argument("--threads", type=lambda s: parse_list(s, int), default=[1, 2], help="comma-separated (default 1,2)")
    ap.add_argument("--rounds", type=int, default=5, help="alternating rounds (default 5)")
    ap.add_argument("--iters", type=int, default=None, help="timed iterations per round (default: about --target seconds)")
    ap.add_argument("--target", type=float, default=1.0, help="seconds of timed runs per measurement (default 1)")
    ap.add_argument("--quick", action="store_true", help="2 rounds of about 0.3 s: a smoke test, not a measurement")
    ap.add_argument("--json", metavar="FILE", help="also write the results as JSON to FILE (-: instead of the markdown)")
    for tool in tools:
        ap.add_argument("--" + tool, default=os.path.join(build, "bin", tool), help="(default: %(default)s)")
    ap.add_argument("--cache", default=os.path.join(build, "tests", "models", "cache"),
                    help="exported models (default: %(default)s)")


def check_options(prog, opt, known_models, tools):
    """Exits with a message for an unknown model or a tool that is not there; applies --quick."""
    for n in opt.models:
        if n not in known_models:
            sys.exit(f"{prog}: unknown model {n!r} (known: {', '.join(known_models)})")
    for tool in tools:
        if not os.access(tool, os.X_OK):
            sys.exit(f"{prog}: {tool}: not an executable (set TERN_BUILD)")
    if opt.quick:
        opt.rounds, opt.target = 2, 0.3


def write_results(json_path, results, markdown):
    """The markdown on standard output, and the results as JSON to json_path ('-': instead of it)."""
    if json_path != "-":
        print(markdown())
    if json_path:
        with open(sys.stdout.fileno() if json_path == "-" else json_path, "w", closefd=json_path != "-") as f:
            json.dump(results, f, indent=1)
            f.write("\n")


def main():
    if len(sys.argv) == 3 and sys.argv[1] == "--child":
        child(json.loads(sys.argv[2]))
        return 0
    ap = argparse.ArgumentParser(description="Benchmark tern-run against onnxruntime and PyTorch eager.")
    add_options(ap, DEFAULT_MODELS, ["tern-run", "tern-optimize"])
    ap.add_argument("--torch-rounds", type=int, default=3, help="rounds for PyTorch, whose start is slow (default 3)")
    ap.add_argument("--no-torch", action="store_true", help="leave PyTorch out")
    ap.add_argument("--no-chain", action="store_true", help="leave the overhead micro-benchmark out")
    ap.add_argument("--optimize", action="store_true", help="run tern-run on tern-optimize's output")
    ap.add_argument("--isa", choices=["avx512", "avx2", "generic"], help="run tern-run with TERN_ISA set to this")
    ap.add_argument("--ort-python", default=BENCH_PYTHON if os.access(BENCH_PYTHON, os.X_OK) else sys.executable,
                    help="the Python that runs onnxruntime (default: .venv-bench's when present, else this one)")
    opt = ap.parse_args()
    global TERN_ISA, ORT_PYTHON
    TERN_ISA, ORT_PYTHON = opt.isa, opt.ort_python
    if opt.quick:
        opt.torch_rounds = 1
    import export_models

    check_options("bench", opt, export_models.MODELS, [opt.tern_run] + ([opt.tern_optimize] if opt.optimize else []))

    info = machine()
    info["versions"] = versions(opt.tern_run)
    with tempfile.TemporaryDirectory(prefix="tern-bench.") as work:
        try:
            chain, one_node, chain_inputs = chain_files(work)
            baseline = baselines(opt, one_node, chain_inputs)
            chains = [] if opt.no_chain else run_chain(opt, chain, one_node, chain_inputs)
            rows = run_models(opt, work, baseline)
        except BenchError as e:
            sys.exit(f"bench: {e}")
    info["load_average_end"] = os.getloadavg()
    write_results(opt.json, {"machine": info, "models": rows, "chain": chains, "baseline_mb": baseline,
                             "targets": targets(rows, chains)}, lambda: report(opt, info, rows, chains, baseline))
    return 0


if __name__ == "__main__":
    sys.exit(main())
