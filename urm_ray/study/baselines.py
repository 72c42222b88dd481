"""The published figures a study row is compared with: URM, HRM, TRM and GRAM on Sudoku-Extreme,
Maze-Hard, ARC-AGI-1 and ARC-AGI-2, each with the paper and the table or section it is read from.

    published("urm", "arc-agi-1")   # [Baseline(family="urm", ..., value=0.538, ...)]

Only figures printed in the papers' text are here; a (family, benchmark) pair without one has no
entry, and its table cell stays empty. Values are fractions, on the scale of the metric they
compare with (``metric``). Where a paper quotes both the original authors' figure and its own
re-run, both are kept, the re-run first: it is the one measured under the citing paper's setup.
"""

from __future__ import annotations

from dataclasses import dataclass

BENCHMARKS = ("sudoku-extreme", "maze-hard", "arc-agi-1", "arc-agi-2")
FAMILIES = ("urm", "hrm", "trm", "gram")

URM_TABLE_1 = "Universal Reasoning Model (arXiv:2512.14693), Table 1 and Section 4.2"
GRAM_TABLE_8 = "Generative Recursive Reasoning (GRAM), Table 8 (the paper's own runs, mean of 3 seeds)"
GRAM_SECTION_4_1 = "Generative Recursive Reasoning (GRAM), Section 4.1 (the original authors' figure, quoted)"


@dataclass(frozen=True)
class Baseline:
    family: str  # model family (a study row's ``family``)
    benchmark: str  # one of BENCHMARKS
    metric: str  # the metric of ours it compares with
    value: float  # a fraction, as that metric
    source: str  # paper, table or section
    measure: str  # what the paper calls it


BASELINES: tuple[Baseline, ...] = (
    Baseline("urm", "arc-agi-1", "arc/pass_at_1", 0.538, URM_TABLE_1, "pass@1"),
    Baseline("urm", "arc-agi-2", "arc/pass_at_1", 0.160, URM_TABLE_1, "pass@1"),
    Baseline("urm", "sudoku-extreme", "eval/exact_accuracy", 0.776, URM_TABLE_1, "accuracy"),
    Baseline("trm", "arc-agi-1", "arc/pass_at_1", 0.400, URM_TABLE_1, "pass@1"),
    Baseline("hrm", "arc-agi-1", "arc/pass_at_1", 0.344, URM_TABLE_1, "pass@1"),
    Baseline("trm", "sudoku-extreme", "eval/exact_accuracy", 0.836, GRAM_TABLE_8, "accuracy"),
    Baseline("trm", "sudoku-extreme", "eval/exact_accuracy", 0.874, GRAM_SECTION_4_1, "accuracy"),
    Baseline("hrm", "sudoku-extreme", "eval/exact_accuracy", 0.568, GRAM_TABLE_8, "accuracy"),
    Baseline("hrm", "sudoku-extreme", "eval/exact_accuracy", 0.550, GRAM_SECTION_4_1, "accuracy"),
)


def published(family: str, benchmark: str) -> list[Baseline]:
    """The figures for ``family`` on ``benchmark``, the citing paper's own re-run first."""
    return [b for b in BASELINES if b.family == family and b.benchmark == benchmark]
