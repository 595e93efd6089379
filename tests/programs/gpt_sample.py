"""A tiny GPT-2-like character model (token and position embeddings, pre-LayerNorm blocks with causal
multi-head self-attention and a GELU MLP, d=32, 2 layers, 4 heads; GPT-2's module names) trained
with Adam on harness.TEXT, then generating text with a KV cache: the prompt runs once, then one
token at a time against the keys and values of every earlier position, each layer's cache growing
by one position per step (concatenated on the host side of the loop). The next token is sampled by
numpy from the fetched probabilities (softmax of logits / temperature); generation stops at the end
token '.' or at MAX_NEW tokens. None of this -- the growing cache, the data-dependent stop, the
sampling -- is one symbolic graph.

Compared: the training loss per step, final weights, the generated tokens (exactly), the
probability of each chosen token, and the cache length at each step.
"""
import math

import numpy as np

import harness

D, LAYERS, HEADS, CTX = 32, 2, 4, 32
STEPS = 120
BATCH, T = 16, 24
MAX_NEW = 40
END = '.'
PROMPTS = [('the ', 0.8), ('a s', 1.0)]


def make_model(B, vocab):
    nn = B.nn
    lib = B.lib

    class Attention(nn.Module):
        def __init__(self):
            super().__init__()
            # no bias: the key bias's gradient is exactly 0 in exact arithmetic (softmax ignores a
            # per-query constant), so both libraries' float noise there would become Adam steps
            self.c_attn = nn.Linear(D, 3 * D, bias=False)
            self.c_proj = nn.Linear(D, D)

        def forward(self, x, past=None, mask=None):
            n, t, c = x.shape
            hd = c // HEADS
            qkv = self.c_attn(x)
            q, k, v = qkv[:, :, :c], qkv[:, :, c:2 * c], qkv[:, :, 2 * c:]
            q, k, v = [a.reshape(n, t, HEADS, hd).transpose(1, 2) for a in (q, k, v)]
            if past is not None:                       # the KV cache: earlier positions' keys, values
                k = lib.cat([past[0], k], dim=2)
                v = lib.cat([past[1], v], dim=2)
            att = (q @ k.transpose(2, 3)) * (1.0 / math.sqrt(hd))
            if mask is not None:
                att = att + mask
            y = B.F.softmax(att, dim=-1) @ v
            y = y.transpose(1, 2).reshape(n, t, c)
            return self.c_proj(y), (k, v)

    class MLP(nn.Module):
        def __init__(self):
            super().__init__()
            self.c_fc = nn.Linear(D, 4 * D)
            self.act = nn.GELU(approximate='tanh')
            self.c_proj = nn.Linear(4 * D, D)

        def forward(self, x):
            return self.c_proj(self.act(self.c_fc(x)))

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln_1 = nn.LayerNorm(D)
            self.attn = Attention()
            self.ln_2 = nn.LayerNorm(D)
            self.mlp = MLP()

        def forward(self, x, past=None, mask=None):
            a, present = self.attn(self.ln_1(x), past, mask)
            x = x + a
            return x + self.mlp(self.ln_2(x)), present

    class GPT(nn.Module):
        def __init__(self):
            super().__init__()
            self.wte = nn.Embedding(vocab, D)
            self.wpe = nn.Embedding(CTX, D)
            self.h = nn.ModuleList([Block() for _ in range(LAYERS)])
            self.ln_f = nn.LayerNorm(D)
            self.lm_head = nn.Linear(D, vocab, bias=False)

        def forward(self, idx, start=0, past=None):
            """idx int64 [N, t] at positions start..start+t-1; past: per layer (k, v) or None.
            Returns logits [N, t, vocab] and the new cache."""
            n, t = idx.shape
            pos = B.long(np.arange(start, start + t)[None, :])
            x = self.wte(idx) + self.wpe(pos)
            mask = None
            if t > 1:  # causal within the new positions (a cached prefix is all visible)
                m = np.triu(np.full((t, start + t), -1e9, np.float32), k=start + 1)
                mask = B.tensor(m)
            presents = []
            for i, blk in enumerate(self.h):
                x, kv = blk(x, None if past is None else past[i], mask)
                presents.append(kv)
            return self.lm_head(self.ln_f(x)), presents

    return GPT()


def run(backend, seed):
    B = harness.backend(backend)
    F = B.F
    rng = harness.rng(seed)
    text = harness.TEXT
    chars = sorted(set(text))
    stoi = {c: i for i, c in enumerate(chars)}
    data = np.array([stoi[c] for c in text], np.int64)
    V = len(chars)

    model = B.build(lambda b: make_model(b, V), seed)
    opt = B.optim.Adam(model.parameters(), lr=3e-3)
    timer = harness.StepTimer(B)
    losses = []
    model.train()
    for step in range(STEPS):
        starts = rng.integers(0, len(data) - T - 1, BATCH)
        xb = np.stack([data[s:s + T] for s in starts])
        yb = np.stack([data[s + 1:s + T + 1] for s in starts])
        with timer.step():
            opt.zero_grad(set_to_none=True)
            logits, _ = model(B.input(xb, 'int64'))
            loss = F.cross_entropy(logits.reshape(BATCH * T, V), B.input(yb.reshape(-1), 'int64'))
            loss.backward()
            opt.step()
            losses.append(loss.item())

    # generation with a KV cache, sampling on the host
    model.eval()
    sample_rng = harness.rng(seed + 7)
    outputs = {}
    for j, (prompt, temp) in enumerate(PROMPTS):
        toks = [stoi[c] for c in prompt]
        chosen_p, cache_len = [], []
        gt = harness.StepTimer(B)  # each generated token is one tern.step() too (not reported)
        with B.no_grad():
            logits, past = model(B.long([toks]))              # the prompt, once
            pos = len(toks)
            while len(toks) - len(prompt) < MAX_NEW and pos < CTX:
                with gt.step():
                    last = logits[:, -1, :] * (1.0 / temp)
                    p = B.numpy(F.softmax(last, dim=-1))[0].astype(np.float64)
                    p /= p.sum()
                    tok = int(sample_rng.choice(V, p=p))
                    toks.append(tok)
                    chosen_p.append(p[tok])
                    if chars[tok] == END:
                        break
                    logits, past = model(B.long([[tok]]), start=pos, past=past)
                    pos += 1
                    cache_len.append(int(past[0][0].shape[2]))
        outputs['text%d' % j] = ''.join(chars[t] for t in toks)
        outputs['tokens%d' % j] = np.array(toks, np.int64)
        outputs['chosen_p%d' % j] = np.array(chosen_p)
        outputs['cache_len%d' % j] = np.array(cache_len, np.int64)
        # the cache is exact: the last logits again, from the whole sequence in one causal pass
        if chars[toks[-1]] != END and len(toks) <= CTX:
            with B.no_grad():
                ref, _ = model(B.long([toks]))
            err = float(np.max(np.abs(B.numpy(logits)[0, -1] - B.numpy(ref)[0, -1])))
            if err > 1e-4:
                raise AssertionError('%s: KV-cached logits differ from a full pass by %g' % (backend, err))
    return harness.result(losses, harness.params_of(model), outputs=outputs, step_ms=timer.median_ms())
