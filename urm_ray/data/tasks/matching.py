"""Searches over a task's enumerated valid answers: each answer's target, matched within its input.

A task whose inputs have few enough valid answers to list (N-Queens, whole 4x4 Sudoku boards)
builds its ``nearest`` search (``PuzzleTask.nearest``, GRAM's ``model.prior_match_targets:
nearest``) from a function that lists them for one input:

    search = matched_search(lambda input_row: boards_keeping(all_boards, input_row))
    targets = search(answers, inputs, labels)        # numpy [N, L] -> [N, L]

The rows of one input (the blank board: a whole batch) are matched one to one to that input's
valid answers at the least total number of differing tokens, each answer taken at most
ceil(rows / answers) times. A row alone with its input gets its nearest valid answer; a group of
draws gets a target each that is near it, and together the targets spread over the answers, so
training towards them does not pull every draw onto one solution.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from urm_ray.data.tasks.task import NumpySearch

# one input row [L] -> every valid answer of it [S, L] (S may be 0)
AnswersOf = Callable[[np.ndarray], np.ndarray]


def matched_targets(answers: np.ndarray, candidates: np.ndarray) -> np.ndarray:
    """Indices [m] into ``candidates`` [S, L] (S >= 1) for ``answers`` [m, L]: a minimum-cost
    assignment (cost = tokens that differ) in which each candidate serves at most ceil(m / S) rows."""
    from scipy.optimize import linear_sum_assignment  # on first use: most processes never match

    copies = math.ceil(len(answers) / len(candidates))
    distance = (answers[:, None, :] != candidates[None, :, :]).sum(-1)  # [m, S]
    rows, cols = linear_sum_assignment(np.tile(distance, (1, copies)))
    chosen = np.empty(len(answers), dtype=np.int64)
    chosen[rows] = cols % len(candidates)
    return chosen


def matched_search(answers_of: AnswersOf) -> NumpySearch:
    """The search that matches each input's rows to ``answers_of(input)`` (``matched_targets``);
    rows of an input with no valid answer keep their labels."""

    def search(answers: np.ndarray, inputs: np.ndarray, labels: np.ndarray) -> np.ndarray:
        targets = np.array(labels, dtype=np.int64)
        unique, group = np.unique(np.asarray(inputs), axis=0, return_inverse=True)
        for index, input_row in enumerate(unique):
            members = np.flatnonzero(group.reshape(-1) == index)
            candidates = answers_of(input_row)
            if len(candidates):
                targets[members] = candidates[matched_targets(np.asarray(answers)[members], candidates)]
        return targets

    return search


def keeping_givens(boards: np.ndarray, input_row: np.ndarray, given: np.ndarray) -> np.ndarray:
    """The rows of ``boards`` [S, L] equal to ``input_row`` [L] wherever ``given`` [L] is True."""
    return boards[(boards[:, given] == input_row[given]).all(axis=1)]
