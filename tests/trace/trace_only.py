#!/usr/bin/env python3
"""The trace-only baseline (tern-trace --trace-only, torch.jit.trace's way) on tests/programs' ten
programs: each program runs plainly and under --trace-only, and the results are compared (losses
at every step, final parameters, outputs; harness.compare_results). Prints one line per program,
'same', 'wrong: why' or 'fails: why', and the count of programs trace-only gets wrong or fails.

    trace_only.py --build BUILD [--min-wrong N] [--expect-same A,B,...] [NAME...]

Exit 1 when fewer than N (default 0) programs are wrong or fail, when one of --expect-same is not
'same' (the programs whose tensors made inside a step are only its input data, tern.step_input,
which the replay must feed anew), or when a plain run fails."""
import argparse
import os
import pickle
import subprocess
import sys
import tempfile

from common import PROGRAMS, RUNNER, tern_env  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument('--build', required=True)
    ap.add_argument('--min-wrong', type=int, default=0)
    ap.add_argument('--expect-same', default='')
    ap.add_argument('names', nargs='*')
    a = ap.parse_args()
    import harness
    build = os.path.abspath(a.build)
    env = tern_env(build)
    runner = RUNNER
    bad = 0
    expect_same = set(filter(None, a.expect_same.split(',')))
    unexpected = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in a.names or PROGRAMS:
            plain, traced = os.path.join(tmp, name + '.plain'), os.path.join(tmp, name + '.traced')
            r = subprocess.run([sys.executable, runner, name, '0', plain], env=env, capture_output=True, text=True)
            if r.returncode:
                print('FAIL %s: the plain run: %s' % (name, r.stderr.strip().splitlines()[-1:]))
                return 1
            r = subprocess.run([os.path.join(build, 'bin', 'tern-trace'), '--trace-only', '-o',
                                os.path.join(tmp, name + '.onnx'), '--', sys.executable, runner, name, '0', traced],
                               env=env, capture_output=True, text=True)
            if r.returncode:
                lines = [l for l in r.stderr.strip().splitlines() if not l.startswith('tern-trace:')]
                print('%s: fails: %s' % (name, lines[-1] if lines else r.stderr.strip()))
                bad += 1
                unexpected += [name] if name in expect_same else []
                continue
            with open(plain, 'rb') as f:
                rp = pickle.load(f)
            with open(traced, 'rb') as f:
                rt = pickle.load(f)
            why = harness.compare_results(rt, rp, 1e-5)
            print('%s: %s' % (name, 'wrong: ' + why if why else 'same'))
            bad += why is not None
            unexpected += [name] if why and name in expect_same else []
    print('trace-only is wrong or fails on %d of %d' % (bad, len(a.names or PROGRAMS)))
    if unexpected:
        print('FAIL: not the plain run\'s results, though every tensor made in their steps is step input: %s'
              % ', '.join(unexpected))
    return 0 if bad >= a.min_wrong and not unexpected else 1


if __name__ == '__main__':
    sys.exit(main())
