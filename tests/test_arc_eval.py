"""ARC evaluation: the vote and pass@k on hand-made predictions, and the whole augment -> predict ->
invert -> vote loop with stand-in models whose answers we choose (right, partly wrong, halting)."""

import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from torch import nn

from urm_ray.data import arc_augment, store
from urm_ray.data.config import DataConfig
from urm_ray.data.tasks import arc
from urm_ray.errors import ConfigError
from urm_ray.train.arc_eval import evaluate_arc, pass_at_k, task_scores, vote

# ARC-AGI-1 training + evaluation in the Kaggle layout, as downloaded (all 800 tasks)
ARC_DIR = Path(__file__).resolve().parent / "fixtures" / "arc-agi"
A, B, C = b"a", b"b", b"c"


def test_vote_ranks_by_count_then_halting_probability():
    assert vote([A, B, B, C, B, A]) == [B, A, C]
    assert vote([A, B], q=[0.2, 0.9]) == [B, A]  # one vote each: the surer one first
    assert vote([A, B, A, B], q=[0.9, 0.1, 0.9, 0.2]) == [A, B]
    assert vote([C, A, B]) == [C, A, B]  # full tie: first seen first


def test_pass_at_k_and_task_scores():
    ranked = {0: [B, A, C], 1: [C], 2: [A, B]}
    truths = {0: A, 1: A, 2: A}
    assert [pass_at_k(ranked[0], A, k) for k in (1, 2, 3)] == [False, True, True]
    scores = task_scores(ranked, truths, {"t": [0, 1], "u": [2]}, (1, 2))
    assert scores == {"t": {"pass_at_1": 0.0, "pass_at_2": 0.5}, "u": {"pass_at_1": 1.0, "pass_at_2": 1.0}}


@pytest.fixture(scope="module")
def dataset(tmp_path_factory) -> Path:
    """5 training + 5 evaluation tasks of the ARC fixture, evaluation held out."""
    src = tmp_path_factory.mktemp("src")
    for subset in ("training", "evaluation"):
        for kind in ("challenges", "solutions"):
            data = json.loads((ARC_DIR / f"arc-agi_{subset}_{kind}.json").read_text())
            keep = {k: data[k] for k in sorted(data)[:5]}
            (src / f"arc-agi_{subset}_{kind}.json").write_text(json.dumps(keep))
    out = tmp_path_factory.mktemp("data") / "arc"
    arc.build(out, src)
    return out


class StandIn(nn.Module):
    """Answers each (augmented input, puzzle id) with a chosen canvas; the Q-head says halt from
    segment `halt_from` on; eval-mode ACT runs `max_segments` segments."""

    def __init__(self, answers: dict, max_segments: int = 4, halt_from: int = 99):
        super().__init__()
        self.answers, self.max_segments, self.halt_from = answers, max_segments, halt_from
        self.calls = 0

    def initial_carry(self, batch):
        return SimpleNamespace(steps=0, halted=torch.zeros(len(batch["inputs"]), dtype=torch.bool))

    def forward(self, carry, batch):
        self.calls += 1
        steps = carry.steps + 1
        rows = [self.answers[(x.numpy().astype(np.int8).tobytes(), int(i))]
                for x, i in zip(batch["inputs"], batch["puzzle_identifiers"])]
        logits = torch.nn.functional.one_hot(torch.from_numpy(np.stack(rows)).long(), 12).float()
        q = torch.full((len(rows),), 1.0 if steps >= self.halt_from else -1.0)
        halted = torch.full((len(rows),), steps >= self.max_segments)
        return SimpleNamespace(steps=steps, halted=halted), {"logits": logits, "q_halt_logits": q}


def _answers(path: Path, cfg: DataConfig, wrong=lambda aug: False) -> dict:
    """The right augmented answer per augmented test input, or a fixed wrong grid where
    `wrong(aug)` (the same wrong grid in every augmentation, so wrong votes pile up)."""
    table, test = arc.load_tasks(path), store.read_split(path, "test")
    k = cfg.num_augmentations
    rows = np.repeat(np.arange(len(test["inputs"])), k)
    aug = np.tile(np.arange(k), len(test["inputs"])).astype(np.int32)
    x, y, ids = arc_augment.augment(test["inputs"][rows], test["labels"][rows],
                                    test["puzzle_identifiers"][rows], test["puzzle_index"][rows],
                                    aug, cfg.shuffle_seed, table, k, False)
    bad = arc.encode(np.full((2, 2), 0, np.uint8))
    return {(xi.tobytes(), int(i)): (bad if wrong(a) else arc_augment.canonical(yi[None])[0])
            for xi, yi, i, a in zip(x, y, ids, aug)}


def test_right_answers_pass_every_task(dataset):
    cfg = DataConfig(path=str(dataset), num_augmentations=6, shuffle_seed=3)
    model = StandIn(_answers(dataset, cfg))
    report = evaluate_arc(model, cfg, batch_size=7, pass_ks=(1, 2))
    m = report["metrics"]
    assert m["arc/pass_at_1"] == m["arc/pass_at_2"] == 1.0
    assert m["arc/tasks"] == 5 and m["arc/predictions"] == 6 * m["arc/test_pairs"]
    assert sorted(report["tasks"]) == sorted(r["name"] for r in arc.load_tasks(dataset).records
                                             if r["held_out"])
    assert m["arc/mean_segments_run"] == 4 and m["arc/compute_saved"] == 0.0


def test_voting_outvotes_a_minority_of_wrong_augmentations(dataset):
    cfg = DataConfig(path=str(dataset), num_augmentations=6)
    minority = evaluate_arc(StandIn(_answers(dataset, cfg, lambda a: a in (1, 4))), cfg,
                            pass_ks=(1, 2))["metrics"]
    assert minority["arc/pass_at_1"] == 1.0
    majority = evaluate_arc(StandIn(_answers(dataset, cfg, lambda a: a != 2)), cfg,
                            pass_ks=(1, 2))["metrics"]
    assert majority["arc/pass_at_1"] == 0.0 and majority["arc/pass_at_2"] == 1.0
    fewer = evaluate_arc(StandIn(_answers(dataset, cfg, lambda a: a != 2)), cfg,
                         num_augmentations=2, pass_ks=(1, 2))["metrics"]  # aug 0, 1: both wrong
    assert fewer["arc/pass_at_2"] == 0.0 and fewer["arc/augmentations"] == 2


def test_early_halting_saves_segments(dataset):
    cfg = DataConfig(path=str(dataset), num_augmentations=3)
    answers = _answers(dataset, cfg)
    full = StandIn(answers, max_segments=4, halt_from=2)
    m = evaluate_arc(full, cfg, batch_size=16)["metrics"]
    assert m["arc/mean_segments_run"] == 4 and m["arc/mean_segments_q"] == 4
    early = StandIn(answers, max_segments=4, halt_from=2)
    m = evaluate_arc(early, cfg, batch_size=16, halt_early=True)["metrics"]
    assert m["arc/mean_segments_run"] == 2 and m["arc/compute_saved"] == 0.5
    assert m["arc/pass_at_1"] == 1.0 and early.calls * 2 == full.calls


def test_bad_evaluation_options(dataset):
    cfg = DataConfig(path=str(dataset), num_augmentations=3)
    with pytest.raises(ConfigError, match=r"num_augmentations=4 must be in \[1, 3\]"):
        evaluate_arc(StandIn({}), cfg, num_augmentations=4)
    with pytest.raises(ConfigError, match="pass_ks"):
        evaluate_arc(StandIn({}), cfg, pass_ks=(0,))
