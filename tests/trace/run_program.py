#!/usr/bin/env python3
"""Runs one of tests/programs/' programs on tern (its run('tern', seed)), for tern-trace to trace.

    run_program.py NAME [SEED [RESULT.pickle]]

With RESULT, the program's result (losses, params, outputs) is pickled there."""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), 'programs'))

import importlib  # noqa: E402

result = importlib.import_module(sys.argv[1]).run('tern', int(sys.argv[2]) if len(sys.argv) > 2 else 0)
if len(sys.argv) > 3:
    import pickle
    with open(sys.argv[3], 'wb') as f:
        pickle.dump(result, f)
