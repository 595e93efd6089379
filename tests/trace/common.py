"""What the tern-trace test scripts (and scripts/bench_coexec.py) share: the programs they run and the
environment a traced program gets."""
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), 'programs'))  # harness and the programs

# tests/programs' ten programs (run through run_program.py) and the small cases in programs/
PROGRAMS = ['bert_qa', 'dcgan', 'dropblock', 'early_stop', 'gpt_sample', 'memory_bank', 'rcnn', 'seq2seq_sample',
            'stochastic_depth', 'yolo']
SMALL = ['branch_late', 'shape_change', 'list_and_library', 'raises', 'no_steps']
RUNNER = os.path.join(HERE, 'run_program.py')


def tern_env(build, **extra):
    """The environment for a tern program of BUILD; under the sanitizer build (TERN_TRACE_PRELOAD) its
    runtime is preloaded, to come first in the traced program."""
    env = dict(os.environ, PYTHONPATH=os.path.join(build, 'python'), **extra)
    if env.get('TERN_TRACE_PRELOAD'):
        env['LD_PRELOAD'] = env['TERN_TRACE_PRELOAD']
    return env
