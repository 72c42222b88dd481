"""urm_ray: Ray-distributed training and sweeps for recurrent reasoning models (URM, HRM, TRM, GRAM)."""

__version__ = "0.1.0"
