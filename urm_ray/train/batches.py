"""One worker's training batches: endless epochs from a saved position, the first asked for early.

    batches = TrainBatches(host.shard("train"), local_batch, position, seed, buffer_rows, device)
    state = build_state(...)              # meanwhile Ray Data starts its pipeline
    batch = next(batches)

Ray Data starts an epoch's pipeline only when every rank asks for its first batch; the pipeline's
first map task then waits for a fresh worker process and its imports, seconds in all. The first
batch is therefore asked for in a thread of its own as soon as the position is known, while the
caller builds the model and its optimizers; every later batch is read when the loop asks for it,
so the position saved with a checkpoint counts exactly the batches the steps consumed.
"""

from __future__ import annotations

from collections.abc import Generator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import torch

from urm_ray.data import stream
from urm_ray.train.checkpoint import Position
from urm_ray.train.step import to_device


class TrainBatches:
    """Batches of ``size`` rows from ``shard`` (a Ray Train shard or a Dataset), reshuffled each
    epoch by (``seed``, epoch) in a buffer of ``buffer_rows``, from ``position`` on (advanced in
    place as batches are handed out), on ``device``. ``close`` stops the epoch's iterator."""

    def __init__(self, shard: Any, size: int, position: Position, seed: int, buffer_rows: int,
                 device: torch.device) -> None:
        self.position, self.device = position, device
        self._rows = self._epochs(shard, size, seed, buffer_rows)
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="urm_ray-first-batch")
        self._first: Future[dict[str, torch.Tensor]] | None = self._pool.submit(next, self._rows)

    def _epochs(self, shard: Any, size: int, seed: int,
                buffer_rows: int) -> Generator[dict[str, torch.Tensor], None, None]:
        position = self.position
        skip = position.batch
        while True:
            rows = stream.iter_torch_batches(shard, size, epoch=position.epoch, seed=seed, shuffle=True,
                                             drop_last=True, buffer_rows=buffer_rows)
            for index, batch in enumerate(rows):
                if index < skip:
                    continue
                position.batch = index + 1
                yield batch
            position.epoch, position.batch, skip = position.epoch + 1, 0, 0

    def __iter__(self) -> TrainBatches:
        return self

    def __next__(self) -> dict[str, torch.Tensor]:
        if self._first is not None:
            first, self._first = self._first, None
            self._pool.shutdown()
            return to_device(first.result(), self.device)
        return to_device(next(self._rows), self.device)

    def close(self) -> None:
        """Stops the epoch's iterator: Ray Data's prefetch thread in this worker, and with it the
        SplitCoordinator's epoch (a suspended generator is otherwise closed by the garbage
        collector only). A first batch still on its way is waited for: a generator cannot be
        closed while it runs."""
        if self._first is not None:
            self._first.exception()  # its error, if any, is not this close's concern
            self._first = None
            self._pool.shutdown()
        self._rows.close()
