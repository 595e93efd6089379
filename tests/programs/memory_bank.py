"""Program 10: contrastive learning with a memory bank held in a Python list, MoCo-style.

Synthetic data: points around 12 random prototypes in 16 dimensions; two views of each point made
on the host (Gaussian noise and a random feature-drop mask from numpy's RNG). A query encoder (MLP,
L2-normalised output) and a key encoder that follows it by an exponential moving average, updated
parameter by parameter in Python under no_grad. Past key batches are kept in a Python list of
tensors (a FIFO memory bank, list.append / list.pop(0)); each step random.sample picks host-computed
positions (bank entry, row) of negatives, the rows are gathered from the listed tensors and
concatenated, and an InfoNCE loss (positive key vs the sampled negatives) is minimised. The global
gradient norm is fetched with .item() and, only when it exceeds MAX_NORM, the gradients are scaled
in Python. At the end the embeddings of test points retrieve their nearest training point; the
retrieved indices, the clip decisions and the norms are compared.
"""
import numpy as np

import harness

DIM_IN, HID, DIM = 16, 64, 32
CLUSTERS, BATCH, BANK, NEG = 12, 32, 8, 64
STEPS, LR, TAU, EMA = 100, 0.05, 0.2, 0.9
MAX_NORM = 0.8


def factory(B):
    nn = B.nn

    class Encoder(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc1 = nn.Linear(DIM_IN, HID)
            self.fc2 = nn.Linear(HID, DIM)

        def forward(self, x):
            return B.F.normalize(self.fc2(B.F.gelu(self.fc1(x))), dim=1)

    return Encoder()


def views(rng, protos, n):
    labels = rng.integers(0, CLUSTERS, n)
    x = protos[labels] + 0.4 * rng.normal(size=(n, DIM_IN))

    def view():
        keep = rng.random((n, DIM_IN)) > 0.15
        return (x + 0.2 * rng.normal(size=x.shape)) * keep

    return view(), view(), labels


def run(backend, seed):
    B = harness.backend(backend)
    F = B.F
    rng = harness.rng(seed)
    pyr = harness.pyrandom(seed)
    protos = rng.normal(size=(CLUSTERS, DIM_IN))
    query = B.build(factory, seed)
    key = B.build(factory, seed)  # the same initial weights as the query encoder
    for p in key.parameters():
        p.requires_grad_(False)
    params = list(query.parameters())
    opt = B.optim.SGD(params, lr=LR, momentum=0.9)
    bank = []  # a Python list of [BATCH, DIM] key tensors, oldest first
    timer = harness.StepTimer(B)
    losses, norms, clipped, n_neg = [], [], [], []
    for step in range(STEPS):
        xq, xk, _ = views(rng, protos, BATCH)
        with timer.step():
            q = query(B.input(xq))
            with B.no_grad():
                k = key(B.input(xk))
            pos = (q * k).sum(1).reshape(BATCH, 1)
            if bank:
                # negatives: host-chosen (entry, row) positions in the Python list of tensors
                picks = sorted(pyr.sample(range(len(bank) * BATCH), min(NEG, len(bank) * BATCH)))
                rows = {}
                for p in picks:
                    rows.setdefault(p // BATCH, []).append(p % BATCH)
                negs = B.lib.cat([bank[i][B.long(r)] for i, r in sorted(rows.items())], 0)
                logits = B.lib.cat([pos, q @ negs.transpose(0, 1)], 1) / TAU
                n_neg.append(len(picks))
            else:
                logits = B.lib.cat([pos, q @ k.transpose(0, 1)], 1) / TAU  # first step: in-batch
                n_neg.append(BATCH)
            loss = F.cross_entropy(logits, B.long(np.zeros(BATCH)))
            opt.zero_grad()
            loss.backward()
            # clip only when the fetched global norm is above the bound
            norm = sum((p.grad * p.grad).sum() for p in params).sqrt().item()
            norms.append(norm)
            clipped.append(norm > MAX_NORM)
            if norm > MAX_NORM:
                scale = MAX_NORM / (norm + 1e-6)
                for p in params:
                    p.grad = p.grad * scale
            opt.step()
            with B.no_grad():  # the key encoder follows the query encoder
                for pk, pq in zip(key.parameters(), query.parameters()):
                    pk.copy_(pk * EMA + pq * (1.0 - EMA))
            bank.append(k)
            if len(bank) > BANK:
                bank.pop(0)
            losses.append(B.item(loss))
    # retrieval: nearest training point (cosine) of each test point, and whether it shares the cluster
    xtr, _, ltr = views(rng, protos, 96)
    xte, _, lte = views(rng, protos, 24)
    with B.no_grad():
        sims = B.numpy(query(B.tensor(xte)) @ query(B.tensor(xtr)).transpose(0, 1))
    nearest = sims.argmax(1)
    outputs = {'grad_norms': np.array(norms, np.float32), 'clipped': np.array(clipped), 'negatives': np.array(n_neg),
               'nearest': nearest.astype(np.int64),
               'retrieval_accuracy': '%d/%d' % (int(np.sum(ltr[nearest] == lte)), len(lte))}
    return harness.result(losses, harness.params_of(query, key, prefixes=['query.', 'key.']), outputs,
                          timer.median_ms())


if __name__ == '__main__':
    r = {b: run(b, 0) for b in harness.BACKENDS}
    print('losses tern ', np.round(r['tern']['losses'][::10], 4))
    print('losses torch', np.round(r['torch']['losses'][::10], 4))
    o = r['torch']['outputs']
    print('clipped %d of %d; norms %s; retrieval %s' % (o['clipped'].sum(), len(o['clipped']),
                                                         np.round(o['grad_norms'][::10], 3), o['retrieval_accuracy']))
    print('compare:', harness.compare_results(r['tern'], r['torch']) or 'agree',
          '; step ms tern %.2f torch %.2f' % (r['tern']['step_ms'], r['torch']['step_ms']))
