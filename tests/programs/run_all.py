#!/usr/bin/env python3
"""Runs the imperative programs of tests/programs/ on tern and on PyTorch and compares them.

    run_all.py [--only NAME[,NAME...]] [--seed N] [--timeout S] [--in-process] [-v]

Every NAME.py here with a run(backend, seed) function (harness.py's contract) is a program. Each
runs in a child process of its own (a crash in one is a FAIL line, not the end of the run): the
tern twin, then the torch twin, then harness.compare_results: losses at every step, final params,
outputs (relative 1e-4 of each quantity's scale, or the program's RTOL; discrete outputs exactly).
One line per program:

    ok NAME: <steps> steps, loss a -> b, <n> params, <m> outputs; step ms tern X torch Y
    FAIL NAME: why

The exit status is 1 when any program fails (or --only names none), else 0. tern must be
importable (PYTHONPATH=BUILD/python); torch runs on one thread, tern on its default of one.
"""
import argparse
import importlib
import os
import subprocess
import sys
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

SKIP = {'harness', 'run_all'}


def discover():
    names = []
    for f in sorted(os.listdir(HERE)):
        if not f.endswith('.py') or f.startswith('_'):
            continue
        name = f[:-3]
        if name in SKIP:
            continue
        with open(os.path.join(HERE, f), encoding='utf-8') as fh:
            if '\ndef run(' in fh.read():
                names.append(name)
    return names


def run_one(name, seed, verbose=False):
    """(ok, line) for one program, in this process."""
    import harness
    try:
        mod = importlib.import_module(name)
    except Exception as e:  # noqa: BLE001
        return False, 'FAIL %s: import: %s: %s' % (name, type(e).__name__, e)
    rtol = getattr(mod, 'RTOL', harness.RTOL)
    results = {}
    for b in ('tern', 'torch'):
        t0 = time.perf_counter()
        try:
            results[b] = mod.run(b, seed)
        except Exception as e:  # noqa: BLE001
            if verbose:
                traceback.print_exc()
            tb = traceback.extract_tb(e.__traceback__)
            where = ''
            for fr in reversed(tb):
                if os.path.dirname(os.path.abspath(fr.filename)) == HERE:
                    where = ' (%s:%d)' % (os.path.basename(fr.filename), fr.lineno)
                    break
            msg = str(e).strip().splitlines()
            return False, 'FAIL %s: %s twin raised %s%s: %s' % (
                name, b, type(e).__name__, where, msg[0] if msg else '')
        if verbose:
            print('  %s %s: %.1f s' % (name, b, time.perf_counter() - t0), file=sys.stderr)
    rt, rb = results['tern'], results['torch']
    why = harness.compare_results(rt, rb, rtol)
    if verbose and rb['losses']:
        for i, (x, y) in enumerate(zip(rt['losses'], rb['losses'])):
            print('  step %3d  tern %.7g  torch %.7g' % (i, x, y), file=sys.stderr)
    times = 'step ms tern %.2f torch %.2f' % (rt['step_ms'], rb['step_ms'])
    if why:
        return False, 'FAIL %s: %s; %s' % (name, why, times)
    lb = rb['losses']
    loss = ('loss %.4g -> %.4g' % (lb[0], lb[-1])) if lb else 'no losses'
    return True, 'ok %s: %d steps, %s, %d params, %d outputs; %s' % (
        name, len(lb), loss, len(rb['params']), len(rb['outputs']), times)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    ap.add_argument('--only', action='append', default=[], help='program names (comma-separated, repeatable)')
    ap.add_argument('--seed', type=int, default=0)
    ap.add_argument('--timeout', type=float, default=600, help='seconds per program (child process)')
    ap.add_argument('--in-process', action='store_true', help='run the programs in this process')
    ap.add_argument('-v', '--verbose', action='store_true')
    ap.add_argument('--child', help=argparse.SUPPRESS)
    args = ap.parse_args()

    if args.child:
        ok, line = run_one(args.child, args.seed, args.verbose)
        print(line, flush=True)
        return 0 if ok else 1

    names = discover()
    if args.only:
        want = [n for o in args.only for n in o.split(',') if n]
        unknown = [n for n in want if n not in names]
        if unknown:
            print('FAIL run_all: no such program: %s (have %s)' % (', '.join(unknown), ', '.join(names)))
            return 1
        names = want
    if not names:
        print('FAIL run_all: no programs')
        return 1

    failed = 0
    for name in names:
        if args.in_process:
            ok, line = run_one(name, args.seed, args.verbose)
            print(line, flush=True)
            failed += not ok
            continue
        cmd = [sys.executable, os.path.abspath(__file__), '--child', name, '--seed', str(args.seed)]
        if args.verbose:
            cmd.append('-v')
        try:
            p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=None if args.verbose else subprocess.PIPE,
                               timeout=args.timeout, text=True)
        except subprocess.TimeoutExpired:
            print('FAIL %s: timed out after %g s' % (name, args.timeout), flush=True)
            failed += 1
            continue
        lines = [ln for ln in p.stdout.splitlines() if ln.startswith(('ok ', 'FAIL '))]
        if lines and p.returncode in (0, 1):
            print(lines[-1], flush=True)
            failed += p.returncode != 0
        else:
            err = (p.stderr or '').strip().splitlines()
            why = 'signal %d' % -p.returncode if p.returncode < 0 else 'exit status %d' % p.returncode
            print('FAIL %s: child process died (%s)%s' % (name, why, (': ' + err[-1]) if err else ''), flush=True)
            failed += 1
    print('%d of %d programs agree' % (len(names) - failed, len(names)))
    return 1 if failed else 0


if __name__ == '__main__':
    sys.exit(main())
