"""DCGAN (Radford et al. 2015) on scikit-learn's 8x8 digits scaled to [-1, 1]. The generator is a
Linear to 64x2x2 and two stride-2 transposed convolutions (2 -> 4 -> 8) with BatchNorm and SiLU,
tanh out; the discriminator two stride-2 convolutions with ELU and a Linear. They train
alternately with Adam (lr 2e-4, betas 0.5/0.999): a discriminator step on a real and a fake batch
(the fake detached), then a generator step through the discriminator. The noise is drawn by numpy
every step on the host.

tern.nn has no ConvTranspose2d (nor functional.conv_transpose2d), so the tern twin defines the
layer itself on tern.op.ConvTranspose with torch's parameter names and layout
(weight [in, out, k, k], bias [out]).

The activations are smooth (SiLU, ELU with alpha 1) rather than DCGAN's ReLU / LeakyReLU: at a kink
a unit within float noise (1e-7) of 0 takes a different branch in the two libraries, and with a
few such flips in 30 steps some seeds' losses drift past 1e-4; smooth ones keep every seed tried
(0-4) within 1e-6.

Compared: both losses per step, both models' final weights, samples from fixed noise and the
discriminator's scores of them.
"""
import numpy as np

import harness

STEPS = 30
BATCH = 32
NZ = 16


def make_models(B):
    nn = B.nn

    if B.is_torch:
        ConvTranspose2d = nn.ConvTranspose2d
    else:
        tern = B.lib

        class ConvTranspose2d(nn.Module):
            """torch.nn.ConvTranspose2d's layer (square kernel, no output_padding) on ONNX's operator."""

            def __init__(self, cin, cout, kernel_size, stride=1, padding=0, bias=True):
                super().__init__()
                k = kernel_size
                bound = 1.0 / np.sqrt(cout * k * k)
                init = np.random.default_rng(0)
                self.weight = tern.Parameter(init.uniform(-bound, bound, (cin, cout, k, k)).astype(np.float32))
                self.bias = tern.Parameter(init.uniform(-bound, bound, (cout,)).astype(np.float32)) if bias else None
                self.attrs = dict(kernel_shape=[k, k], strides=[stride, stride], pads=[padding] * 4)

            def forward(self, x):
                args = (x, self.weight) if self.bias is None else (x, self.weight, self.bias)
                return tern.op.ConvTranspose(*args, **self.attrs)

    class Generator(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(NZ, 64 * 2 * 2)
            self.bn0 = nn.BatchNorm2d(64)
            self.up1 = ConvTranspose2d(64, 32, 4, stride=2, padding=1, bias=False)
            self.bn1 = nn.BatchNorm2d(32)
            self.up2 = ConvTranspose2d(32, 1, 4, stride=2, padding=1)

        def forward(self, z):
            x = self.fc(z).reshape(z.shape[0], 64, 2, 2)
            x = B.F.silu(self.bn0(x))
            x = B.F.silu(self.bn1(self.up1(x)))
            return self.up2(x).tanh()

    class Discriminator(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv1 = nn.Conv2d(1, 32, 4, stride=2, padding=1)
            self.conv2 = nn.Conv2d(32, 64, 4, stride=2, padding=1, bias=False)
            self.bn2 = nn.BatchNorm2d(64)
            self.act = nn.ELU()
            self.fc = nn.Linear(64 * 2 * 2, 1)

        def forward(self, x):
            x = self.act(self.conv1(x))
            x = self.act(self.bn2(self.conv2(x)))
            return self.fc(x.reshape(x.shape[0], -1))

    class Pair(nn.Module):  # one module, so one state_dict carries both models' weights
        def __init__(self):
            super().__init__()
            self.G = Generator()
            self.D = Discriminator()

    return Pair()


def run(backend, seed):
    B = harness.backend(backend)
    F = B.F
    rng = harness.rng(seed)
    x, _ = harness.digits()
    x = x * 2.0 - 1.0

    pair = B.build(make_models, seed)
    G, D = pair.G, pair.D
    optD = B.optim.Adam(D.parameters(), lr=2e-4, betas=(0.5, 0.999))
    optG = B.optim.Adam(G.parameters(), lr=2e-4, betas=(0.5, 0.999))
    ones, zeros = B.tensor(np.ones((BATCH, 1))), B.tensor(np.zeros((BATCH, 1)))
    bce = F.binary_cross_entropy_with_logits
    timer = harness.StepTimer(B)
    losses = []
    G.train()
    D.train()
    for step in range(STEPS):
        real = B.input(x[rng.choice(len(x), BATCH, replace=False)])
        z = B.input(rng.standard_normal((BATCH, NZ)))
        with timer.step():
            # discriminator: real -> 1, fake (no gradient into G) -> 0
            optD.zero_grad(set_to_none=True)
            fake = G(z)
            loss_d = bce(D(real), ones) + bce(D(fake.detach()), zeros)
            loss_d.backward()
            optD.step()
            # generator: make D call the fakes real
            optG.zero_grad(set_to_none=True)
            loss_g = bce(D(fake), ones)
            loss_g.backward()
            optG.step()
            losses += [loss_d.item(), loss_g.item()]

    G.eval()
    D.eval()
    z = B.tensor(harness.rng(seed + 100).standard_normal((16, NZ)))
    with B.no_grad():
        samples = G(z)
        scores = D(samples)
    return harness.result(
        losses, harness.params_of(G, D, prefixes=['G.', 'D.']),
        outputs={'samples': B.numpy(samples), 'scores': B.numpy(scores)},
        step_ms=timer.median_ms())
