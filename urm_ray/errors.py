"""Exceptions that user-facing code raises: bad input (configs, data files, search spaces), and a
training run that cannot go on."""


class ConfigError(ValueError):
    """A configuration value is unknown, mistyped or inconsistent; the message names the key."""


class DataError(ValueError):
    """A data file or dataset folder is malformed; the message names the file and row/task."""


class TrainingDiverged(RuntimeError):
    """The loss or the gradients became non-finite (inf / nan); the message names the step."""

    PREFIX = "non-finite loss at step"

    @classmethod
    def find(cls, error: BaseException) -> "TrainingDiverged | None":
        """This error as raised in a Ray worker and re-raised, wrapped, by Ray Train or Tune."""
        text = str(error)
        start = text.rfind(cls.PREFIX)
        if start < 0:
            return None
        return cls(text[start:].splitlines()[0].strip())
