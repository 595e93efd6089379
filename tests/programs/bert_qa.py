"""Program 8: a small BERT-like encoder for extractive question answering on a toy corpus.

Host side, in plain Python: a templated corpus of little stories ("alice lives in paris . bob
likes green tea . ..."), questions about them ("what does bob like ?" -> "green tea"), a regex
word tokeniser, a word-level vocabulary built from the corpus, [CLS] question [SEP] context [SEP]
packing with segment ids, padding masks, and the answer's token span. The encoder: token, position
and segment embeddings, LayerNorm, two post-LN transformer layers (nn.MultiheadAttention with a key
padding mask, GELU feed-forward), a start/end head. The loss is cross-entropy of the start and end
positions over the context tokens (others masked on the host). After training, the start and end
logits are fetched and the span chosen on the host (argmax of start + end with start <= end and at
most MAX_ANSWER tokens, inside the context), compared as token positions and as answer strings.
"""
import re

import numpy as np

import harness

NAMES = ['alice', 'bob', 'carol', 'dave', 'erin', 'frank', 'grace', 'heidi']
CITIES = ['paris', 'rome', 'tokyo', 'cairo', 'lima', 'oslo', 'new york', 'hong kong']
COLOURS = ['red', 'green', 'blue', 'yellow']
THINGS = ['apples', 'tea', 'cars', 'hats', 'books']
D, HEADS, FF, LAYERS, MAXPOS = 32, 4, 64, 2, 64
BATCH, STEPS, LR = 16, 100, 3e-3
MAX_ANSWER = 4
PAD, CLS, SEP, UNK = '[PAD]', '[CLS]', '[SEP]', '[UNK]'


# ---------------------------------------------------------------- host-side text processing

def tokenize(text):
    return re.findall(r"[a-z]+|[^\sa-z]", text.lower())


def make_example(r):
    """(question, context, answer) from Python's random.Random r."""
    while True:  # until the story has a question with one answer
        people = r.sample(NAMES, 3)
        facts, qas = [], []
        for p in people:
            if r.random() < 0.5:
                city = r.choice(CITIES)
                facts.append('%s lives in %s .' % (p, city))
                qas.append(('where does %s live ?' % p, city, city))
                qas.append(('who lives in %s ?' % city, p, city))
            else:
                thing = '%s %s' % (r.choice(COLOURS), r.choice(THINGS))
                facts.append('%s likes %s .' % (p, thing))
                qas.append(('what does %s like ?' % p, thing, thing))
        r.shuffle(facts)
        context = ' '.join(facts)
        # only questions with one answer in this story: the answer and the fact's key occur once
        once = lambda w: (' %s ' % context).count(' %s ' % w) == 1  # noqa: E731
        qas = [(q, a) for q, a, key in qas if once(a) and once(key)]
        if qas:
            break
    q, a = r.choice(qas)
    return q, context, a


def build_vocab():
    words = set()
    for text in NAMES + CITIES + COLOURS + THINGS + ['lives in likes where does live who what like . ?']:
        words.update(tokenize(text))
    return {w: i for i, w in enumerate([PAD, CLS, SEP, UNK] + sorted(words))}


def encode(vocab, examples):
    """Token ids, segment ids, padding mask (True where padded), context mask, answer spans."""
    rows = []
    for q, c, a in examples:
        qt, ct, at = tokenize(q), tokenize(c), tokenize(a)
        toks = [CLS] + qt + [SEP] + ct + [SEP]
        seg = [0] * (len(qt) + 2) + [1] * (len(ct) + 1)
        off = len(qt) + 2
        start = next(i for i in range(len(ct)) if ct[i:i + len(at)] == at) + off
        rows.append(([vocab.get(t, vocab[UNK]) for t in toks], seg, off, off + len(ct), (start, start + len(at) - 1),
                     toks))
    n = max(len(r[0]) for r in rows)
    ids = np.zeros((len(rows), n), np.int64)
    segs = np.zeros((len(rows), n), np.int64)
    pad = np.ones((len(rows), n), bool)
    ctx = np.zeros((len(rows), n), bool)
    spans = np.zeros((len(rows), 2), np.int64)
    for b, (t, s, c0, c1, sp, _) in enumerate(rows):
        ids[b, :len(t)], segs[b, :len(t)], pad[b, :len(t)] = t, s, False
        ctx[b, c0:c1] = True
        spans[b] = sp
    return ids, segs, pad, ctx, spans, [r[5] for r in rows]


def best_span(start, end, ctx):
    """Host side: (i, j) maximising start[i] + end[j] with i <= j < i + MAX_ANSWER, both in the context."""
    best, arg = -np.inf, (0, 0)
    pos = np.nonzero(ctx)[0]
    for i in pos:
        for j in range(i, min(i + MAX_ANSWER, pos[-1] + 1)):
            v = start[i] + end[j]
            if v > best:
                best, arg = v, (int(i), int(j))
    return arg


# ---------------------------------------------------------------- the model (either library)

def factory(B, vocab_size):
    nn = B.nn

    class Layer(nn.Module):
        def __init__(self, last):
            super().__init__()
            # bias=False: the key projection's bias has an exactly zero gradient (softmax is shift
            # invariant), so Adam would turn each library's float noise there into lr-sized steps
            self.attn = nn.MultiheadAttention(D, HEADS, bias=False, batch_first=True)
            self.ln1 = nn.LayerNorm(D)
            self.ff1 = nn.Linear(D, FF)
            self.ff2 = nn.Linear(FF, D)
            # the last LayerNorm's bias (and a bias of the start/end head) would only shift all
            # positions' logits alike: zero gradient, and Adam amplifies the float noise there
            self.ln2 = nn.LayerNorm(D, elementwise_affine=not last)

        def forward(self, x, pad):
            a, _ = self.attn(x, x, x, key_padding_mask=pad, need_weights=False)
            x = self.ln1(x + a)
            return self.ln2(x + self.ff2(B.F.gelu(self.ff1(x))))

    class BertQA(nn.Module):
        def __init__(self):
            super().__init__()
            self.tok = nn.Embedding(vocab_size, D)
            self.pos = nn.Embedding(MAXPOS, D)
            self.seg = nn.Embedding(2, D)
            self.ln = nn.LayerNorm(D)
            self.layers = nn.ModuleList([Layer(i == LAYERS - 1) for i in range(LAYERS)])
            self.qa = nn.Linear(D, 2, bias=False)

        def forward(self, ids, segs, positions, pad):
            x = self.ln(self.tok(ids) + self.pos(positions) + self.seg(segs))
            for layer in self.layers:
                x = layer(x, pad)
            logits = self.qa(x)  # [N, L, 2]
            return logits[:, :, 0], logits[:, :, 1]

    return BertQA()


def run(backend, seed):
    B = harness.backend(backend)
    F = B.F
    r = harness.pyrandom(seed)
    vocab = build_vocab()
    model = B.build(lambda b: factory(b, len(vocab)), seed)
    opt = B.optim.Adam(model.parameters(), lr=LR)
    timer = harness.StepTimer(B)

    def forward(ids, segs, pad, ctx):
        n, L = ids.shape
        s, e = model(B.input(ids, 'int64'), B.input(segs, 'int64'), B.long(np.broadcast_to(np.arange(L), (n, L))),
                     B.input(pad, 'bool'))
        off = B.tensor(np.where(ctx, 0.0, -1e4))  # only context tokens can start or end the answer
        return s + off, e + off

    losses = []
    for step in range(STEPS):
        ids, segs, pad, ctx, spans, _ = encode(vocab, [make_example(r) for _ in range(BATCH)])
        with timer.step():
            s, e = forward(ids, segs, pad, ctx)
            loss = (F.cross_entropy(s, B.input(spans[:, 0], 'int64')) + F.cross_entropy(e, B.input(spans[:, 1], 'int64'))) / 2
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(B.item(loss))
    # no model.eval() (nothing here depends on the mode): torch 1.13's MultiheadAttention fast path
    # for eval mode fails without biases (_native_multi_head_attention wants qkv_bias)
    test = [make_example(r) for _ in range(24)]
    ids, segs, pad, ctx, spans, toks = encode(vocab, test)
    with B.no_grad():
        s, e = forward(ids, segs, pad, ctx)
    s, e = B.numpy(s).astype(np.float64), B.numpy(e).astype(np.float64)
    chosen = np.array([best_span(s[b], e[b], ctx[b]) for b in range(len(test))], np.int64)
    answers = [' '.join(toks[b][i:j + 1]) for b, (i, j) in enumerate(chosen)]
    exact = sum(a == t[2] for a, t in zip(answers, test))
    outputs = {'spans': chosen, 'answers': np.array(answers), 'exact_match': '%d/%d' % (exact, len(test)),
               'start_logits': np.where(ctx, s, 0.0).astype(np.float32)}
    return harness.result(losses, harness.params_of(model), outputs, timer.median_ms())


if __name__ == '__main__':
    res = {b: run(b, 0) for b in harness.BACKENDS}
    print('losses tern ', np.round(res['tern']['losses'], 4))
    print('losses torch', np.round(res['torch']['losses'], 4))
    print(res['torch']['outputs']['answers'][:8], res['torch']['outputs']['exact_match'])
    print('compare:', harness.compare_results(res['tern'], res['torch']) or 'agree',
          '; step ms tern %.2f torch %.2f' % (res['tern']['step_ms'], res['torch']['step_ms']))
