"""urm_ray: Ray-distributed training and sweeps for recurrent reasoning models (URM, HRM, TRM, GRAM)."""

import os

from urm_ray import redact

# Runs, trials and Ray Data tasks share a machine's cores. PyTorch's OpenMP threads spin while they
# wait by default, and a process whose threads spin on cores another process needs slows both
# (docs/benchmarks.md, "Runs sharing a machine"); waiting threads that sleep instead share the cores.
# Read by the OpenMP runtime when torch loads, so set before anything imports torch; a value the
# user set stands.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

# No password of a URL in any log line of any process that imports urm_ray (the CLI, Ray workers,
# trial actors): see redact.py.
redact.install()

__version__ = "0.1.0"
