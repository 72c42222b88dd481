"""Exceptions that user-facing code raises: bad input (configs, data files, search spaces), and a
training run that cannot go on."""


class ConfigError(ValueError):
    """A configuration value is unknown, mistyped or inconsistent; the message names the key."""


class DataError(ValueError):
    """A data file or dataset folder is malformed; the message names the file and row/task."""


class Interrupted(KeyboardInterrupt):
    """Ctrl-C stopped the command after it said what it left behind and how to resume (logged or
    printed already, or the message, when there is one). ``urm-ray`` exits 130 on it, without a
    traceback, as on any KeyboardInterrupt."""


class TrainingFailed(RuntimeError):
    """A run stopped on an error in its workers (not a bad config or input); the message is the
    error's last line, e.g. ``worker rank 0: the checkpoint of step 20 could not be written ...``."""

    @classmethod
    def from_workers(cls, failures: dict[int, BaseException]) -> "TrainingFailed":
        """Ray Train's ``WorkerGroupError.worker_failures`` (rank -> error) in one line: the
        first failed rank's error, whose traceback Ray keeps in its text."""
        rank = min(failures)
        lines = [line.strip() for line in str(failures[rank]).splitlines() if line.strip()]
        return cls(f"worker rank {rank}: {lines[-1] if lines else type(failures[rank]).__name__}")


class TrainingDiverged(TrainingFailed):
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


class CheckpointError(DataError):
    """A checkpoint's ``state.pt`` cannot be read: missing, truncated or corrupt; the message
    names the file."""


class CheckpointRefused(CheckpointError):
    """A ``state.pt`` holds objects a urm_ray checkpoint never holds (a pickle that would call a
    function or build a class outside the allowlist); it is refused unread, nothing of it runs.
    The message names the file and what it asked for."""


class CheckpointWriteError(OSError):
    """A checkpoint could not be written to the run's storage (full disk, lost access); the
    message names the step and the destination, and nothing partial is left there."""


class TrackingUnavailable(TrainingFailed):
    """The MLflow tracking store stayed unreachable past the time urm_ray waits for it at the end
    of a run (``tracking.FLUSH_LIMIT_S``); the message names the store and what was not written.
    Checkpoints are not affected: they are saved before the run waits for its tracking."""
