"""Child process of tests/test_probe.py: the probe with --tp, on a CPU with ONE device at start.

No XLA_FLAGS: the probe itself must give jax's CPU backend the devices --tp asks for.
The ceilings are measured with small sizes (as the in-process probe test does) to stay quick.
Usage: python probe_tp.py PROBE_ARGS...
"""

import sys

from inference_lab.base import hardware
from inference_lab.measure import probe

hardware.ceiling_sizes = lambda backend, key: (256, 2**20)
sys.exit(probe.main(sys.argv[1:]))
