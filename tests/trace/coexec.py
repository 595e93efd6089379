#!/usr/bin/env python3
"""tern-trace --coexec on tests/programs' ten programs and the small cases: each runs plainly and
under --coexec (K traced steps, every later step checked against the graph), and the results must be
identical (losses at every step, final parameters, outputs: the same bits); the divergences found and
the closing summary are printed.

    coexec.py --build BUILD [--steps K] [--threads N] [NAME...]

--threads sets TERN_THREADS for both runs (default: the environment's, else tern's one).

Exit 1 when any result differs or a run fails."""
import argparse
import os
import pickle
import subprocess
import sys
import tempfile

from common import HERE, PROGRAMS, RUNNER, SMALL, tern_env  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument('--build', required=True)
    ap.add_argument('--steps', type=int, default=2)
    ap.add_argument('--threads', type=int)
    ap.add_argument('names', nargs='*')
    a = ap.parse_args()
    import harness
    build = os.path.abspath(a.build)
    env = tern_env(build, **({'TERN_THREADS': str(a.threads)} if a.threads else {}))
    runner = RUNNER
    failed = 0
    with tempfile.TemporaryDirectory() as tmp:
        for name in a.names or SMALL + PROGRAMS:
            plain, co = os.path.join(tmp, name + '.plain'), os.path.join(tmp, name + '.co')
            # tests/programs' ones pickle their results; the small cases here print theirs
            big = name in PROGRAMS
            cmd = [sys.executable, runner, name, '0'] if big else [sys.executable, os.path.join(
                HERE, 'programs', name + '.py')]
            r = subprocess.run(cmd + ([plain] if big else []), env=env, capture_output=True, text=True)
            plain_out = r.stdout
            if r.returncode:
                print('FAIL %s: the plain run: %s' % (name, r.stderr.strip().splitlines()[-1:]))
                return 1
            r = subprocess.run([os.path.join(build, 'bin', 'tern-trace'), '--coexec', '-v', '--steps', str(a.steps),
                                '-o', os.path.join(tmp, name + '.onnx'), '--'] + cmd + ([co] if big else []),
                               env=env, capture_output=True, text=True)
            diverged = [l for l in r.stderr.splitlines() if 'diverged:' in l]
            summary = [l for l in r.stderr.splitlines() if 'co-execution:' in l]
            if r.returncode:
                print('FAIL %s: tern-trace --coexec exited %d: %s' % (name, r.returncode, r.stderr.strip()[-300:]))
                failed += 1
                continue
            if big:
                with open(plain, 'rb') as f:
                    rp = pickle.load(f)
                with open(co, 'rb') as f:
                    rc = pickle.load(f)
                why = harness.compare_results(rc, rp, 0.0)
            else:
                why = None if r.stdout == plain_out else 'printed %r, plainly %r' % (r.stdout[-200:], plain_out[-200:])
            if why:
                print('FAIL %s: co-executed results differ: %s' % (name, why))
                failed += 1
                continue
            print('ok %s: identical; %s' % (name, summary[-1].split('co-execution: ')[1] if summary else '?'))
            for line in diverged[:3]:
                print('   ' + line.split('tern-trace: ', 1)[1])
            if len(diverged) > 3:
                print('   ... %d more' % (len(diverged) - 3))
    return 1 if failed else 0


if __name__ == '__main__':
    sys.exit(main())
