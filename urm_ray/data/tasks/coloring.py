"""Graph colouring: random k-colourable graphs (planted colouring), a verifier, and a dataset.

A graph of n nodes is laid out as n rows of n + 1 tokens, flattened row-major (seq_len =
n * (n + 1)): row i is [colour slot of node i, adjacency of node i to nodes 0..n-1]. Tokens: PAD 0,
no edge 1, edge 2, uncoloured slot 3, colour c -> 4 + c (vocab_size = 4 + k). Inputs have every
slot uncoloured (a coloured input slot is a given that the answer must keep); labels hold one
proper colouring in the slots and the ignore label on the adjacency cells, so the loss and the
exact accuracy look at colours only. Many colourings are valid for one graph (at least the k!
renamings of the planted one), so only the verifier can judge an answer: GRAM's multi-solution
setting.

Generation plants the colouring: each node gets a colour, balanced (every colour used when
n >= k), and each pair of differently coloured nodes is joined with probability `edge_prob`.
Graphs are distinct across both splits as adjacency matrices (not up to node renaming, which is
what the augmentation does; for n >= 10 isomorphic repeats are very unlikely).

    build_generated("data/coloring", n=12, colors=3, num_train=5000, num_test=500, edge_prob=0.4)
"""

from __future__ import annotations

import argparse
import hashlib
import math
import os
from collections.abc import Iterator
from typing import Any

import numpy as np

from urm_ray.data.augment import Transform, random_bits, random_permutations
from urm_ray.data.store import (
    DatasetMeta,
    check_output_folder,
    split_chunk_stream,
    write_dataset_chunks,
)
from urm_ray.data.tasks.task import NumpyCheck, NumpySearch, PuzzleTask
from urm_ray.errors import ConfigError, DataError
from urm_ray.progress import DATA_PROGRESS_EVERY_S, Progress

PAD_TOKEN, NO_EDGE_TOKEN, EDGE_TOKEN, BLANK_TOKEN, COLOR0_TOKEN = range(5)
IGNORE_LABEL = -100
_CHUNK = 4096  # graphs drawn per vectorised generation step


def num_nodes(seq_len: int) -> int:
    """n with n * (n + 1) == seq_len; ConfigError if there is none."""
    n = (math.isqrt(4 * seq_len + 1) - 1) // 2
    if n < 1 or n * (n + 1) != seq_len:
        raise ConfigError(f"coloring: seq_len={seq_len} is not n * (n + 1) for any n")
    return n


def valid_colorings_mask(answers: Any, inputs: Any, n: int) -> np.ndarray:
    """[B] bool: each answer [B, n*(n+1)] gives every node a colour, keeps the input's given
    colours, and gives adjacent nodes (edges read from the input) different colours. Adjacency
    cells of the answer are ignored. The number of colours is bounded by the vocabulary."""
    answers = np.asarray(answers).reshape(-1, n, n + 1)
    inputs = np.asarray(inputs).reshape(-1, n, n + 1)
    colour, given = answers[:, :, 0], inputs[:, :, 0]  # [B, n]
    edges = inputs[:, :, 1:] == EDGE_TOKEN  # [B, n, n]
    coloured = (colour >= COLOR0_TOKEN).all(axis=1)
    keeps_givens = np.where(given >= COLOR0_TOKEN, colour == given, True).all(axis=1)
    clash = edges & (colour[:, :, None] == colour[:, None, :])  # [B, n, n]
    return coloured & keeps_givens & ~clash.any(axis=(1, 2))


def encode(adjacency: np.ndarray, colours: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(inputs, labels) [B, n*(n+1)] int16 from adjacency [B, n, n] bool and colours [B, n]."""
    count, n = colours.shape
    inputs = np.empty((count, n, n + 1), np.int16)
    inputs[:, :, 0] = BLANK_TOKEN
    inputs[:, :, 1:] = np.where(adjacency, EDGE_TOKEN, NO_EDGE_TOKEN)
    labels = np.full((count, n, n + 1), IGNORE_LABEL, np.int16)
    labels[:, :, 0] = COLOR0_TOKEN + colours
    return inputs.reshape(count, -1), labels.reshape(count, -1)


def _draw(
    rng: np.random.Generator, count: int, n: int, colors: int, edge_prob: float
) -> tuple[np.ndarray, np.ndarray]:
    """(adjacency [count, n, n] bool, symmetric, no loops; planted colours [count, n])."""
    colours = np.argsort(rng.random((count, n)), axis=1) % colors  # balanced: sizes differ by <= 1
    coin = np.triu(rng.random((count, n, n)) < edge_prob, k=1)
    coin &= colours[:, :, None] != colours[:, None, :]
    return coin | coin.transpose(0, 2, 1), colours


def generate_graphs(
    n: int,
    count: int,
    *,
    colors: int,
    edge_prob: float,
    seed: int = 0,
    max_candidates: int = 0,
) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """Yields (inputs, labels) chunks [C, n*(n+1)] of distinct planted-colouring graphs until
    `count` are out. Memory: one chunk plus a 12-byte key per graph kept."""
    _check_arguments(n, count, colors, edge_prob)
    rng = np.random.default_rng(seed)
    max_candidates = max_candidates or 100 * max(count, 1)
    seen: set[bytes] = set()
    drawn = kept = 0
    progress = Progress(f"coloring n={n} k={colors} generate", count, unit="graphs",
                        every_s=DATA_PROGRESS_EVERY_S)
    while kept < count:
        if drawn >= max_candidates:
            raise DataError(
                f"coloring n={n} k={colors} edge_prob={edge_prob}: only {kept}/{count} distinct"
                f" graphs in {drawn} draws; there may be too few distinct graphs of this size"
            )
        adjacency, colours = _draw(rng, min(_CHUNK, 2 * (count - kept)), n, colors, edge_prob)
        drawn += len(adjacency)
        packed = np.packbits(adjacency.reshape(len(adjacency), -1), axis=1)
        fresh = []
        for i, row in enumerate(packed):
            key = hashlib.blake2b(row.tobytes(), digest_size=12).digest()
            if key not in seen and len(fresh) < count - kept:
                seen.add(key)
                fresh.append(i)
        kept += len(fresh)
        progress.update(kept)
        if fresh:
            yield encode(adjacency[fresh], colours[fresh])
    progress.finish(kept)


def _check_arguments(n: int, count: int, colors: int, edge_prob: float) -> None:
    if not isinstance(n, int) or n < 2:
        raise ConfigError(f"n={n!r} must be an int >= 2")
    if count < 0:
        raise ConfigError(f"count={count} must be >= 0")
    if not isinstance(colors, int) or not 2 <= colors <= n:
        raise ConfigError(f"colors={colors!r} must be an int in [2, n={n}]")
    if not 0.0 < edge_prob <= 1.0:
        raise ConfigError(f"edge_prob={edge_prob} must be in (0, 1]")


def build_generated(
    out_dir: str | os.PathLike,
    n: int,
    colors: int,
    num_train: int,
    num_test: int,
    *,
    edge_prob: float = 0.4,
    seed: int = 0,
    overwrite: bool = False,
) -> DatasetMeta:
    """Generates distinct graphs and writes splits "test" then "train", streaming by chunks.

    `puzzle_index` is the generation order within each split."""
    for name, value in (("num_train", num_train), ("num_test", num_test)):
        if value < 0:
            raise ConfigError(f"{name}={value} must be >= 0")
    chunks = generate_graphs(n, num_train + num_test, colors=colors, edge_prob=edge_prob,
                             seed=seed)
    splits = split_chunk_stream(chunks, {"test": num_test, "train": num_train})
    args = {"n": n, "colors": colors, "num_train": num_train, "num_test": num_test,
            "edge_prob": edge_prob}
    build = {"builder": "coloring.build_generated", "arguments": args, "seed": seed,
             "source": None}
    meta = DatasetMeta(task=TASK.name, vocab_size=COLOR0_TOKEN + colors, seq_len=n * (n + 1),
                       num_puzzle_identifiers=1, augmentation=TASK.augmentation, build=build)
    return write_dataset_chunks(out_dir, splits, meta, overwrite=overwrite)


# --- augmentation, verifier, builder command: the task's registry entry ---------------------------


def augment(inputs: np.ndarray, labels: np.ndarray, keys: np.ndarray) -> Transform:
    """The nodes renamed by a random permutation (rows and adjacency columns move together), then
    the colours renamed. A graph with no given colour has its label's colours put in canonical
    order, numbered by first use over the renamed nodes (node 0 gets colour 0, the first node
    with another colour gets colour 1, ...): the colour names carry no information there, and a
    label renamed at random would leave every node's colour at chance for any model. A graph with
    given colours has them renamed by a random permutation of 0..m, m the largest colour in the
    row, givens and label alike."""
    seq_len = inputs.shape[1]
    n = num_nodes(seq_len)
    perm = random_permutations(keys, n, salt=21)  # [B, n] source node of each output node
    columns = np.concatenate([np.zeros((len(keys), 1), np.int64), perm + 1], axis=1)  # [B, n+1]
    src = (perm[:, :, None] * (n + 1) + columns[:, None, :]).reshape(-1, seq_len)  # [B, L]
    top = np.maximum(inputs.max(axis=1), labels.max(axis=1)).astype(np.int64)  # [B]
    num_colours = np.maximum(top - COLOR0_TOKEN + 1, 0)  # [B] colours 0..m in use
    width = int(num_colours.max(initial=0))
    if width == 0:
        return Transform(src)
    colour = np.arange(width, dtype=np.uint64)
    draws = random_bits(keys, width, salt=23) >> np.uint64(1)  # [B, W] < 2^63
    fixed = np.uint64(1 << 63) + colour  # colours above m sort last, in order: kept
    order = np.argsort(
        np.where(colour[None, :] < num_colours[:, None].astype(np.uint64), draws, fixed), axis=1
    )  # [B, W]: the first m+1 entries permute 0..m
    given = (inputs.reshape(-1, n, n + 1)[:, :, 0] >= COLOR0_TOKEN).any(axis=1)  # [B]
    slots = np.take_along_axis(labels.reshape(-1, n, n + 1)[:, :, 0].astype(np.int64), perm, axis=1)
    lut = np.where(given[:, None], order, _first_use_ranks(slots - COLOR0_TOKEN, width))
    head = np.broadcast_to(np.arange(COLOR0_TOKEN), (len(keys), COLOR0_TOKEN))
    return Transform(src, np.concatenate([head, lut + COLOR0_TOKEN], axis=1))  # lut [B, 4 + W]


def _first_use_ranks(colours: np.ndarray, width: int) -> np.ndarray:
    """[B, W]: the new name of each colour 0..W-1 of rows [B, n] (negative = no colour): its rank
    by first use along the row, unused colours last in their order."""
    count, n = colours.shape
    hits = colours[:, :, None] == np.arange(width)[None, None, :]  # [B, n, W]
    first = np.where(hits.any(axis=1), hits.argmax(axis=1), n + np.arange(width)[None, :])  # [B, W]
    return np.argsort(np.argsort(first, axis=1, kind="stable"), axis=1, kind="stable")


def verifier(seq_len: int) -> NumpyCheck:
    """Proper colourings of the input graph that keep its given colours."""
    n = num_nodes(seq_len)
    return lambda answers, inputs, labels: valid_colorings_mask(answers, inputs, n)


MAX_NEAREST_CANDIDATES = 100_000  # k^n colourings searched at once by `nearest`


def nearest(seq_len: int, vocab_size: int) -> NumpySearch:
    """The proper colouring nearest to each answer (fewest nodes coloured differently; the label
    among equals), searched over all k^n colourings, k = vocab_size - 4: graphs of up to 10 nodes
    with 3 colours. Labels come back with their slots replaced (adjacency cells stay ignored); a
    graph with no proper colouring keeps its label."""
    n, k = num_nodes(seq_len), vocab_size - COLOR0_TOKEN
    if k < 1 or k ** n > MAX_NEAREST_CANDIDATES:
        raise ConfigError(f"coloring: a nearest-colouring search over {k}^{n} colourings (vocab_size={vocab_size}, "
                          f"{n} nodes) is over {MAX_NEAREST_CANDIDATES:,}; it is for small graphs")
    candidates = np.stack(np.unravel_index(np.arange(k ** n), (k,) * n), axis=1)  # [M, n]
    same = (candidates[:, :, None] == candidates[:, None, :]).reshape(len(candidates), n * n)
    chosen = _one_hot(candidates + COLOR0_TOKEN, k)  # [M, n * k]

    def search(answers: np.ndarray, inputs: np.ndarray, labels: np.ndarray) -> np.ndarray:
        count = len(answers)
        slots = [np.asarray(a).reshape(count, n, n + 1)[:, :, 0].astype(np.int64) for a in (answers, inputs, labels)]
        answer, given, label = slots
        edges = (np.asarray(inputs).reshape(count, n, n + 1)[:, :, 1:] == EDGE_TOKEN).reshape(count, n * n)
        clash = edges.astype(np.float32) @ same.T.astype(np.float32)  # [N, M] edges inside a colour
        keeps = _one_hot(given, k) @ chosen.T == (given >= COLOR0_TOKEN).sum(1, keepdims=True)
        valid = (clash == 0) & keeps
        score = 2 * (_one_hot(answer, k) @ chosen.T) + (_one_hot(label, k) @ chosen.T == n)
        best = np.where(valid, score, -1).argmax(axis=1)  # [N]
        targets = np.array(labels, dtype=np.int64).reshape(count, n, n + 1)
        found = valid.any(axis=1)
        targets[found, :, 0] = COLOR0_TOKEN + candidates[best[found]]
        return targets.reshape(count, -1)

    return search


def _one_hot(slots: np.ndarray, k: int) -> np.ndarray:
    """[..., n * k] float32: colour slot tokens [..., n] one-hot over the k colours (no colour:
    all zero)."""
    colour = slots - COLOR0_TOKEN
    hot = (colour[..., None] == np.arange(k)) & (colour[..., None] >= 0)
    return hot.reshape(*slots.shape[:-1], -1).astype(np.float32)


def _build_command(args: argparse.Namespace) -> None:
    check_output_folder(args.out, args.overwrite)  # before any work
    build_generated(
        args.out, n=args.nodes, colors=args.colors, num_train=args.num_train,
        num_test=args.num_test, edge_prob=args.edge_prob, seed=args.seed, overwrite=args.overwrite,
    )
    print(f"wrote {args.out}")


def add_builder(data: argparse._SubParsersAction) -> None:
    """`urm-ray data coloring`."""
    c = data.add_parser("coloring", help="random k-colourable graphs (planted colouring)")
    c.add_argument("--out", required=True, help="dataset folder to create")
    c.add_argument("--nodes", type=int, default=12)
    c.add_argument("--colors", type=int, default=3)
    c.add_argument("--edge-prob", type=float, default=0.4,
                   help="chance of an edge between two nodes of different planted colours")
    c.add_argument("--num-train", type=int, default=5000)
    c.add_argument("--num-test", type=int, default=500)
    c.add_argument("--seed", type=int, default=0)
    c.add_argument("--overwrite", action="store_true", help="replace an existing dataset at --out")
    c.set_defaults(func=_build_command)


TASK = PuzzleTask("coloring", add_builder=add_builder, augmentation="coloring", augment=augment,
                  verifier=verifier, nearest=nearest)
