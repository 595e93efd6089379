#!/usr/bin/env python3
"""Traces a program with tern-trace and checks the graph against what the program computed: for
every traced step, the graph (its states set to their values at the start of that step) run by
tern-run on the step's fed inputs gives the values the program fetched in that step.

    check_trace.py --build BUILD [--steps K] [--expect-paths N] PROGRAM [ARGS...]

Exit 0 when every fetched value agrees (relative 1e-5), 1 otherwise."""
import argparse
import glob
import os
import subprocess
import sys
import tempfile

import numpy as np
import onnx
from onnx import numpy_helper

from common import tern_env


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument('--build', required=True)
    ap.add_argument('--steps', type=int, default=3)
    ap.add_argument('--expect-paths', type=int)
    ap.add_argument('program', nargs=argparse.REMAINDER)
    a = ap.parse_args()
    build = os.path.abspath(a.build)
    if a.program and a.program[0] == '--':
        a.program = a.program[1:]
    with tempfile.TemporaryDirectory() as tmp:
        graph = os.path.join(tmp, 'trace.onnx')
        rec = os.path.join(tmp, 'rec')
        cmd = [os.path.join(build, 'bin', 'tern-trace'), '-o', graph, '--steps', str(a.steps), '--record', rec, '-v',
               '--'] + a.program
        r = subprocess.run(cmd, capture_output=True, text=True, env=tern_env(build))
        sys.stderr.write(r.stderr)
        if r.returncode != 0:
            print('FAIL: tern-trace exited %d' % r.returncode)
            return 1
        m = onnx.load(graph)
        onnx.checker.check_model(m)
        paths = 2 if any(i.name == 'tern_path' for i in m.graph.input) else 1
        summary = [l for l in r.stderr.splitlines() if ' path' in l]
        if a.expect_paths is not None and summary and ' %d path' % a.expect_paths not in summary[-1]:
            print('FAIL: expected %d paths: %s' % (a.expect_paths, summary[-1]))
            return 1
        inputs = {i.name for i in m.graph.input}
        worst, checked = 0.0, 0
        steps = sorted(glob.glob(os.path.join(rec, 'step*')), key=lambda p: int(p.rsplit('step', 1)[1]))
        for sd in steps:
            step_model = onnx.load(graph)
            for init in step_model.graph.initializer:
                f = os.path.join(sd, init.name + '.npy')
                if init.name.startswith('state_') and os.path.exists(f):
                    init.CopyFrom(numpy_helper.from_array(np.load(f), init.name))
            mp = os.path.join(tmp, 'step.onnx')
            onnx.save(step_model, mp)
            args = [os.path.join(build, 'bin', 'tern-run'), mp, '-O', os.path.join(tmp, 'out')]
            for f in sorted(glob.glob(os.path.join(sd, '*.npy'))):
                name = os.path.basename(f)[:-4]
                if name in inputs:
                    args += ['-i', '%s=%s' % (name, f)]
            rr = subprocess.run(args, capture_output=True, text=True)
            if rr.returncode != 0:
                print('FAIL: %s: tern-run: %s' % (os.path.basename(sd), rr.stderr.strip()))
                return 1
            for f in sorted(glob.glob(os.path.join(sd, 'fetched', '*.npy'))):
                want = np.load(f)
                got = np.load(os.path.join(tmp, 'out', os.path.basename(f)))
                if got.shape != want.shape or (want.dtype.kind == 'f' and not np.allclose(got, want, rtol=1e-5, atol=1e-6)) \
                        or (want.dtype.kind != 'f' and not np.array_equal(got, want)):
                    print('FAIL: %s: %s differs: graph %s, program %s' % (os.path.basename(sd), os.path.basename(f),
                                                                         got.ravel()[:6], want.ravel()[:6]))
                    return 1
                if want.dtype.kind == 'f' and want.size:
                    worst = max(worst, float(np.max(np.abs(got - want) / (np.abs(want) + 1e-6))))
                checked += 1
        if not checked:
            print('FAIL: nothing fetched to compare')
            return 1
        print('ok: %d steps, %d path%s, %d values compared, worst relative %.1e' %
              (len(steps), paths, '' if paths == 1 else 's', checked, worst))
        return 0


if __name__ == '__main__':
    sys.exit(main())
