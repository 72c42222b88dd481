"""ARC evaluation: the vote and pass@k on hand-made predictions, and the whole augment -> predict ->
invert -> vote loop with stand-in models whose answers we choose (right, partly wrong, halting)."""

import json
from pathlib import Path
from types import SimpleNamespace
import warnings

import numpy as np
import pytest
import torch
from torch import nn

from urm_ray.data import store
from urm_ray.data.config import DataConfig
from urm_ray.data.tasks import arc
from urm_ray.data.tasks.arc import augment as arc_augment
from urm_ray.data.tasks.arc.evaluate import Share, Shares, Voting, evaluate_arc, task_scores
from urm_ray.metrics import pass_at_k, place, ranked_votes as vote
from urm_ray.errors import ConfigError

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
    places = {pair: place(answers, A) for pair, answers in ranked.items()}
    assert places == {0: 1, 1: -1, 2: 0}
    assert [pass_at_k(places[0], k) for k in (1, 2, 3)] == [False, True, True]
    scores = task_scores(places, {"t": [0, 1], "u": [2], "v": [3]}, (1, 2))  # pair 3: no votes
    assert scores == {"t": {"pass_at_1": 0.0, "pass_at_2": 0.5}, "u": {"pass_at_1": 1.0, "pass_at_2": 1.0},
                      "v": {"pass_at_1": 0.0, "pass_at_2": 0.0}}


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
        return SimpleNamespace(segments=0, halted=torch.zeros(len(batch["inputs"]), dtype=torch.bool))

    def forward(self, carry, batch):
        self.calls += 1
        steps = carry.segments + 1
        rows = [self.answers[(x.numpy().astype(np.int8).tobytes(), int(i))]
                for x, i in zip(batch["inputs"], batch["puzzle_identifiers"])]
        logits = torch.nn.functional.one_hot(torch.from_numpy(np.stack(rows)).long(), 12).float()
        q = torch.full((len(rows),), 1.0 if steps >= self.halt_from else -1.0)
        halted = torch.full((len(rows),), steps >= self.max_segments)
        return SimpleNamespace(segments=steps, halted=halted), {"logits": logits, "q_halt_logits": q}


def _answers(path: Path, cfg: DataConfig, wrong=lambda aug: False) -> dict:
    """The right augmented answer per augmented test input, or a fixed wrong grid where
    `wrong(aug)` (the same wrong grid in every augmentation, so wrong votes pile up)."""
    table, test = arc.load_tasks(path), store.read_split(path, "test")
    k = cfg.num_augmentations
    rows = np.repeat(np.arange(len(test["inputs"])), k)
    aug = np.tile(np.arange(k), len(test["inputs"])).astype(np.int32)
    picked = {key: column[rows] for key, column in test.items()}
    x, y, ids = arc_augment.augment(picked, aug, cfg.shuffle_seed, table, k, False)
    bad = arc.encode(np.full((2, 2), 0, np.uint8))
    return {(xi.tobytes(), int(i)): (bad if wrong(a) else arc_augment.canonical(yi[None])[0])
            for xi, yi, i, a in zip(x, y, ids, aug)}


def test_right_answers_pass_every_task(dataset):
    cfg = DataConfig(path=str(dataset), num_augmentations=6, shuffle_seed=3)
    model = StandIn(_answers(dataset, cfg))
    report = evaluate_arc(model, cfg, voting=Voting(batch_size=7, pass_ks=(1, 2)))
    m = report["metrics"]
    assert m["arc/pass_at_1"] == m["arc/pass_at_2"] == 1.0
    assert m["arc/tasks"] == 5 and m["arc/predictions"] == 6 * m["arc/test_pairs"]
    assert sorted(report["tasks"]) == sorted(r["name"] for r in arc.load_tasks(dataset).records
                                             if r["held_out"])
    assert m["arc/mean_segments_run"] == 4 and m["arc/compute_saved"] == 0.0


def test_voting_outvotes_a_minority_of_wrong_augmentations(dataset):
    cfg = DataConfig(path=str(dataset), num_augmentations=6)
    minority = evaluate_arc(StandIn(_answers(dataset, cfg, lambda a: a in (1, 4))), cfg,
                            voting=Voting(pass_ks=(1, 2)))["metrics"]
    assert minority["arc/pass_at_1"] == 1.0
    majority = evaluate_arc(StandIn(_answers(dataset, cfg, lambda a: a != 2)), cfg,
                            voting=Voting(pass_ks=(1, 2)))["metrics"]
    assert majority["arc/pass_at_1"] == 0.0 and majority["arc/pass_at_2"] == 1.0
    fewer = evaluate_arc(StandIn(_answers(dataset, cfg, lambda a: a != 2)), cfg,
                         voting=Voting(views=2, pass_ks=(1, 2)))["metrics"]  # aug 0, 1: both wrong
    assert fewer["arc/pass_at_2"] == 0.0 and fewer["arc/augmentations"] == 2


def test_a_task_with_fewer_versions_than_views_votes_each_version_once(tmp_path):
    """A one-colour task symmetric under all 8 dihedrals has 9 distinct versions; with 12 views its
    aug indices 9-11 would repeat versions 0-2. Wrong answers on versions 0-2 lose 3 to 6 only
    when each version votes once (twice, they would tie 6 to 6 and the first seen, wrong, wins)."""
    ring_in, ring_out = [[0, 0, 0], [0, 1, 0], [0, 0, 0]], [[1, 1, 1], [1, 0, 1], [1, 1, 1]]
    ring = {"train": [{"input": ring_in, "output": ring_out}, {"input": ring_out, "output": ring_in}],
            "test": [{"input": ring_in, "output": ring_out}]}
    challenges = json.loads((ARC_DIR / "arc-agi_evaluation_challenges.json").read_text())
    solutions = json.loads((ARC_DIR / "arc-agi_evaluation_solutions.json").read_text())
    other = min(challenges)  # a many-coloured task: every view is a different version
    task = {"train": challenges[other]["train"],
            "test": [{"input": t["input"], "output": o}
                     for t, o in zip(challenges[other]["test"], solutions[other])]}
    (tmp_path / "src" / "evaluation").mkdir(parents=True)
    for name, raw in (("ring", ring), (other, task)):
        (tmp_path / "src" / "evaluation" / f"{name}.json").write_text(json.dumps(raw))
    arc.build(tmp_path / "arc", tmp_path / "src", subsets=["evaluation"], test_set="evaluation")
    table = arc.load_tasks(tmp_path / "arc")
    versions = dict(zip((r["name"] for r in table.records),
                        arc_augment.distinct_versions(np.array([1, 2]), table).tolist()))
    assert versions["ring"] == 9 and versions[other] > 12
    cfg = DataConfig(path=str(tmp_path / "arc"), num_augmentations=12, shuffle_seed=3)
    report = evaluate_arc(StandIn(_answers(tmp_path / "arc", cfg, lambda a: a % 9 < 3)), cfg,
                          voting=Voting(batch_size=5, pass_ks=(1, 2)))
    assert report["tasks"]["ring"] == {"pass_at_1": 1.0, "pass_at_2": 1.0}
    assert report["metrics"]["arc/predictions"] == 9 + 12 * len(task["test"])
    assert report["metrics"]["arc/augmentations"] == 12


def test_ranks_sharing_the_pairs_report_what_one_process_does(dataset):
    """Three DDP ranks each vote on a third of the test pairs; gathering their shares gives the
    single-process report (wrong answers in some views, so pass@1 and pass@2 differ by task)."""
    cfg = DataConfig(path=str(dataset), num_augmentations=4)
    answers = _answers(dataset, cfg, lambda a: a in (0, 1))  # two right, two alike wrong: a tie
    voting = Voting(batch_size=5, pass_ks=(1, 2))
    whole = evaluate_arc(StandIn(answers), cfg, voting=voting)
    shares: list[Share] = []
    for rank in (1, 2):  # the other ranks' shares, as the collective would gather them
        evaluate_arc(StandIn(answers), cfg, voting=voting,
                     shares=Shares(rank, 3, lambda share: shares.append(share) or [share]))
    parts = [share.rows for share in shares]
    split = evaluate_arc(StandIn(answers), cfg, voting=voting,
                         shares=Shares(0, 3, lambda share: [share, *shares]))
    assert split == whole and all(parts) and sum(parts) < whole["metrics"]["arc/predictions"]
    assert whole["metrics"]["arc/pass_at_1"] == 0.0 and whole["metrics"]["arc/pass_at_2"] == 1.0


def test_early_halting_saves_segments(dataset):
    cfg = DataConfig(path=str(dataset), num_augmentations=3)
    answers = _answers(dataset, cfg)
    full = StandIn(answers, max_segments=4, halt_from=2)
    m = evaluate_arc(full, cfg, voting=Voting(batch_size=16))["metrics"]
    assert m["arc/mean_segments_run"] == 4 and m["arc/mean_segments_q"] == 4
    early = StandIn(answers, max_segments=4, halt_from=2)
    m = evaluate_arc(early, cfg, voting=Voting(batch_size=16, halt_early=True))["metrics"]
    assert m["arc/mean_segments_run"] == 2 and m["arc/compute_saved"] == 0.5
    assert m["arc/pass_at_1"] == 1.0 and early.calls * 2 == full.calls


def test_bad_evaluation_options(dataset):
    cfg = DataConfig(path=str(dataset), num_augmentations=3)
    with pytest.raises(ConfigError, match=r"num_augmentations=4 must be in \[1, 3\]"):
        evaluate_arc(StandIn({}), cfg, voting=Voting(views=4))
    with pytest.raises(ConfigError, match="pass_ks"):
        evaluate_arc(StandIn({}), cfg, voting=Voting(pass_ks=(0,)))


def test_in_run_pass_at_k_equals_urm_ray_eval_on_the_checkpoint(dataset, tmp_path):
    """The trainer's evaluation (EMA weights, eval.width views with eval.views) reports the pass@k that
    `urm-ray eval --augmentations K` reports on the checkpoint saved at that step."""
    from urm_ray.config import load_config
    from urm_ray import evaluate
    from urm_ray.train.evaluation import InRun, Ranks
    from urm_ray.train import checkpoint
    from urm_ray.train.loop import task_spec
    from urm_ray.train.step import build_state, evaluation_model, train_step
    from urm_ray.typed import to_dict

    cfg = load_config("sudoku4-urm", [
        f"data.path={dataset}", "data.num_augmentations=3", "model.hidden_size=16",
        "model.num_heads=2", "model.num_layers=1", "model.loops=2", "model.max_segments=2",
        "model.puzzle_emb_dim=16", "optim.ema_decay=0.5", "optim.warmup_steps=0",
        "train.global_batch_size=4", "eval.batch_size=5", "eval.views=true", "eval.width=3",
        "train.compile=false"])
    meta = store.read_metadata(dataset)
    state = build_state(cfg, task_spec(cfg, meta), torch.device("cpu"))
    model, ema, optimizers = state.model, state.ema, state.optimizers
    evaluation = InRun.for_run(cfg, meta)
    assert evaluation.own_views == 3 and evaluation.scoring is not None  # the task scores itself: ARC's vote
    train = store.read_split(dataset, "train")
    batch = {"inputs": torch.from_numpy(train["inputs"][:4].astype(np.int32)),
             "labels": torch.from_numpy(train["labels"][:4].astype(np.int64)),
             "puzzle_identifiers": torch.from_numpy(train["puzzle_identifiers"][:4].astype(np.int32))}
    for _ in range(2):  # the EMA now differs from the weights
        train_step(state, batch)
    weights = [p.detach().clone() for p in model.parameters()]
    with evaluation_model(state) as evaluated:
        in_run = evaluation.own_metrics(evaluated, Ranks(0, 1, torch.device("cpu"), lambda s: s, lambda v: [v]))
    assert all(torch.equal(w, p) for w, p in zip(weights, model.parameters()))  # put back
    folder = tmp_path / "ckpt"
    folder.mkdir()
    checkpoint.save(folder, model, ema, optimizers, checkpoint.Position(step=2), to_dict(cfg))
    assert evaluate.task_of(folder).scoring is not None
    report = evaluate.evaluate(folder, cfg.eval, evaluate.Request("score", views=3, pass_ks=(1, 2))).metrics
    assert in_run["arc/pass_at_2"] == report["arc/pass_at_2"]
    assert in_run == report  # pass@1, pass@2 (k <= max(views, 2)), counts, segments
    assert in_run["arc/augmentations"] == 3 and in_run["arc/predictions"] == 3 * in_run["arc/test_pairs"]


def test_arc_views_beyond_the_puzzle_table_are_a_config_error(dataset, tmp_path):
    from urm_ray.config import load_config
    from urm_ray.train.driver import prepare

    args = [f"data.path={dataset}", "data.num_augmentations=3", f"checkpoint.storage_path={tmp_path}"]
    cfg = load_config("sudoku4-urm", [*args, "eval.views=true", "eval.width=4"])  # a sudoku run may
    with pytest.raises(ConfigError, match=r"eval.width=4 with eval.views=true must be <= 3 on arc data"):
        prepare(cfg)
    assert not any(tmp_path.iterdir())  # refused before the run wrote anything


def test_the_moved_views_key_names_its_new_place(dataset):
    from urm_ray.config import load_config

    with pytest.raises(ConfigError, match=r"train.eval_arc_views=4 has moved: write eval.views=true with "
                                          r"eval.width=<views>"):
        load_config("sudoku4-urm", [f"data.path={dataset}", "train.eval_arc_views=4"])
    # the value that meant "off", as every checkpoint saved before the move holds it, still loads
    assert not load_config("sudoku4-urm", [f"data.path={dataset}", "train.eval_arc_views=0"]).eval.views


def test_views_without_an_own_score_or_curves_warn(sudoku4, tmp_path):
    """On a task scored on one view, eval.views acts only through the test-time curves."""
    from urm_ray.config import load_config
    from urm_ray.train.driver import prepare

    args = [f"data.path={sudoku4}", f"checkpoint.storage_path={tmp_path}", "eval.views=true", "eval.width=4"]
    with pytest.warns(UserWarning, match="eval.views=true has no effect on sudoku data without eval.curves"):
        prepare(load_config("sudoku4-urm", args))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        prepare(load_config("sudoku4-urm", [*args, "eval.curves=true"]))
