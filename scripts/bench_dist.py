#!/usr/bin/env python3
"""Distributed training, tern's strategies against each other and PyTorch DDP, in one run on a cluster
of network namespaces on this machine (scripts/netns-cluster: one namespace a rank, veth links limited
to --rate, MPICH and gloo over TCP across them).

    sudo .venv/bin/python scripts/bench_dist.py [--ranks 4] [--rate 1gbit] [--batch 512] [--steps 12]
                                                [--vocab 100000] [--dim 256] [--no-torch] [--keep DIR]

Models, with fixed seeds:
  lm   an LM: context words through a --vocab x --dim input embedding (mean), a dense tanh layer, and
       a sampled softmax over the same vocabulary (the true word and 64 negatives a sample, their
       weights and biases read by rows, as Parallax's LM1B); Zipf-distributed words; Adagrad.
  cnn  the digits CNN of scripts/digits.py on scikit-learn's digits (all of its parameters dense); SGD.
  wide digits.py's wide CNN (1.66 M dense parameters: about as much time communicating as computing),
       hybrid with its AllReduce buckets started while the backward pass runs (the default) against
       tern-partition --no-overlap (reduced after it), to measure what the overlap gains.
For each: tern-autodiff, tern-partition --ranks N --strategy S, tern-dist-run in the cluster with --log
and --report. The LM runs hybrid (P by hand over a range, and --partitions auto), allgather (Horovod's
treatment of sparse gradients), allreduce (all dense), and PyTorch DistributedDataParallel (gloo;
nn.Embedding(sparse=True); torch.optim.Adagrad) on the same weights and batches. A step's time is the
median over the ranks' logged step times after the first two steps; bytes are a rank's mean a step:
tern's counters (what its collectives moved), the first-principles count (tern-dist-run(1)), and what
crossed the rank's veth (tx, from the interface counters over the whole run, divided by the steps).
The two CNNs' comparisons pool the steps (after the first two) of several runs each, run in pairs
of alternating order. --partitions auto is judged by the step time of the count it chose as measured in the runs by hand
(when it chose one of them; else by its own run, whose wire bytes include the search's). Prints the
tables and the targets' verdicts; writes results.json to --keep DIR when given.
On an even number of ranks (4 or more), the LM runs once more as hosts of 2 ranks (two ranks a
namespace, talking over its loopback): one server a host (--hosts), with and without
--local-aggregation; step time and the bytes a host sends on its link.
"""
import argparse
import json
import math
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
CLUSTER = os.path.join(HERE, "netns-cluster")
PY = sys.executable  # the project environment: onnx, numpy 1, and Debian's torch
CTX, NEG = 20, 64


def run(cmd, **kw):
    return subprocess.run(cmd, check=True, **kw)


# ---------------------------------------------------------------- models and data

def make_lm(work, vocab, dim, samples):
    import numpy as np
    import onnx
    from onnx import helper as h, numpy_helper as nh, TensorProto as T
    r = np.random.default_rng(0)
    w = {"emb": (r.standard_normal((vocab, dim)) * 0.05).astype(np.float32),
         "w1": (r.standard_normal((dim, dim)) * (1.0 / math.sqrt(dim))).astype(np.float32),
         "b1": np.zeros(dim, np.float32),
         "sm_w": (r.standard_normal((vocab, dim)) * 0.05).astype(np.float32),
         "sm_b": np.zeros(vocab, np.float32)}
    consts = {"one": np.array([1], np.int64), "two": np.array([2], np.int64)}
    nodes = [h.make_node("Gather", ["emb", "tokens"], ["e"]),
             h.make_node("ReduceMean", ["e"], ["ctx"], axes=[1], keepdims=0),
             h.make_node("Gemm", ["ctx", "w1", "b1"], ["z"]),
             h.make_node("Tanh", ["z"], ["hid"]),
             h.make_node("Unsqueeze", ["next", "one"], ["next1"]),
             h.make_node("Concat", ["next1", "negatives"], ["cand"], axis=1),
             h.make_node("Gather", ["sm_w", "cand"], ["wc"]),
             h.make_node("Gather", ["sm_b", "cand"], ["bc"]),
             h.make_node("Unsqueeze", ["hid", "two"], ["hid2"]),
             h.make_node("MatMul", ["wc", "hid2"], ["dots"]),
             h.make_node("Squeeze", ["dots", "two"], ["dot"]),
             h.make_node("Add", ["dot", "bc"], ["logits"])]
    g = h.make_graph(nodes, "lm", [h.make_tensor_value_info("tokens", T.INT64, ["N", CTX]),
                                   h.make_tensor_value_info("next", T.INT64, ["N"]),
                                   h.make_tensor_value_info("negatives", T.INT64, ["N", NEG])],
                     [h.make_tensor_value_info("logits", T.FLOAT, ["N", NEG + 1])],
                     [nh.from_array(v, k) for k, v in {**w, **consts}.items()])
    onnx.save(h.make_model(g, opset_imports=[h.make_opsetid("", 17)]), os.path.join(work, "lm.onnx"))
    np.savez(os.path.join(work, "lm_weights.npz"), **w)
    zipf = lambda shape: (np.minimum(r.zipf(1.2, shape), vocab) - 1).astype(np.int64)
    data = {"tokens": zipf((samples, CTX)), "next": zipf((samples,)),
            "negatives": r.integers(0, vocab, (samples, NEG)).astype(np.int64),
            "target": np.zeros(samples, np.int64)}
    for k, v in data.items():
        np.save(os.path.join(work, k + ".npy"), v)
    return ["-i", "tokens=tokens.npy", "-i", "next=next.npy", "-i", "negatives=negatives.npy",
            "-i", "target=target.npy"]


def make_cnn(work):
    for kind, name in (("model", "cnn.onnx"), ("wide-model", "wide.onnx")):
        run([PY, os.path.join(HERE, "digits.py"), kind, os.path.join(work, name)], stdout=subprocess.DEVNULL)
    run([sys.executable, os.path.join(HERE, "digits.py"), "data", work], stdout=subprocess.DEVNULL)
    return ["-i", "x_train.npy", "-i", "y_train.npy"]


# ---------------------------------------------------------------- the cluster

def wire_tx(prefix):
    out = run([CLUSTER, "stats", "--prefix", prefix], capture_output=True, text=True).stdout
    tx = {}
    for line in out.splitlines():
        f = line.split()
        if len(f) >= 5 and f[0].isdigit():
            tx[int(f[0])] = int(f[3])
    return tx


def tern_run(args, work, prefix, ranks, model, inputs, batch, steps, tag, extra=(), per_host=1):
    log = os.path.join(work, tag + ".jsonl")
    if os.path.exists(log):
        os.remove(log)
    before = wire_tx(prefix)
    cmd = [CLUSTER, "run", str(ranks), "--per-host", str(per_host), "--prefix", prefix, "--",
           os.path.join(args.bin, "tern-dist-run"), model, *inputs, "--batch", str(batch), "--steps", str(steps),
           "--log", log, "--report", *extra]
    p = subprocess.run(cmd, cwd=work, capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(f"bench_dist: {tag} failed ({p.returncode}):\n{p.stderr[-3000:]}")
    after = wire_tx(prefix)
    rows = [json.loads(l) for l in open(log)]
    times = [r["step_s"] for r in rows if r["step"] > 2]
    sent = [sum(r["bytes_sent"][k] for k in ("dense", "sparse_push", "sparse_pull")) for r in rows if r["step"] > 1]
    want = None
    m = re.search(r"^all\s+(\d+)\s+(\d+)\s+([\d.]+)", p.stderr, re.M)
    if m:
        want = float(m.group(2))
    chosen = re.search(r"tern-dist-run: (\d+) partitions$", p.stderr, re.M)
    step = statistics.median(times)
    return {"tag": tag, "step_s": step, "samples_per_s": batch / step, "times": times,
            "bytes_per_step": statistics.mean(sent), "first_principles": want,
            # a host's mean (the namespaces in use)
            "wire_tx_per_step": sum(after[r] - before.get(r, 0) for r in after) / steps / -(-ranks // per_host),
            "chosen_partitions": int(chosen.group(1)) if chosen else None, "stderr": p.stderr[-2000:]}


def ddp_run(args, work, prefix, ranks, batch, steps):
    out = os.path.join(work, "ddp.json")
    cmd = [CLUSTER, "run", str(ranks), "--prefix", prefix, "--", "env", "GLOO_SOCKET_IFNAME=eth0",
           PY, os.path.abspath(__file__), "--ddp-rank", work, "--batch", str(batch), "--steps", str(steps)]
    before = wire_tx(prefix)
    p = subprocess.run(cmd, cwd=work, capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(f"bench_dist: PyTorch DDP failed ({p.returncode}):\n{p.stderr[-3000:]}")
    after = wire_tx(prefix)
    r = json.load(open(out))
    r["wire_tx_per_step"] = statistics.mean(after[k] - before.get(k, 0) for k in after) / steps
    r["samples_per_s"] = batch / r["step_s"]
    return r


# ---------------------------------------------------------------- a PyTorch DDP rank (in .venv-bench)

def ddp_rank(work, batch, steps):
    import time
    import numpy as np
    import torch
    import torch.distributed as dist
    import torch.nn as nn
    torch.set_num_threads(1)
    rank, size = int(os.environ["PMI_RANK"]), int(os.environ["PMI_SIZE"])
    dist.init_process_group("gloo", init_method="tcp://10.77.0.1:29533", rank=rank, world_size=size)
    w = np.load(os.path.join(work, "lm_weights.npz"))

    class LM(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding.from_pretrained(torch.from_numpy(w["emb"]), freeze=False, sparse=True)
            self.lin = nn.Linear(w["w1"].shape[0], w["w1"].shape[1])
            with torch.no_grad():
                self.lin.weight.copy_(torch.from_numpy(w["w1"].T.copy()))
                self.lin.bias.copy_(torch.from_numpy(w["b1"]))
            self.sm_w = nn.Embedding.from_pretrained(torch.from_numpy(w["sm_w"]), freeze=False, sparse=True)
            self.sm_b = nn.Embedding.from_pretrained(torch.from_numpy(w["sm_b"][:, None].copy()), freeze=False,
                                                     sparse=True)

        def forward(self, tokens, nxt, neg):
            hid = torch.tanh(self.lin(self.emb(tokens).mean(1)))
            cand = torch.cat([nxt[:, None], neg], 1)
            return torch.bmm(self.sm_w(cand), hid[:, :, None])[:, :, 0] + self.sm_b(cand)[:, :, 0]

    model = nn.parallel.DistributedDataParallel(LM())
    opt = torch.optim.Adagrad(model.parameters(), lr=0.1)
    data = {k: torch.from_numpy(np.load(os.path.join(work, k + ".npy"))) for k in ("tokens", "next", "negatives")}
    per = batch // size
    times = []
    for s in range(steps):
        at = s * batch + rank * per
        t0 = time.perf_counter()
        logits = model(data["tokens"][at:at + per], data["next"][at:at + per], data["negatives"][at:at + per])
        loss = nn.functional.cross_entropy(logits, torch.zeros(per, dtype=torch.long))
        opt.zero_grad()
        loss.backward()
        opt.step()
        times.append(time.perf_counter() - t0)
    med = torch.tensor([statistics.median(times[2:])])
    dist.all_reduce(med)
    if rank == 0:
        json.dump({"step_s": float(med) / size}, open(os.path.join(work, "ddp.json"), "w"))
    dist.destroy_process_group()


# ---------------------------------------------------------------- the whole

def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bin", default=os.path.join(ROOT, "build", "bin"))
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--rate", default="1gbit")
    ap.add_argument("--batch", type=int, default=512)
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--vocab", type=int, default=100000)
    ap.add_argument("--dim", type=int, default=256)
    ap.add_argument("--hand", default="2,4,8,16,32", help="partition counts tried by hand")
    ap.add_argument("--no-torch", action="store_true")
    ap.add_argument("--keep", help="keep the work folder here (results.json in it)")
    ap.add_argument("--prefix", default="ternb")
    ap.add_argument("--ddp-rank", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.ddp_rank:
        return ddp_rank(args.ddp_rank, args.batch, args.steps)
    if os.geteuid() != 0:
        sys.exit("bench_dist: the namespace cluster needs root")
    work = args.keep or tempfile.mkdtemp(prefix="tern-bench-dist-")
    os.makedirs(work, exist_ok=True)
    B = lambda t: os.path.join(args.bin, t)
    n, b = args.ranks, args.batch
    lm_in = make_lm(work, args.vocab, args.dim, b * (args.steps + 1))
    run([B("tern-autodiff"), "--optimizer", "adagrad", "--lr", "0.1", os.path.join(work, "lm.onnx"), "-o",
         os.path.join(work, "lm_train.onnx")])
    cnn_in = make_cnn(work)
    for name in ("cnn", "wide"):
        run([B("tern-autodiff"), "--optimizer", "sgd", "--lr", "0.05", os.path.join(work, name + ".onnx"), "-o",
             os.path.join(work, name + "_train.onnx")])

    def part(src, dst, *opt):
        run([B("tern-partition"), "--ranks", str(n), *opt, os.path.join(work, src), "-o", os.path.join(work, dst)])
        return os.path.join(work, dst)

    run([CLUSTER, "up", str(n), "--prefix", args.prefix, "--rate", args.rate], stdout=subprocess.DEVNULL)
    results = {"ranks": n, "rate": args.rate, "batch": b, "steps": args.steps, "lm": {}, "cnn": {}, "hand": {},
               "overlap": {}}
    try:
        lm = results["lm"]
        for s in ("hybrid", "allgather", "allreduce"):
            lm[s] = tern_run(args, work, args.prefix, n, part("lm_train.onnx", f"lm_{s}.onnx", "--strategy", s), lm_in,
                             b, args.steps, "lm_" + s)
            print(f"lm {s}: {lm[s]['step_s']:.3f} s a step", file=sys.stderr)
        for p in [int(x) for x in args.hand.split(",")]:
            results["hand"][p] = tern_run(args, work, args.prefix, n,
                                          part("lm_train.onnx", f"lm_p{p}.onnx", "--partitions", str(p)), lm_in, b,
                                          args.steps, f"lm_p{p}")
            print(f"lm hybrid P={p}: {results['hand'][p]['step_s']:.3f} s a step", file=sys.stderr)
        lm["auto"] = tern_run(args, work, args.prefix, n, part("lm_train.onnx", "lm_auto.onnx", "--partitions", "auto"),
                              lm_in, b, args.steps, "lm_auto")
        if not args.no_torch:
            lm["ddp"] = ddp_run(args, work, args.prefix, n, b, args.steps)
        # pairs of runs in alternating order (the first of two runs measured slower, 3 % on the CNN)
        cnn = results["cnn"]
        for rep in range(6):
            for s in ("hybrid", "allreduce")[::1 if rep % 2 == 0 else -1]:
                r = tern_run(args, work, args.prefix, n, part("cnn_train.onnx", f"cnn_{s}.onnx", "--strategy", s),
                             cnn_in, 256, 200, f"cnn_{s}{rep}")
                cnn.setdefault(s, []).append(r)
        ov = results["overlap"]
        for rep in range(4):
            for s, opt in (("overlap", ()), ("after", ("--no-overlap",)))[::1 if rep % 2 == 0 else -1]:
                r = tern_run(args, work, args.prefix, n, part("wide_train.onnx", f"wide_{s}.onnx", *opt), cnn_in, 256,
                             30, f"wide_{s}{rep}")
                ov.setdefault(s, []).append(r)
        if n >= 4 and n % 2 == 0:
            # two ranks a namespace (a host): one server a host, with and without local aggregation
            hosts = os.path.join(work, "hosts")
            with open(hosts, "w") as f:
                f.writelines(f"h{h}:2\n" for h in range(n // 2))
            la = results["local"] = {}
            for rep in range(2):
                for s, opt in (("hosts", ()), ("local_aggregation", ("--local-aggregation",))):
                    r = tern_run(args, work, args.prefix, n, part("lm_train.onnx", f"lm_{s}.onnx", "--hosts", hosts, *opt),
                                 lm_in, b, args.steps, f"lm_{s}{rep}", per_host=2)
                    la.setdefault(s, []).append(r)
    finally:
        run([CLUSTER, "down", "--prefix", args.prefix])

    # ---------------------------------------------------------------- tables
    print(f"\nLM ({args.vocab} x {args.dim} embedding, sampled softmax over the same vocabulary), {n} ranks in "
          f"network namespaces at {args.rate}, global batch {b}, {args.steps} steps")
    print(f"{'run':<22}{'step s':>9}{'samples/s':>11}{'MB sent/step':>14}{'first-princ.':>14}{'MB on wire':>12}"
          f"{'hybrid x':>10}")
    h = lm["hybrid"]
    rows = [("tern hybrid", h), ("tern allgather", lm["allgather"]), ("tern allreduce", lm["allreduce"])]
    rows += [(f"tern hybrid P={p}", r) for p, r in results["hand"].items()]
    rows.append((f"tern hybrid P=auto ({lm['auto']['chosen_partitions']})", lm["auto"]))
    if "ddp" in lm:
        rows.append(("PyTorch DDP (gloo)", lm["ddp"]))
    for name, r in rows:
        fp = r.get("first_principles")
        sent = r.get("bytes_per_step")
        print(f"{name:<22}{r['step_s']:>9.3f}{r['samples_per_s']:>11.1f}"
              f"{(sent / 1e6 if sent is not None else float('nan')):>14.2f}"
              f"{(fp / 1e6 if fp else float('nan')):>14.2f}{r['wire_tx_per_step'] / 1e6:>12.2f}"
              f"{r['step_s'] / h['step_s']:>10.2f}")
    def pooled(runs):
        return statistics.median(t for r in runs for t in r["times"])

    cnn_h, cnn_a = pooled(results["cnn"]["hybrid"]), pooled(results["cnn"]["allreduce"])
    print(f"\ndigits CNN (dense), global batch 256: hybrid {cnn_h:.4f} s, allreduce {cnn_a:.4f} s a step "
          f"(median step of 6 runs of 200 steps each), hybrid/allreduce {cnn_h / cnn_a:.3f}")

    wide_o, wide_a = pooled(results["overlap"]["overlap"]), pooled(results["overlap"]["after"])
    print(f"wide digits CNN (1.66 M dense parameters), global batch 256: AllReduce started during the backward "
          f"pass {wide_o:.4f} s, after it (--no-overlap) {wide_a:.4f} s a step (median step of 4 runs of 30 steps "
          f"each), {wide_a / wide_o:.2f}x from overlap")

    if results.get("local"):
        la = results["local"]
        print(f"\nLM on {n // 2} hosts of 2 ranks (2 ranks a namespace, one server a host), medians of 2 runs:")
        for s in ("hosts", "local_aggregation"):
            step = statistics.median(r["step_s"] for r in la[s])
            wire = statistics.median(r["wire_tx_per_step"] for r in la[s])
            print(f"  {s:<18} {step:.3f} s a step, {wire / 1e6:.2f} MB a host a step on the wire")

    best_p = min(results["hand"], key=lambda p: results["hand"][p]["step_s"])
    auto_p = lm["auto"]["chosen_partitions"]
    auto_t = results["hand"][auto_p]["step_s"] if auto_p in results["hand"] else lm["auto"]["step_s"]
    checks = [
        ("hybrid bytes within 5% of first principles", abs(h["bytes_per_step"] / h["first_principles"] - 1) <= 0.05,
         f"{h['bytes_per_step'] / h['first_principles']:.3f}"),
        ("hybrid bytes >= 3x fewer than allreduce", lm["allreduce"]["bytes_per_step"] >= 3 * h["bytes_per_step"],
         f"{lm['allreduce']['bytes_per_step'] / h['bytes_per_step']:.1f}x"),
        ("hybrid throughput >= 3x allreduce", h["samples_per_s"] >= 3 * lm["allreduce"]["samples_per_s"],
         f"{h['samples_per_s'] / lm['allreduce']['samples_per_s']:.2f}x"),
        ("hybrid throughput >= 1.5x allgather", h["samples_per_s"] >= 1.5 * lm["allgather"]["samples_per_s"],
         f"{h['samples_per_s'] / lm['allgather']['samples_per_s']:.2f}x"),
        ("dense CNN: hybrid within 5% of allreduce", abs(cnn_h / cnn_a - 1) <= 0.05, f"{cnn_h / cnn_a:.3f}"),
        ("wide CNN: overlapped AllReduce faster than after the backward pass", wide_o < wide_a,
         f"{wide_a / wide_o:.2f}x"),
        (f"auto P={auto_p} within 10% of the best P by hand (P={best_p})",
         auto_t <= 1.10 * results["hand"][best_p]["step_s"], f"{auto_t / results['hand'][best_p]['step_s']:.3f}"),
    ]
    if "ddp" in lm:
        checks.append(("hybrid throughput >= PyTorch DDP's", h["samples_per_s"] >= lm["ddp"]["samples_per_s"],
                       f"{h['samples_per_s'] / lm['ddp']['samples_per_s']:.2f}x"))
    print()
    for what, ok, fig in checks:
        print(f"{'met' if ok else 'NOT met':<8} {what}: {fig}")
    results["checks"] = [{"what": w, "met": bool(o), "figure": f} for w, o, f in checks]
    if args.keep:
        for r in list(lm.values()) + list(results["hand"].values()):
            r.pop("stderr", None)
            r.pop("times", None)
        for rs in (list(results["cnn"].values()) + list(results["overlap"].values()) +
                   list(results.get("local", {}).values())):
            for r in rs:
                r.pop("stderr", None)
                r.pop("times", None)
        json.dump(results, open(os.path.join(work, "results.json"), "w"), indent=1)
    else:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
