"""urm_ray: Ray-distributed training and sweeps for recurrent reasoning models (URM, HRM, TRM, GRAM)."""

import os

# Runs, trials and Ray Data tasks share a machine's cores. PyTorch's OpenMP threads spin while they
# wait by default, and a process whose threads spin on cores another process needs slows both by
# an order of magnitude (bench/sharing.py); waiting threads that sleep instead share the cores.
# Read by the OpenMP runtime when torch loads, so set before anything imports torch; a value the
# user set stands.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

__version__ = "0.1.0"
