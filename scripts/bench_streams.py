#!/usr/bin/env python3
"""Multi-stream against single-stream execution in tern-run, on branchy models: Inception-v3,
GoogLeNet and generated DARTS-like cell networks (scripts/make_cell_network.py): cell_network is the
shape of DARTS's CIFAR-10 search network (8 cells, C = 16, reduction cells), cell_network_wide every
cell at 32x32 with 64 channels (the script's --channels 64 --no-reduction), whose operators are large
enough to split between threads.

Each model goes through the pipeline's order: tern-optimize (-O2), then tern-schedule twice, with as
many streams as its concurrency needs (auto) and with at most 2 (--streams 2). Four variants then
alternate in rounds, each measurement a fresh tern-run process with the same input: the optimised
graph unscheduled (tern-run's single stream, "plain"), the auto-scheduled graph with --single-stream
(nodes one after another in the schedule's launch order), the same graph on its streams, and the
2-stream graph. Latency is the median over rounds of each round's median. The target compares the
multi-stream time with the best single-stream time of either single-stream variant at any of the
thread counts measured. Once per model the outputs of every variant are compared with onnxruntime's
(parity tolerance). OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE are removed from the
children's environment, as in scripts/bench.py.

The overhead micro-benchmark (left out with --no-overhead) is scripts/bench.py's chain split in two:
two chains of 500 elementwise nodes on 16 floats from one input, joined by an Add, scheduled on two
streams and run as given. ns per step = (its time - the one-node graph's) / 1000: what the executor
costs a step when the streams run side by side (multi) and one after another (--single-stream).

Usage: .venv/bin/python scripts/bench_streams.py [--models a,b] [--threads 1,2] [--rounds R] [--iters N]
                                                 [--quick] [--json FILE] [--no-overhead]
tern-run and tern-schedule are in $TERN_BUILD/bin (TERN_BUILD defaults to build).
"""
import argparse
import os
import re
import subprocess
import sys
import tempfile

import bench

CELL_NETWORK = "cell_network"
CELL_NETWORKS = {CELL_NETWORK: [], "cell_network_wide": ["--channels", "64", "--no-reduction"]}  # name -> options
DEFAULT_MODELS = ["inception_v3", "googlenet", *CELL_NETWORKS]
# variant -> the graph it runs: its schedule, or "plain" for the optimised graph unscheduled
VARIANTS = {"plain": "plain", "single": "auto", "multi": "auto", "multi2": "2"}


def schedule(tern_schedule, model, streams, out):
    """Writes model's schedule with at most `streams` streams to out; returns the streams used."""
    p = subprocess.run([tern_schedule, "-v", "--streams", streams, "-o", out, model], capture_output=True,
                       text=True, env=bench.child_env())
    if p.returncode != 0:
        raise bench.BenchError(f"tern-schedule exit {p.returncode}: {p.stderr.strip()}")
    m = re.search(r"on (\d+) streams?", p.stderr)
    return int(m.group(1)) if m else None


def model_file(opt, name):
    import export_models

    if name not in CELL_NETWORKS:
        return export_models.export(opt.cache, name), export_models.MODELS[name][1]
    path = os.path.join(opt.cache, name + "-2.onnx")  # -2: the generator with reduction cells
    if not os.path.exists(path):
        os.makedirs(opt.cache, exist_ok=True)
        p = subprocess.run([sys.executable, os.path.join(bench.SCRIPTS, "make_cell_network.py"), path,
                            *CELL_NETWORKS[name]], capture_output=True, text=True)
        if p.returncode != 0:
            raise bench.BenchError(f"make_cell_network: {p.stderr.strip()}")
    return path, [export_models.Input("image", (1, 3, 32, 32))]


def variant_args(variant):
    return ["--single-stream"] if variant == "single" else []


def check(opt, work, name, graphs, inputs, original):
    """Runs every variant once (2 threads) against onnxruntime; returns the latencies seen, the largest
    error / bound, and the variants whose outputs are wrong (not worth timing). A variant that crashes
    here is still measured: it may run at other thread counts, and the table says where it fails."""
    ort_dir = tempfile.mkdtemp(prefix=f"{name}.ort.", dir=work)
    bench.child_measure("ort", original, inputs, 1, 1, 0, out_dir=ort_dir)
    seen, worst, failed = {}, 0.0, {}
    for v, sched in VARIANTS.items():
        d = tempfile.mkdtemp(prefix=f"{name}.{v}.", dir=work)
        try:
            seen[v] = bench.tern_measure(opt.tern_run, graphs[sched], inputs, 2, 3, 1, variant_args(v), out_dir=d)["ms"]
        except bench.BenchError:
            continue
        ratio, problem = bench.compare_outputs(ort_dir, d)
        if problem:
            failed[v] = f"outputs differ from onnxruntime's: {problem}"
        worst = max(worst, ratio)
    return seen, worst, failed


def guarded(measure):
    """A measurement that reports a failing tern-run as {"error": message} rather than stopping the run."""
    try:
        return measure()
    except bench.BenchError as e:
        return {"error": str(e)}


def run(opt, work):
    rows = []
    for name in opt.models:
        path, model_inputs = model_file(opt, name)
        inputs = bench.save_inputs(work, name, model_inputs)
        graphs, streams = {"plain": os.path.join(work, f"{name}.optimized.onnx")}, {}
        bench.run_process([opt.tern_optimize, "-O2", "-o", graphs["plain"], path])
        for sched in set(VARIANTS.values()) - {"plain"}:
            graphs[sched] = os.path.join(work, f"{name}.streams-{sched}.onnx")
            streams[sched] = schedule(opt.tern_schedule, graphs["plain"], sched, graphs[sched])
        seen, err, failed = check(opt, work, name, graphs, inputs, path)
        if not seen:
            raise bench.BenchError(f"{name}: every variant fails: {failed}")
        n, w = bench.iterations(max(seen.values()), opt.target, opt.iters)
        for t in opt.threads:
            bench.log(f"bench_streams: {name}, {t} thread(s)")
            runners = {v: (lambda v=v: guarded(lambda: bench.tern_measure(
                opt.tern_run, graphs[VARIANTS[v]], inputs, t, n, w, variant_args(v))), opt.rounds)
                for v in VARIANTS if v not in failed}
            res = {v: {"error": msg} for v, msg in failed.items()}
            for v, results in bench.alternate(runners, opt.rounds).items():
                errors = [r["error"] for r in results if "error" in r]
                res[v] = {"error": errors[0]} if errors else bench.summary(results)
            ms = {v: res[v].get("ms") for v in VARIANTS}
            res.update(model=name, threads=t, streams=streams, iters=n, warmup=w, check=err,
                       speedup=ms["single"] / ms["multi"] if ms["single"] and ms["multi"] else None,
                       speedup2=ms["single"] / ms["multi2"] if ms["single"] and ms["multi2"] else None)
            rows.append(res)
    return rows


def write_two_chains(path, nodes):
    """Two chains of `nodes` nodes each (bench.write_chain's Add and Relu) from x, joined by an Add."""
    import onnx
    from onnx import helper

    chain = onnx.load(bench.write_chain(path, nodes))
    g = chain.graph
    ops = []
    for c in ("a", "b"):
        for n in g.node:
            m = onnx.NodeProto()
            m.CopyFrom(n)
            m.name = f"{c}.{n.name}"
            m.input[:] = [i if i in ("x", "c") else f"{c}.{i}" for i in n.input]
            m.output[:] = [f"{c}.{o}" for o in n.output]
            ops.append(m)
    ops.append(helper.make_node("Add", ["a.y", "b.y"], ["y"], name="join"))
    del g.node[:]
    g.node.extend(ops)
    onnx.checker.check_model(chain)
    onnx.save(chain, path)
    return path


def run_overhead(opt, work):
    """ns per step of the stream executor, at each thread count, on two chains of small steps."""
    import numpy as np

    half = bench.CHAIN_NODES // 2
    x = os.path.join(work, "chains.x.npy")
    np.save(x, np.linspace(-1, 1, bench.CHAIN_SIZE, dtype=np.float32))
    inputs = {"x": x}
    two = write_two_chains(os.path.join(work, "two_chains.onnx"), half)
    scheduled = os.path.join(work, "two_chains.streams.onnx")
    streams = schedule(opt.tern_schedule, two, "2", scheduled)
    one_node = bench.write_chain(os.path.join(work, "chain1.onnx"), 1)
    steps = 2 * half + 1
    rows = []
    for t in opt.threads:
        bench.log(f"bench_streams: two chains of {half} nodes, {t} thread(s)")
        runners = {
            "multi": (lambda: bench.tern_measure(opt.tern_run, scheduled, inputs, t, 2000, 200, bench.AS_GIVEN), opt.rounds),
            "single": (lambda: bench.tern_measure(opt.tern_run, scheduled, inputs, t, 2000, 200, ["--single-stream", *bench.AS_GIVEN]),
                       opt.rounds),
            "one": (lambda: bench.tern_measure(opt.tern_run, one_node, inputs, t, 2000, 200, bench.AS_GIVEN),
                    opt.rounds),
        }
        res = {v: bench.summary(r) for v, r in bench.alternate(runners, opt.rounds).items()}
        row = {"threads": t, "streams": streams, "steps": steps}
        for v in ("multi", "single"):
            row[v] = {"ms": res[v]["ms"], "ns_per_step": (res[v]["ms"] - res["one"]["ms"]) * 1e6 / (steps - 1)}
        rows.append(row)
    return rows


def best_single(rows, model):
    """The fastest single-stream latency of a model over both single-stream variants and every thread
    count measured, and where it was."""
    times = [(r[v]["ms"], f"{v}, {r['threads']} thread{'s' if r['threads'] > 1 else ''}") for r in rows
             if r["model"] == model for v in ("plain", "single") if "ms" in r[v]]
    return min(times) if times else (None, None)


def targets(rows):
    lines = []
    for r in rows:
        if r["model"] == CELL_NETWORK and r["threads"] == 2:
            best, where = best_single(rows, CELL_NETWORK)
            multi = r["multi"].get("ms")
            gain = best / multi if best and multi else None
            lines.append("- cell network, 2 threads: multi-stream " + (f"{gain:.2f}×" if gain else "fails,")
                         + f" the best single-stream time ({where}) (target ≥ 1.3): "
                         + ("met" if gain and gain >= 1.3 else "NOT met"))
    slower = [f"{r['model']}/{r['threads']}/{v}" + ("" if s else " (fails)") for r in rows
              if r["model"] not in CELL_NETWORKS for v, s in (("auto", r["speedup"]), ("2 streams", r["speedup2"]))
              if not s or 1 / s > 1.05]
    if any(r["model"] not in CELL_NETWORKS for r in rows):
        lines.append("- torchvision models: multi-stream never more than 5% slower than single-stream: "
                     + ("met" if not slower else "NOT met: " + ", ".join(slower)))
    return lines


def cell(res, key="ms", digits=3):
    return "fails" if "error" in res else bench.fmt(res[key], digits)


def report(opt, info, rows, overhead):
    out = [*bench.header_lines(info),
           f"Method: {opt.rounds} alternating rounds, each a fresh tern-run process; latency = median over rounds "
           "of each round's median, batch 1; plain = the optimised graph unscheduled, single = the scheduled graph "
           "with --single-stream; speed-up = single ms / multi ms (the same graph).", ""]
    header = ["model", "threads", "streams", "plain ms", "single ms", "multi ms", "speed-up", "2-stream ms",
              "speed-up (2)", "iters"]
    table = [[r["model"], r["threads"], r["streams"]["auto"], cell(r["plain"]), cell(r["single"]), cell(r["multi"]),
              bench.fmt(r["speedup"]), cell(r["multi2"]), bench.fmt(r["speedup2"]), r["iters"]] for r in rows]
    out.append(bench.markdown_table(header, table))
    errors = sorted({f"{r['model']} ({v}): {r[v]['error']}" for r in rows for v in VARIANTS if "error" in r[v]})
    if errors:
        out += ["", "Failures:", *(f"- {e}" for e in errors)]
    if overhead:
        out += ["", f"Overhead: two chains of {bench.CHAIN_NODES // 2} elementwise nodes on {bench.CHAIN_SIZE} floats, "
                "scheduled on two streams and run as given; ns per step = (the run - a one-node graph's) / "
                f"{overhead[0]['steps'] - 1}.", ""]
        out.append(bench.markdown_table(["threads", "multi µs", "multi ns/step", "single-stream µs", "single ns/step"],
                                        [[o["threads"], bench.fmt(o["multi"]["ms"] * 1e3, 1),
                                          bench.fmt(o["multi"]["ns_per_step"], 1), bench.fmt(o["single"]["ms"] * 1e3, 1),
                                          bench.fmt(o["single"]["ns_per_step"], 1)] for o in overhead]))
    out += ["", "Targets:", *targets(rows)]
    return "\n".join(out)


def main():
    ap = argparse.ArgumentParser(description="Benchmark tern-run's multi-stream execution against single-stream.")
    bench.add_options(ap, DEFAULT_MODELS, ["tern-run", "tern-schedule", "tern-optimize"])
    ap.add_argument("--no-overhead", action="store_true", help="leave the overhead micro-benchmark out")
    opt = ap.parse_args()
    import export_models

    bench.check_options("bench_streams", opt, [*export_models.MODELS, *CELL_NETWORKS],
                        [opt.tern_run, opt.tern_schedule, opt.tern_optimize])

    info = bench.machine()
    with tempfile.TemporaryDirectory(prefix="tern-bench-streams.") as work:
        try:
            rows = run(opt, work)
            overhead = [] if opt.no_overhead else run_overhead(opt, work)
        except bench.BenchError as e:
            sys.exit(f"bench_streams: {e}")
    info["load_average_end"] = os.getloadavg()
    bench.write_results(opt.json, {"machine": info, "models": rows, "overhead": overhead, "targets": targets(rows)},
                        lambda: report(opt, info, rows, overhead))
    return 0


if __name__ == "__main__":
    sys.exit(main())
