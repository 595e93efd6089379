#!/usr/bin/env python3
"""Co-execution against eager tern and PyTorch, in one run: for each of tests/programs' programs,
the median step time (as the program measures it) of eager tern, of the program under
`tern-trace --coexec` (its first K steps traced, every later one checked against the graph) and of
its PyTorch twin, at each thread count. The three take turns over --rounds rounds (five by default:
one run of a program moves by a fifth on a noisy machine, a co-executed one, on two cores, by more
where the machine takes time from either), in the reverse order every other round. Each time is the
median of the rounds' medians; each ratio is the median of the rounds' ratios, the three runs of a
round being close in time. A program whose first round takes less than --min-seconds gets more
rounds, as many as would fill that time, at most four times --rounds: the runs of the short programs
(memory_bank's 100 steps take 20 ms) each fall in one state of the machine, which changes every few
seconds, so their ratios vary most from round to round, and their rounds cost little.

    bench_coexec.py [--build BUILD] [--threads 1,2] [--steps K] [--rounds R] [--min-seconds S] [NAME...]

Prints a markdown table per thread count: milliseconds per step and the ratios coexec/eager and
coexec/PyTorch, with their geometric means; every round's figures go to standard error. Each tern run is a process of its own (tracing is set
up when tern is imported); the PyTorch twin runs in this process.
"""
import argparse
import math
import os
import pickle
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, 'tests', 'trace'))
from common import PROGRAMS, RUNNER, tern_env  # noqa: E402 (and the programs on the path)


def tern_ms(build, name, threads, coexec, steps, tmp):
    out = os.path.join(tmp, '%s-%d-%d.pickle' % (name, threads, coexec))
    runner = [sys.executable, RUNNER, name, '0', out]
    env = tern_env(build, TERN_THREADS=str(threads))
    if coexec:
        runner = [os.path.join(build, 'bin', 'tern-trace'), '--coexec', '--steps', str(steps), '-o',
                  os.path.join(tmp, name + '.onnx'), '--'] + runner
    r = subprocess.run(runner, env=env, capture_output=True, text=True)
    if r.returncode:
        raise SystemExit('bench_coexec: %s failed: %s' % (name, r.stderr.strip()[-400:]))
    with open(out, 'rb') as f:
        return pickle.load(f)['step_ms']


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument('--build', default=os.path.join(ROOT, 'build'))
    ap.add_argument('--threads', default='1,2')
    ap.add_argument('--steps', type=int, default=2)
    ap.add_argument('--rounds', type=int, default=5, help='rounds the three runs take turns over (default 5)')
    ap.add_argument('--min-seconds', type=float, default=60.0,
                    help='more rounds (up to 4 x --rounds) for a program whose first round is shorter (default 60)')
    ap.add_argument('names', nargs='*')
    a = ap.parse_args()
    build = os.path.abspath(a.build)
    names = a.names or PROGRAMS
    import importlib
    with tempfile.TemporaryDirectory() as tmp:
        for threads in [int(x) for x in a.threads.split(',')]:
            import harness
            harness._torch().set_num_threads(threads)  # interop threads stay at harness's one
            print('\nthreads %d\n\n| program | eager ms | coexec ms | PyTorch ms | coexec/eager | coexec/PyTorch |' % threads)
            print('|---|---:|---:|---:|---:|---:|')
            r_eager, r_torch = [], []
            for name in names:
                runs = []
                least = max(1, a.rounds)
                n_rounds = least
                i = 0
                while i < n_rounds:
                    # the order turns round every other round: what runs first or after which does not
                    # always fall on the same one
                    order = (0, 1, 2) if i % 2 == 0 else (2, 1, 0)
                    ms = {}
                    t0 = time.monotonic()
                    for k in order:
                        ms[k] = (tern_ms(build, name, threads, k == 1, a.steps, tmp) if k < 2
                                 else importlib.import_module(name).run('torch', 0)['step_ms'])
                    runs.append((ms[0], ms[1], ms[2]))
                    if i == 0:  # the count is set by the first round's length only, not by its figures
                        wall = time.monotonic() - t0
                        n_rounds = max(least, min(4 * least, math.ceil(a.min_seconds / max(wall, 1e-3))))
                    i += 1
                e, c, t = (statistics.median(r[k] for r in runs) for k in range(3))
                # every round's figures on stderr: a median hides one slow round, not two
                print('%s, %d thread(s), %d rounds (eager, coexec, PyTorch ms): %s' % (
                    name, threads, len(runs), '; '.join('%.3f %.3f %.3f' % r for r in runs)), file=sys.stderr)
                # a ratio is the median of the rounds' ratios: the runs of one round are close in time,
                # and what slows the machine for a while slows all three
                ce = statistics.median(r[1] / r[0] for r in runs)
                ct = statistics.median(r[1] / r[2] for r in runs)
                r_eager.append(ce)
                r_torch.append(ct)
                print('| %s | %.3f | %.3f | %.3f | %.2f | %.2f |' % (name, e, c, t, ce, ct))
            gm = lambda v: math.exp(sum(map(math.log, v)) / len(v))  # noqa: E731
            print('| **geometric mean** | | | | **%.2f** | **%.2f** |' % (gm(r_eager), gm(r_torch)))


if __name__ == '__main__':
    main()
