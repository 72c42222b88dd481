"""Studies: several sweeps run to one results table (``urm-ray study STUDY.yaml``)."""
