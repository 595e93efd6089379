"""Program 9: a GRU encoder-decoder that reverses digit strings, and a sampler on the host.

Training: each step the host draws a length (3..7) and a batch of digit strings of that length
(bucketing by length, so no padding), the encoder GRU reads them, the decoder GRU is teacher-forced
from the encoder's last state on [BOS] + reversed string and predicts reversed string + [EOS].
Decoding is a Python loop, one decoder step per token: the logits of the last step are fetched,
divided by a temperature, cut to the top k on the host with numpy, turned into probabilities in
float64 and sampled with numpy's RNG (inverse CDF of one uniform draw), until [EOS] or a length
limit: a data-dependent number of steps. Greedy (temperature 0) and sampled outputs are compared
token by token, with the probability the sampler gave each chosen token; the library's own top-k
(tern.op.TopK, torch.topk) is checked against the host's at every sampled step.
"""
import numpy as np

import harness

DIGITS, BOS, EOS = 10, 10, 11
V, E, H = 12, 16, 48
BATCH, STEPS, LR = 16, 150, 1e-2
MAX_OUT = 10
SAMPLERS = [('greedy', 0.0, 1), ('t0.7_k3', 0.7, 3), ('t1.0_k5', 1.0, 5), ('t1.5_k12', 1.5, 12)]


def factory(B):
    nn = B.nn

    class Seq2Seq(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(V, E)
            self.enc = nn.GRU(E, H, batch_first=True)
            self.dec = nn.GRU(E, H, batch_first=True)
            self.out = nn.Linear(H, V)

        def encode(self, src):
            _, h = self.enc(self.emb(src))
            return h  # [1, N, H]

        def decode(self, tokens, h):
            y, h = self.dec(self.emb(tokens), h)
            return self.out(y), h  # [N, T, V]

    return Seq2Seq()


def device_topk(B, logits, k):
    """The library's own top-k indices (tern.op.TopK, torch.topk): a cross-check of the host's."""
    if B.is_tern:
        return B.numpy(B.lib.op.TopK(logits, B.long([k]), axis=-1)[1])
    return B.numpy(logits.topk(k, -1)[1])


def sample(B, model, src, temperature, k, rng):
    """Host-side decoding of one source string: (tokens, the probabilities of the chosen tokens, the
    number of steps whose device top-k differed from the host's)."""
    with B.no_grad():
        h = model.encode(B.long(src[None]))
        tok, out, probs, differ = BOS, [], [], 0
        for _ in range(MAX_OUT):
            logits, h = model.decode(B.long([[tok]]), h)
            z = B.numpy(logits)[0, -1].astype(np.float64)
            if temperature == 0.0:
                tok = int(np.argmax(z))
                p = np.exp(z - z.max())
                p /= p.sum()
            else:
                z = z / temperature
                top = np.argsort(-z, kind='stable')[:k]  # top-k on the host
                differ += not np.array_equal(device_topk(B, logits[0, -1], k), top)
                p = np.zeros_like(z)
                p[top] = np.exp(z[top] - z[top].max())
                p /= p.sum()
                tok = int(np.searchsorted(np.cumsum(p), rng.random() * p.sum(), side='right'))
                tok = min(tok, V - 1)
            out.append(tok)
            probs.append(p[tok])
            if tok == EOS:
                break
    return np.array(out, np.int64), np.array(probs), differ


def run(backend, seed):
    B = harness.backend(backend)
    F = B.F
    rng = harness.rng(seed)
    model = B.build(factory, seed)
    # eps 1e-6, not 1e-8: a few gradients are float noise (~1e-9) at the first step, which Adam's
    # g / (|g| + eps) would turn into lr-sized, library-dependent steps
    opt = B.optim.Adam(model.parameters(), lr=LR, eps=1e-6)
    timer = harness.StepTimer(B)
    losses = []
    for step in range(STEPS):
        n = int(rng.integers(3, 8))  # this step's bucket: all strings of length n
        src = rng.integers(0, DIGITS, (BATCH, n))
        tgt = np.concatenate([src[:, ::-1], np.full((BATCH, 1), EOS)], 1)
        inp = np.concatenate([np.full((BATCH, 1), BOS), src[:, ::-1]], 1)
        with timer.step():
            logits, _ = model.decode(B.input(inp, 'int64'), model.encode(B.input(src, 'int64')))
            loss = F.cross_entropy(logits.reshape(-1, V), B.input(tgt.reshape(-1), 'int64'))
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(B.item(loss))
    outputs = {}
    correct = topk_differs = 0
    tests = [rng.integers(0, DIGITS, int(rng.integers(3, 8))) for _ in range(6)]
    for name, temperature, k in SAMPLERS:
        srng = harness.rng(seed + 1000)  # the sampler's own stream, the same for each backend
        for i, src in enumerate(tests):
            toks, probs, differ = sample(B, model, src, temperature, k, srng)
            topk_differs += differ
            outputs['%s_%d' % (name, i)] = toks
            outputs['%s_%d_p' % (name, i)] = probs
            if name == 'greedy':
                correct += list(toks) == list(src[::-1]) + [EOS]
    outputs['greedy_correct'] = '%d/%d' % (correct, len(tests))
    outputs['device_topk_differs_from_host'] = topk_differs
    return harness.result(losses, harness.params_of(model), outputs, timer.median_ms())


if __name__ == '__main__':
    r = {b: run(b, 0) for b in harness.BACKENDS}
    print('losses tern ', np.round(r['tern']['losses'][::10], 4))
    print('losses torch', np.round(r['torch']['losses'][::10], 4))
    print({k: v for k, v in r['torch']['outputs'].items() if not k.endswith('_p')})
    print('compare:', harness.compare_results(r['tern'], r['torch']) or 'agree',
          '; step ms tern %.2f torch %.2f' % (r['tern']['step_ms'], r['torch']['step_ms']))
