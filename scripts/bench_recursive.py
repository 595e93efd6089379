#!/usr/bin/env python3
"""Recursive models: tern-run's recursive TreeLSTM (scripts/make_recursive_models.py, one call a tree
node, children's calls side by side on --threads) against the same network as one Loop over the
nodes (iterative), as one Loop over the tree's heights batching each height's nodes (level by level,
TensorFlow Fold's dynamic batching for one tree), and against PyTorch eager recursion, all on the same
weights, over the trees of scripts/make_treebank.py, in one run: inference, training, and the
accuracy that training with tern-run --train reaches against a bag of words.

    .venv/bin/python scripts/bench_recursive.py [--hidden 64] [--threads 1,2] [--rounds 3]
                                               [--train-steps 2000] [--epochs 1] [--keep DIR]
                                               [--forms recursive,iterative,levels]
                                               [--models treelstm,treernn,rntn]

Inference: a tree's time is its forward pass to the root's scores (tern-run --json's per-example
latency; for PyTorch, time.perf_counter around the call under torch.no_grad), throughput the trees
over the sum of their times, over the 1101 dev trees. Training: one tree a step (the mean cross-entropy
over its nodes, Adam at 0.01), --train-steps steps on the training trees: tern-run --train's logged
trees/s after its first quarter (frames are planned then), PyTorch's the same steps timed after the
same quarter. Medians over --rounds. Accuracy (--epochs 0 skips it): the TreeLSTM trained --epochs
epochs with tern-run --train (shuffled), the test roots' sign (P(3) + P(4) > P(0) + P(1)) against
logistic regression on bags of words and adjacent pairs (make_treebank.py --check). A table per model
of --models: the TreeLSTM's over --train-steps training steps, TreeRNN's and RNTN's over
--train-steps / 4.

Unrolled (--forms unrolled, inference only): one static graph per dev tree
(make_recursive_models.py --unroll: the tree's shape is the graph's, its words an input), each run by
its own tern-run; a tree's time is what unrolling costs it: optimising the graph (tern-run -v), planning
it (plan_ms) and its one run (latency), reading the file excluded. The trees/s of the runs alone (the
graph and its plan ready, as a cache of graphs by tree shape would give at best) are printed beside.
Unrolled training (tern-autodiff on each tree's graph) is not measured. Batching of ready calls is not
measured.
"""
import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
import make_recursive_models as mr  # noqa: E402


# The forms of one model (make_recursive_models.py): the file's suffix and the inputs it reads beyond
# left, right, word, root (and label when training).
FORMS = {"recursive": ("", ()), "iterative": ("-iter", ()),
         "levels": ("-levels", ("level_order", "level_starts"))}
TREE = ("left", "right", "word", "root")


def tern_trees_per_s(args, work, threads, kind="treelstm", form="recursive"):
    split = os.path.join(work, "tb", "dev")
    suffix, extra = FORMS[form]
    cmd = [os.path.join(args.bin, "tern-run"), "--threads", str(threads), "--json",
           *[f"-i{k}={os.path.join(split, k + '.pb')}" for k in TREE + extra],
           os.path.join(work, "m", kind + suffix + ".txt")]
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode:
        sys.exit(f"bench_recursive: tern-run failed: {p.stderr[-2000:]}")
    j = json.loads(p.stdout)
    return 1000.0 / j["latency_ms"]["mean"], j["iters"]


def unrolled_trees_per_s(args, work, threads, kind="treelstm"):
    """One static graph per dev tree, each through its own tern-run: trees/s counting optimising,
    planning and the one run of each tree's graph, and trees/s of the runs alone."""
    folder = os.path.join(work, f"unrolled-{kind}")
    if not os.path.isdir(folder):
        subprocess.run([sys.executable, os.path.join(HERE, "make_recursive_models.py"), "--unroll", "--kind", kind,
                        os.path.join(work, "m"), os.path.join(work, "tb", "dev"), folder], check=True)
    n = sum(1 for f in os.listdir(folder) if f.endswith(".txt"))
    total = runs = 0.0
    for e in range(n):
        p = subprocess.run([os.path.join(args.bin, "tern-run"), "-v", "--json", "--threads", str(threads),
                            "-i", f"word={os.path.join(folder, f'{e}-word.npy')}", os.path.join(folder, f"{e}.txt")],
                           capture_output=True, text=True)
        if p.returncode:
            sys.exit(f"bench_recursive: tern-run failed on unrolled tree {e}: {p.stderr[-2000:]}")
        j = json.loads(p.stdout)
        opt = re.search(r"optimised at level \d+ in ([0-9.]+) ms", p.stderr)
        run = j["latency_ms"]["mean"]
        total += (float(opt.group(1)) if opt else 0.0) + j["plan_ms"] + run
        runs += run
    return 1000.0 * n / total, 1000.0 * n / runs


def read_split(work, split, names):
    """The treebank's SPLIT as lists, one per name, of each tree's values (Python lists)."""
    return [[a.tolist() for a in mr.read_seq(os.path.join(work, "tb", split, name + ".pb"))] for name in names]


def torch_twin(work, threads, kind, steps=None):
    """PyTorch eager recursion of make_recursive_models.py's KIND on the same weights: trees/s of
    inference over the dev trees (time.perf_counter around each tree under torch.no_grad), or, with
    steps, of training (Adam at 0.01, one tree a step, the last three quarters timed) over the
    training trees."""
    import torch
    torch.set_num_threads(threads)
    p = {k: torch.tensor(np.ascontiguousarray(v), requires_grad=steps is not None)
         for k, v in mr.load_weights(os.path.join(work, "m"), kind).items()}

    def node(k, left, right, word, label):
        return mr.torch_tree(p, kind, left, right, word, k, label)

    left, right, word, root, label = read_split(work, "dev" if steps is None else "train",
                                                ("left", "right", "word", "root", "label"))
    if steps is None:
        total = 0.0
        with torch.no_grad():
            for e in range(len(left)):
                t0 = time.perf_counter()
                h = node(root[e], left[e], right[e], word[e], None)[0]
                (h @ p["wout"] + p["bout"]).sum().item()
                total += time.perf_counter() - t0
        return len(left) / total
    opt = torch.optim.Adam(p.values(), lr=0.01)
    skip = max(1, steps // 4)
    t0 = None
    for e in range(steps):
        if e == skip:
            t0 = time.perf_counter()
        loss = node(root[e], left[e], right[e], word[e], label[e])[2] / len(left[e])
        opt.zero_grad()
        loss.backward()
        opt.step()
    return (steps - skip) / (time.perf_counter() - t0)


def split_args(work, split, keys=("left", "right", "word", "root")):
    return [f"-i{k}={os.path.join(work, 'tb', split, k + '.pb')}" for k in keys]


def tern_train_trees_per_s(args, work, threads, steps, model, form="recursive"):
    log = os.path.join(work, f"train-{threads}.jsonl")
    every = max(1, steps // 4)
    cmd = [os.path.join(args.bin, "tern-run"), "--train", "--threads", str(threads), "--steps", str(steps),
           "--log", log, "--log-every", str(every), "-q",
           *split_args(work, "train", TREE + ("label",) + FORMS[form][1]), model,
           "-o", os.path.join(work, f"trained-{threads}.onnx")]
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode:
        sys.exit(f"bench_recursive: tern-run --train failed: {p.stderr[-2000:]}")
    with open(log) as f:
        rates = [json.loads(line)["samples_per_s"] for line in f]
    return statistics.median(rates[1:]) if len(rates) > 1 else rates[0]


def accuracy(args, work, epochs, model):
    py = sys.executable
    trained = os.path.join(work, "epochs.onnx")
    t0 = time.perf_counter()
    subprocess.run([os.path.join(args.bin, "tern-run"), "--train", "--epochs", str(epochs), "--shuffle", "-q",
                    *split_args(work, "train", ("left", "right", "word", "root", "label")), model, "-o", trained],
                   check=True)
    seconds = time.perf_counter() - t0
    out = os.path.join(work, "test-out")
    shutil.rmtree(out, ignore_errors=True)
    subprocess.run([os.path.join(args.bin, "tern-run"), "-q",
                    *split_args(work, "test", ("left", "right", "word", "root", "label")), trained, "-O", out],
                   check=True)
    p = subprocess.run([py, os.path.join(HERE, "make_recursive_models.py"), "--accuracy",
                        os.path.join(work, "tb", "test"), out], check=True, capture_output=True, text=True)
    tree = float(p.stdout.split()[-1])
    with open(os.path.join(work, "tb", "stats.json")) as f:
        bow = json.load(f)["bag_of_words_bigrams_root_accuracy"]
    return tree, bow, seconds


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bin", default=os.path.join(ROOT, "build", "bin"))
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--train-steps", type=int, default=2000)
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--models", default="treelstm,treernn,rntn",
                    help="the models to measure (treernn and rntn train over --train-steps / 4 steps)")
    ap.add_argument("--forms", default="recursive,iterative,levels,unrolled",
                    help="tern's forms of the models to measure (recursive, iterative, levels, unrolled)")
    ap.add_argument("--keep")
    args = ap.parse_args()
    work = args.keep or tempfile.mkdtemp(prefix="bench_recursive.")
    py = sys.executable
    subprocess.run([py, os.path.join(HERE, "make_treebank.py"), "--check", os.path.join(work, "tb")], check=True,
                   stdout=subprocess.DEVNULL)
    subprocess.run([py, os.path.join(HERE, "make_recursive_models.py"), "--hidden", str(args.hidden),
                    os.path.join(work, "m")], check=True)
    sys.setrecursionlimit(10000)

    def train_model(kind, form):
        out = os.path.join(work, "m", f"{kind}{FORMS[form][0]}-train.onnx")
        subprocess.run([os.path.join(args.bin, "tern-autodiff"), "-q", "--loss-output", "loss", "--optimizer",
                        "adam", "--lr", "0.01", os.path.join(work, "m", f"{kind}{FORMS[form][0]}-train.txt"),
                        "-o", out], check=True)
        return out

    def med(f):
        return statistics.median([f() for _ in range(args.rounds)])

    model = train_model("treelstm", "recursive")
    forms = [f for f in args.forms.split(",") if f]
    cols = forms + ["pytorch"]
    names = {"recursive": "tern recursive", "iterative": "tern iterative (Loop over nodes)",
             "levels": "tern level-batched (Loop over heights)", "unrolled": "tern unrolled (a graph per tree)",
             "pytorch": "PyTorch eager recursion"}

    def table(kind, steps):
        rows = []
        for threads in [int(t) for t in args.threads.split(",")]:
            row = {"threads": threads}
            for form in forms:
                if form == "unrolled":
                    got = [unrolled_trees_per_s(args, work, threads, kind) for _ in range(args.rounds)]
                    row[form] = (statistics.median(g[0] for g in got), None)
                    row["unrolled_runs"] = statistics.median(g[1] for g in got)
                    continue
                m = train_model(kind, form)
                row[form] = (med(lambda: tern_trees_per_s(args, work, threads, kind, form)[0]),
                             med(lambda: tern_train_trees_per_s(args, work, threads, steps, m, form)))
            row["pytorch"] = (med(lambda: torch_twin(work, threads, kind)),
                              med(lambda: torch_twin(work, threads, kind, steps)))
            rows.append(row)
        print(f"\n{kind}, hidden {args.hidden}, generated treebank (mean 19 words a tree), one tree at a time, "
              f"medians of {args.rounds} rounds (trees/s; training {steps} steps of Adam)")
        print("| threads | " + " | ".join(f"{w}: {names[c]}" for w in ("inference", "training") for c in cols) + " |")
        print("|---:|" + "---:|" * (2 * len(cols)))
        def cell(v):
            return "—" if v is None else f"{v:.0f}"

        def ratio(a, b):
            return "—" if a is None or b is None else f"{a / b:.2f}"

        for r in rows:
            print(f"| {r['threads']} | " + " | ".join(cell(r[c][w]) for w in (0, 1) for c in cols) + " |")
        if "unrolled" in forms:
            print("unrolled, the runs alone (each tree's graph optimised and planned beforehand): " + ", ".join(
                f"{r['unrolled_runs']:.0f} trees/s at {r['threads']} thread(s)" for r in rows))
        if "recursive" in forms:
            print("recursive against each (ratio of trees/s, inference / training):")
            for r in rows:
                print(f"  {r['threads']} thread(s): " + ", ".join(
                    f"{c} {ratio(r['recursive'][0], r[c][0])} / {ratio(r['recursive'][1], r[c][1])}"
                    for c in cols if c != "recursive"), flush=True)

    for kind in [k for k in args.models.split(",") if k]:
        table(kind, args.train_steps if kind == "treelstm" else max(8, args.train_steps // 4))
    if args.epochs:
        tree, bow, seconds = accuracy(args, work, args.epochs, model)
        print(f"\nTreeLSTM trained {args.epochs} epoch(s) with tern-run --train (8544 trees, {seconds:.0f} s): test "
              f"roots' sign {tree:.4f}; bag of words and pairs (logistic regression): {bow:.4f}; "
              f"{100 * (tree - bow):+.1f} points ({'met' if tree - bow >= 0.10 else 'NOT met'}: at least +10)")
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
