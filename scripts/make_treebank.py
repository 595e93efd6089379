#!/usr/bin/env python3
"""A generated sentiment treebank, for the recursive models: binary parse trees of sentences from a
small grammar whose sentiment composes along the parse (negation flips and damps its scope,
intensifiers strengthen it, "but" gives the clause after it the say), with a label at every node.

    make_treebank.py [--seed 0] [--train 8544] [--dev 1101] [--test 2210] [--check] DIR

writes DIR/{train,dev,test}/ with one ONNX SequenceProto file per input, one tree an example (the
form tern-run(1) reads as EXAMPLES OF THEIR OWN SIZES), nodes numbered children first, the root last:

    left.pb, right.pb   int64 [nodes]  each node's children (-1 for a leaf)
    word.pb             int64 [nodes]  a leaf's word id (0, the padding word, for inner nodes)
    label.pb            int64 [nodes]  the node's sentiment class, 0 (very negative) to 4 (very positive)
    root.pb             int64 []       the root's index (nodes - 1)
    sign.pb             int64 []       the root's sign (1 positive, 0 not), the binary task's answer
    level_order.pb      int64 [nodes]  the nodes by height (leaves 0, a parent one above its taller
                                       child), for level-by-level batching
    level_starts.pb     int64 [heights + 1]  where each height starts in level_order, then nodes

and DIR/vocab.txt (one word a line, id = line number - 1) and DIR/stats.json (sizes, lengths, depths,
label counts). Split sizes default to the Stanford Sentiment Treebank's; sentence lengths follow a
gamma distribution of mean 19 and standard deviation 9 words, cut to 2..56 (SST's sentences are 19
words on average, at most 56); a tree's shape comes from the grammar.

--check trains scikit-learn's logistic regression on bags of words (counts of each word, and of each
pair of adjacent words) for the root's positive/negative sign and prints its test accuracy beside that
of the composition the labels come from (100 % by construction): the gap is what a tree model can win
and a bag of words cannot. --check-tree EPOCHS also trains a binary TreeLSTM in PyTorch (Tai et al.'s
N-ary form, 64 units, Adam, all nodes' labels, trees batched 25 at a time level by level) and prints its
test roots' sign accuracy after each epoch: that a tree model can learn the labels.
"""
import argparse
import json
import os

import numpy as np

# Words by role, with a leaf's sentiment in [-1, 1] for the sentiment words.
POSITIVE = {"good": 0.5, "nice": 0.4, "fine": 0.3, "pleasant": 0.4, "solid": 0.3, "clever": 0.5, "funny": 0.5,
            "charming": 0.6, "moving": 0.6, "great": 0.8, "superb": 0.9, "brilliant": 0.9, "wonderful": 0.9,
            "masterful": 0.9, "delightful": 0.8, "gripping": 0.7, "touching": 0.6, "smart": 0.5, "fresh": 0.4,
            "beautiful": 0.8}
NEGATIVE = {"bad": -0.5, "dull": -0.5, "flat": -0.4, "weak": -0.4, "tired": -0.4, "silly": -0.3, "messy": -0.4,
            "boring": -0.6, "awful": -0.9, "terrible": -0.9, "dreadful": -0.9, "painful": -0.7, "lifeless": -0.7,
            "clumsy": -0.5, "bland": -0.4, "stale": -0.5, "pointless": -0.7, "tedious": -0.6, "ugly": -0.6,
            "hollow": -0.5}
NEGATORS = ["not", "never", "hardly", "barely"]
INTENSIFIERS = ["very", "really", "truly", "extremely", "remarkably"]
CONTRAST = ["but", "yet", "though"]
NEUTRAL_N = ["film", "movie", "story", "plot", "cast", "script", "director", "acting", "ending", "score",
             "picture", "drama", "comedy", "performance", "screenplay", "dialogue", "camera", "scene", "hero",
             "villain", "music", "pace", "premise", "tone", "humor", "audience", "character", "effects", "sequel",
             "genre"]
NEUTRAL_V = ["is", "was", "seems", "feels", "looks", "remains", "becomes", "proves", "sounds", "plays"]
FUNCTION = ["the", "a", "this", "its", "of", "and", "in", "with", "to", "as", "for", "at", "on", "by", "it"]


def vocab():
    words = ["<pad>"] + sorted(POSITIVE) + sorted(NEGATIVE) + NEGATORS + INTENSIFIERS + CONTRAST + NEUTRAL_N + \
        NEUTRAL_V + FUNCTION
    return words, {w: i for i, w in enumerate(words)}


class Tree:
    """Nodes children first; value[i] the sentiment of node i's phrase."""

    def __init__(self):
        self.left, self.right, self.word, self.value = [], [], [], []

    def leaf(self, w, v=0.0):
        self.left.append(-1)
        self.right.append(-1)
        self.word.append(w)
        self.value.append(v)
        return len(self.value) - 1

    def node(self, a, b, v):
        self.left.append(a)
        self.right.append(b)
        self.word.append(0)
        self.value.append(float(np.clip(v, -1.0, 1.0)))
        return len(self.value) - 1


def phrase(t, n, r, ids):
    """A phrase of n words; returns its node."""
    if n == 1:
        u = r.random()
        if u < 0.3:
            w = r.choice(list(POSITIVE) + list(NEGATIVE))
            return t.leaf(ids[w], POSITIVE.get(w, NEGATIVE.get(w)))
        pool = NEUTRAL_N if u < 0.65 else (NEUTRAL_V if u < 0.75 else FUNCTION)
        return t.leaf(ids[r.choice(pool)])
    u = r.random()
    if u < 0.14:  # (not X): the scope's sentiment flipped and damped
        a = t.leaf(ids[r.choice(NEGATORS)])
        b = phrase(t, n - 1, r, ids)
        return t.node(a, b, -0.7 * t.value[b])
    if u < 0.26:  # (very X): strengthened
        a = t.leaf(ids[r.choice(INTENSIFIERS)])
        b = phrase(t, n - 1, r, ids)
        return t.node(a, b, 1.6 * t.value[b])
    if u < 0.36 and n >= 5:  # ((X but) Y): Y has the say, X a little
        k = int(r.integers(2, n - 2))
        x = phrase(t, k, r, ids)
        xb = t.node(x, t.leaf(ids[r.choice(CONTRAST)]), t.value[x])
        y = phrase(t, n - k - 1, r, ids)
        return t.node(xb, y, t.value[y] + 0.15 * t.value[x])
    # a plain phrase: the sum of its parts, split where the grammar leans (right-branching mostly)
    k = int(r.integers(1, n)) if r.random() < 0.4 else max(1, min(n - 1, int(r.integers(1, 3))))
    a, b = phrase(t, k, r, ids), phrase(t, n - k, r, ids)
    return t.node(a, b, t.value[a] + t.value[b])


def label_of(v):
    """Five classes, as SST's: cut points at -0.6, -0.2, 0.2, 0.6."""
    return int(np.searchsorted([-0.6, -0.2, 0.2, 0.6], v, side="right"))


def depth_of(t, i):
    d = [0] * len(t.value)
    for k in range(len(t.value)):  # children first
        if t.left[k] >= 0:
            d[k] = 1 + max(d[t.left[k]], d[t.right[k]])
    return d[i]


def make_tree(r, ids):
    while True:
        n = int(np.clip(round(r.gamma(shape=(19 / 9) ** 2, scale=81 / 19)), 2, 56))
        t = Tree()
        root = phrase(t, n, r, ids)
        if abs(t.value[root]) > 0.05:  # a root with a sign (SST's binary task drops neutral ones too)
            return t, root, n


def write_split(folder, trees):
    import onnx
    from onnx import numpy_helper as nh
    os.makedirs(folder, exist_ok=True)
    fields = {"left": [], "right": [], "word": [], "label": [], "root": [], "sign": [], "level_order": [],
              "level_starts": []}
    for t, root, _ in trees:
        # the level-by-level schedule (make_recursive_models.py's KIND-levels.txt): the nodes by height
        # (leaves 0, a parent one above its taller child), and where each height starts in that order
        height = [0] * len(t.left)
        for k, (a, b) in enumerate(zip(t.left, t.right)):  # children come before their parent
            height[k] = 0 if a < 0 else 1 + max(height[a], height[b])
        order = sorted(range(len(height)), key=lambda k: (height[k], k))
        fields["level_order"].append(np.array(order, np.int64))
        fields["level_starts"].append(np.searchsorted([height[k] for k in order], np.arange(max(height) + 2)))
        fields["left"].append(np.array(t.left, np.int64))
        fields["right"].append(np.array(t.right, np.int64))
        fields["word"].append(np.array(t.word, np.int64))
        fields["label"].append(np.array([label_of(v) for v in t.value], np.int64))
        fields["root"].append(np.array(root, np.int64))
        fields["sign"].append(np.array(int(t.value[root] > 0), np.int64))  # the binary task's answer
    for name, items in fields.items():
        seq = onnx.SequenceProto(name=name, elem_type=onnx.SequenceProto.TENSOR)
        seq.tensor_values.extend(nh.from_array(a) for a in items)
        tmp = os.path.join(folder, name + ".pb.tmp")
        with open(tmp, "wb") as f:
            f.write(seq.SerializeToString())
        os.replace(tmp, os.path.join(folder, name + ".pb"))


def words_of(t):
    return [w for w, a in zip(t.word, t.left) if a < 0]


def check(splits, words):
    """Bag of words (and adjacent pairs) against the root's sign, logistic regression."""
    from sklearn.feature_extraction.text import CountVectorizer
    from sklearn.linear_model import LogisticRegression

    def docs(trees):
        return [" ".join(words[w] for w in words_of(t)) for t, _, _ in trees]

    def signs(trees):
        return np.array([t.value[root] > 0 for t, root, _ in trees])

    vec = CountVectorizer(ngram_range=(1, 2), token_pattern=r"[^ ]+")
    xtr = vec.fit_transform(docs(splits["train"]))
    clf = LogisticRegression(max_iter=2000, C=1.0).fit(xtr, signs(splits["train"]))
    acc = float((clf.predict(vec.transform(docs(splits["test"]))) == signs(splits["test"])).mean())
    return {"bag_of_words_bigrams_root_accuracy": round(acc, 4), "composition_root_accuracy": 1.0}


def check_tree(splits, n_words, epochs, seed):
    """A binary TreeLSTM on every node's label; the test roots' sign from P(3) + P(4) > P(0) + P(1)."""
    import torch
    from torch import nn
    torch.manual_seed(seed)
    H = 64

    class TreeLSTM(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(n_words, H)
            self.leaf = nn.Linear(H, 3 * H)
            self.inner = nn.Linear(2 * H, 5 * H)  # i, f_left, f_right, o, u
            self.out = nn.Linear(H, 5)

        def forward(self, trees):
            left = torch.cat([torch.tensor(t.left) + (torch.tensor(t.left) >= 0) * off
                              for (t, _, _), off in zip(trees, offsets(trees))])
            right = torch.cat([torch.tensor(t.right) + (torch.tensor(t.right) >= 0) * off
                               for (t, _, _), off in zip(trees, offsets(trees))])
            word = torch.cat([torch.tensor(t.word) for t, _, _ in trees])
            n = len(word)
            height = torch.zeros(n, dtype=torch.long)
            for k in range(n):  # children first within each tree
                if left[k] >= 0:
                    height[k] = 1 + torch.maximum(height[left[k]], height[right[k]])
            h = torch.zeros(n, H)
            c = torch.zeros(n, H)
            leaves = (left < 0).nonzero().squeeze(1)
            i, o, u = self.leaf(self.emb(word[leaves])).chunk(3, 1)
            c = c.index_copy(0, leaves, torch.sigmoid(i) * torch.tanh(u))
            h = h.index_copy(0, leaves, torch.sigmoid(o) * torch.tanh(c[leaves]))
            for level in range(1, int(height.max()) + 1):
                at = (height == level).nonzero().squeeze(1)
                l, r = left[at], right[at]
                i, fl, fr, o, u = self.inner(torch.cat([h[l], h[r]], 1)).chunk(5, 1)
                cn = torch.sigmoid(i) * torch.tanh(u) + torch.sigmoid(fl) * c[l] + torch.sigmoid(fr) * c[r]
                c = c.index_copy(0, at, cn)
                h = h.index_copy(0, at, torch.sigmoid(o) * torch.tanh(cn))
            return self.out(h)

    def offsets(trees):
        out, at = [], 0
        for t, _, _ in trees:
            out.append(at)
            at += len(t.value)
        return out

    def labels(trees):
        return torch.tensor([label_of(v) for t, _, _ in trees for v in t.value])

    model = TreeLSTM()
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    train, test = splits["train"], splits["test"]
    order = np.random.default_rng(seed).permutation(len(train))
    accs = []
    for epoch in range(epochs):
        model.train()
        for b in range(0, len(train), 25):
            batch = [train[k] for k in order[b:b + 25]]
            loss = nn.functional.cross_entropy(model(batch), labels(batch))
            opt.zero_grad()
            loss.backward()
            opt.step()
        model.eval()
        right = 0
        with torch.no_grad():
            for b in range(0, len(test), 100):
                batch = test[b:b + 100]
                p = torch.softmax(model(batch), 1)
                for (t, root, _), off in zip(batch, offsets(batch)):
                    q = p[off + root]
                    right += bool(q[3] + q[4] > q[0] + q[1]) == (t.value[root] > 0)
        accs.append(round(right / len(test), 4))
        print(f"TreeLSTM epoch {epoch + 1}: test roots' sign {accs[-1]:.4f}", flush=True)
    return {"treelstm_root_accuracy_by_epoch": accs}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("dir")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--train", type=int, default=8544)
    ap.add_argument("--dev", type=int, default=1101)
    ap.add_argument("--test", type=int, default=2210)
    ap.add_argument("--check", action="store_true")
    ap.add_argument("--check-tree", type=int, default=0, metavar="EPOCHS")
    a = ap.parse_args()
    words, ids = vocab()
    r = np.random.default_rng(a.seed)
    splits = {s: [make_tree(r, ids) for _ in range(getattr(a, s))] for s in ("train", "dev", "test")}
    os.makedirs(a.dir, exist_ok=True)
    for s, trees in splits.items():
        write_split(os.path.join(a.dir, s), trees)
    with open(os.path.join(a.dir, "vocab.txt"), "w") as f:
        f.writelines(w + "\n" for w in words)
    lengths = np.array([n for t in splits["train"] for n in [t[2]]])
    depths = np.array([depth_of(t, root) for t, root, _ in splits["train"]])
    labels = np.bincount([label_of(v) for t, _, _ in splits["train"] for v in t.value], minlength=5)
    stats = {"trees": {s: len(v) for s, v in splits.items()}, "vocab": len(words),
             "train_length": {"mean": round(float(lengths.mean()), 2), "sd": round(float(lengths.std()), 2),
                              "min": int(lengths.min()), "max": int(lengths.max())},
             "train_depth": {"mean": round(float(depths.mean()), 2), "sd": round(float(depths.std()), 2),
                             "min": int(depths.min()), "max": int(depths.max())},
             "train_node_labels": labels.tolist()}
    if a.check:
        stats.update(check(splits, words))
    if a.check_tree:
        stats.update(check_tree(splits, len(words), a.check_tree, a.seed))
    with open(os.path.join(a.dir, "stats.json"), "w") as f:
        json.dump(stats, f, indent=1)
    print(json.dumps(stats))


if __name__ == "__main__":
    main()
