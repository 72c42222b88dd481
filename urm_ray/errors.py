"""Exceptions that user-facing code raises for bad input (configs, data files, search spaces)."""


class ConfigError(ValueError):
    """A configuration value is unknown, mistyped or inconsistent; the message names the key."""


class DataError(ValueError):
    """A data file or dataset folder is malformed; the message names the file and row/task."""
