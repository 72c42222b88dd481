"""Checkpoint upload: urm_ray's atomic upload against Ray Train's default copy, on local storage.

    python bench/checkpoint_upload.py                      # 3 MB (sudoku4-urm) and 256 MB states
    python bench/checkpoint_upload.py --mb 2048 --rounds 3

``checkpoint.upload`` (what training uses: write under a hidden name, flush to the disk, rename
at the end) and ``pyarrow.fs.copy_files`` into a created folder (what Ray Train's
``persist_current_checkpoint`` does without an upload function) copy the same checkpoint folder,
in interleaved rounds; the medians are printed with their ratio. The page cache is warm for both.
"""

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

import pyarrow.fs

from urm_ray.train import checkpoint


def _folder(root: Path, megabytes: float) -> Path:
    folder = root / f"local-{megabytes:g}"
    folder.mkdir()
    (folder / checkpoint.STATE_FILE).write_bytes(os.urandom(int(megabytes * (1 << 20))))
    (folder / checkpoint.CONFIG_FILE).write_text("train: {steps: 1}\n")
    return folder


def _atomic(source: Path, dest: Path) -> None:
    checkpoint.upload(source, pyarrow.fs.LocalFileSystem(), str(dest), 0)


def _ray_default(source: Path, dest: Path) -> None:
    fs = pyarrow.fs.LocalFileSystem()
    fs.create_dir(str(dest))
    pyarrow.fs.copy_files(str(source), str(dest), source_filesystem=fs, destination_filesystem=fs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=float, nargs="*", default=[2.6, 256.0], help="state.pt sizes")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        root = Path(scratch)
        for megabytes in args.mb:
            source = _folder(root, megabytes)
            times: dict[str, list[float]] = {"atomic": [], "ray": []}
            for round_ in range(args.rounds):
                for name, copy in (("atomic", _atomic), ("ray", _ray_default)):
                    dest = root / f"{name}-{megabytes:g}-{round_}"
                    start = time.perf_counter()
                    copy(source, dest)
                    times[name].append(time.perf_counter() - start)
            atomic, ray = (statistics.median(times[k]) for k in ("atomic", "ray"))
            print(f"{megabytes:g} MB: atomic upload {atomic * 1e3:.1f} ms, Ray's copy {ray * 1e3:.1f} ms "
                  f"(medians of {args.rounds}), atomic / Ray = {atomic / ray:.2f}")


if __name__ == "__main__":
    main()
