"""Evaluation: held-out metrics, checkpoints, GRAM sampling, voting and test-time compute."""
