"""GRAM on URM's core: registered, exactly URM without noise, a guided transition per loop pass
(posterior in training, prior at inference), KL at every pass, the forward-only passes'
KL training only the guidance heads, one latent per row, and (slow) that briefly trained (the
sudoku4-gram-urm recipe; nqueens6-gram's on the blank board) its prior decodes answers the task's
verifier accepts."""

import pytest
import torch

from urm_ray.models.gram_urm import GRAMURM, GRAMURMConfig
from urm_ray.models.registry import TaskSpec, build_model, config_class
from urm_ray.models.urm import URMConfig

from guided import check_free_kl_trains_only_heads, check_prior_match_pass, check_prior_match_start, head_calls, roll

TASK = TaskSpec(vocab_size=10, seq_len=12, num_puzzle_identifiers=3)
TINY = {"hidden_size": 32, "num_heads": 4, "num_layers": 1, "loops": 4, "truncation": 2,
        "puzzle_emb_dim": 32, "max_segments": 3, "latent_dim": 8}


def test_registered():
    assert config_class("gram_urm") is GRAMURMConfig
    model = build_model(GRAMURMConfig(**TINY), TASK)
    assert isinstance(model, GRAMURM) and model.config.kl_coef == 1.0


@pytest.mark.parametrize("train", [False, True])
def test_noise_off_is_exactly_urm(model_batch, train):
    torch.manual_seed(0)
    with pytest.warns(UserWarning, match="noise_scale=0"):
        gram = build_model(GRAMURMConfig(**{**TINY, "noise_scale": 0.0}), TASK)
    urm = build_model(URMConfig(**{k: v for k, v in TINY.items() if k != "latent_dim"}), TASK)
    assert gram.load_state_dict(urm.state_dict()) is not None  # the same weights, no extra ones
    gram.train(train), urm.train(train)
    batch = model_batch(TASK)
    torch.manual_seed(1)
    ours = roll(gram, batch)
    torch.manual_seed(1)
    for mine, theirs in zip(ours, roll(urm, batch)):
        for key in ("logits", "q_halt_logits", "q_continue_logits"):
            assert torch.equal(mine[key], theirs[key]), key


def test_every_loop_pass_is_a_guided_transition(model_batch):
    torch.manual_seed(0)
    model = build_model(GRAMURMConfig(**TINY), TASK)
    batch = model_batch(TASK)
    calls, outputs = head_calls(model.train(), batch)
    # 4 passes: the posterior guides each, the prior is charged at each, plus the Q-halt decode
    assert calls == {"posterior_head": 4, "prior_head": 5}
    assert outputs["kl"] > outputs["kl_first"] + outputs["kl_last"] > 0  # the middle passes count
    assert outputs["aux_loss"].requires_grad and "halt_logits" in outputs
    calls, outputs = head_calls(model.eval(), batch)
    assert calls == {"posterior_head": 0, "prior_head": 4} and "aux_loss" not in outputs
    assert not torch.equal(roll(model, batch, 1)[0]["logits"], roll(model, batch, 1)[0]["logits"])


def test_forward_only_passes_kl_trains_only_the_heads(model_batch):
    """Charging the truncated passes changes the heads' and label embedding's gradients only."""
    check_free_kl_trains_only_heads(
        lambda transitions: build_model(GRAMURMConfig(**{**TINY, "kl_transitions": transitions}), TASK),
        model_batch(TASK), "blocks.")


# --- one latent per row (latent_scope: row) ------------------------------------------------------

ROW = {**TINY, "puzzle_emb_dim": 0, "latent_scope": "row"}


def test_row_latent_is_one_draw_per_row_read_at_each_position_by_its_own_map():
    torch.manual_seed(0)
    model = build_model(GRAMURMConfig(**ROW), TASK)
    u = torch.randn(3, TASK.seq_len, 32)
    mean, logvar = model.prior_head(u)
    assert mean.shape == logvar.shape == (3, 1, 8)  # one latent per row
    torch.manual_seed(5)
    step = model.perturb(u, (mean, logvar)) - u  # [3, L, 32]
    torch.manual_seed(5)
    eps = mean + torch.exp(0.5 * logvar) * torch.randn(3, 1, 8)
    maps = model.noise_proj.weight  # [L, 8, 32]: position t reads the draw through maps[t]
    torch.testing.assert_close(step, torch.einsum("bl,tlh->bth", eps[:, 0], maps))
    assert not torch.allclose(step[:, 0], step[:, 1]) and not torch.allclose(step[0], step[1])


def test_row_posterior_tells_apart_answers_that_differ_only_in_where_tokens_sit():
    """A blank board's embeddings are alike at every position under RoPE, so the row scope adds
    learned positions: the pooled posterior then sees which token sits where, not only how many."""
    torch.manual_seed(0)
    model = build_model(GRAMURMConfig(**ROW), TASK).train()
    blank = torch.ones(1, TASK.seq_len, dtype=torch.long)
    x = model.embed_input(blank, torch.zeros(1, dtype=torch.long))
    assert not torch.allclose(x[0, 0], x[0, 1])  # positions read apart on the blank board
    label = torch.arange(TASK.seq_len).remainder(3).unsqueeze(0) + 1
    shuffled = label.flip(-1)  # the same token counts in other places
    means = [model.posterior_head(torch.cat([x, model.embed_labels(y)], dim=-1))[0] for y in (label, shuffled)]
    assert not torch.allclose(*means)
    _, outputs = model(model.initial_carry({"inputs": blank, "labels": label, "puzzle_identifiers": blank[:, 0]}),
                       {"inputs": blank, "labels": label, "puzzle_identifiers": blank[:, 0]})
    assert outputs["kl"] > 0


# --- a short in-process training run on 4x4 Sudoku: the prior decodes valid answers -------------

SUDOKU = {"hidden_size": 32, "num_heads": 2, "num_layers": 1, "expansion": 2.0, "loops": 3, "truncation": 1,
          "puzzle_emb_dim": 0, "max_segments": 2, "latent_dim": 4,
          "kl_coef": 8.4, "noise_scale": 0.095}  # the sudoku4-gram-urm recipe (README, GRAM)


def _sudoku(count: int, seed: int) -> dict:
    from urm_ray.data.tasks.sudoku import generate_puzzles

    questions, solutions = generate_puzzles(4, count, blanks=2, seed=seed)
    inputs = torch.from_numpy(questions).long() + 1  # tokens: digit + 1, blank 1
    return {"inputs": inputs, "labels": torch.from_numpy(solutions).long() + 1,
            "puzzle_identifiers": torch.zeros(count, dtype=torch.long)}


@pytest.fixture(scope="module")
def sudoku_gram():
    """A tiny GRAM-URM at its fresh init, and after 700 steps (pure torch, no Ray) on 4x4 Sudoku
    with 2 blanks (about 25 s here; the valid share was 0.50 at step 600, 0.59 at 700)."""
    import copy

    from urm_ray.losses import guided_loss

    torch.manual_seed(0)
    model = build_model(GRAMURMConfig(**SUDOKU), TaskSpec(vocab_size=6, seq_len=16, num_puzzle_identifiers=1))
    fresh = copy.deepcopy(model).eval()
    train, rows = _sudoku(512, seed=0), 64
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.0)
    carry = None
    for _ in range(700):
        pick = torch.randint(0, 512, (rows,))
        batch = {k: v[pick] for k, v in train.items()}
        carry = model.initial_carry(batch) if carry is None else carry
        carry, outputs = model.train()(carry, batch)
        loss, _ = guided_loss(outputs, carry.current_data["labels"], carry.halted, carry.segments, "softmax")
        (loss / rows).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return fresh, model.eval(), _sudoku(128, seed=1)


@pytest.mark.slow
def test_trained_prior_samples_are_valid_answers_and_fresh_ones_are_not(sudoku_gram):
    """Decoded from the prior (4 samples of 128 held-out puzzles), the trained model's answers
    mostly pass the Sudoku verifier (givens kept, rules obeyed); the fresh model's do not."""
    from urm_ray.data.tasks.verify import verifier_for
    from urm_ray.eval.heldout import sample_answers

    fresh, trained, held_out = sudoku_gram
    accepts = verifier_for("sudoku", 16)
    inputs, labels = (held_out[k].repeat(4, 1) for k in ("inputs", "labels"))
    valid = {}
    for name, model in (("fresh", fresh), ("trained", trained)):
        torch.manual_seed(1)
        with torch.no_grad():
            answers, _ = sample_answers(model, held_out, num_samples=4)  # [4, 128, 16]
        valid[name] = accepts(answers.reshape(-1, 16), inputs, labels).float().mean().item()
    assert valid["trained"] >= 0.4 and valid["fresh"] <= 0.05, valid


# --- a short in-process training run on 6x6 N-Queens from the blank board, one latent per row ----

QUEENS = {"hidden_size": 32, "num_heads": 4, "num_layers": 1, "expansion": 2.0, "loops": 3, "truncation": 1,
          "puzzle_emb_dim": 0, "max_segments": 1, "latent_dim": 16, "latent_scope": "row"}  # nqueens6-gram, smaller


@pytest.mark.slow
def test_row_latent_gram_draws_several_valid_queens_boards_from_the_blank_board():
    """250 steps (pure torch, no Ray) on the 4 solutions of 6-queens, every one a label of the
    blank board: the prior's boards pass the verifier and cover several solutions; at the fresh
    init none does. (Its valid share swings between 0.4 and 0.7 from step 100 to 500 here.)"""
    import copy

    from urm_ray.data.tasks.nqueens import solutions, valid_queens_mask
    from urm_ray.losses import guided_loss
    from urm_ray.eval.heldout import generate_unconditional

    torch.manual_seed(0)
    boards = torch.from_numpy(solutions(6)).long()  # [4, 36]
    model = build_model(GRAMURMConfig(**QUEENS), TaskSpec(vocab_size=3, seq_len=36, num_puzzle_identifiers=1))
    fresh = copy.deepcopy(model).eval()
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.0)
    carry, rows = None, 32
    for _ in range(250):
        labels = boards[torch.randint(0, len(boards), (rows,))]
        batch = {"inputs": torch.ones_like(labels), "labels": labels, "puzzle_identifiers": torch.zeros(rows)}
        carry = model.initial_carry(batch) if carry is None else carry
        carry, outputs = model.train()(carry, batch)
        loss, _ = guided_loss(outputs, carry.current_data["labels"], carry.halted, carry.segments, "softmax")
        (loss / rows).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    with torch.no_grad():
        trained, untrained = (generate_unconditional(m.eval(), num_samples=64).numpy() for m in (model, fresh))
    valid = valid_queens_mask(trained, 6)
    assert valid.mean() >= 0.3 and not valid_queens_mask(untrained, 6).any()
    assert len({board.tobytes() for board in trained[valid]}) >= 3


def test_prior_match_adds_a_prior_guided_pass_that_trains_the_core_and_the_prior(model_batch):
    check_prior_match_pass(lambda match: build_model(GRAMURMConfig(**{**TINY, "prior_match": match}), TASK),
                           model_batch(TASK), transitions=4, core="blocks.")


def test_prior_match_runs_from_its_start_step(model_batch):
    check_prior_match_start(
        lambda start: build_model(GRAMURMConfig(**{**TINY, "prior_match": 1.0, "prior_match_start": start}), TASK),
        model_batch(TASK))


def test_sample_halt_q_stops_each_draw_where_its_halt_head_says(model_batch):
    from urm_ray.eval.heldout import sample_answers

    torch.manual_seed(0)
    model = build_model(GRAMURMConfig(**TINY, sample_halt="q"), TASK).eval()
    batch = model_batch(TASK)

    def draw(mode: str) -> tuple[torch.Tensor, int]:
        model.sample_halt = mode
        torch.manual_seed(2)  # the same noise draws
        return sample_answers(model, batch, 4)

    # fresh, the halt head says continue (Q-halt logit -5): every draw runs to the limit
    (q_answers, q_segments), (limit_answers, limit_segments) = draw("q"), draw("limit")
    assert q_segments == limit_segments == TINY["max_segments"] and torch.equal(q_answers, limit_answers)
    with torch.no_grad():
        model.q_head.bias[0] = 5.0  # now it says halt at once
    answers, segments = draw("q")
    repeated = {k: v.repeat(4, *([1] * (v.ndim - 1))) for k, v in batch.items()}
    torch.manual_seed(2)
    with torch.no_grad():
        _, first = model(model.initial_carry(repeated), repeated)
    assert segments == 1 and torch.equal(answers.flatten(0, 1), first["logits"].argmax(-1))
    assert draw("limit")[1] == TINY["max_segments"]  # "limit" ignores the head


def test_sample_temperature_scales_only_the_prior_draws_of_eval_mode(model_batch):
    torch.manual_seed(0)
    model = build_model(GRAMURMConfig(**TINY), TASK)
    batch = model_batch(TASK)

    def logits(temperature: float, seed: int) -> torch.Tensor:
        model.sample_temperature = temperature
        torch.manual_seed(seed)
        return roll(model, batch, 1)[0]["logits"]

    model.eval()
    assert torch.equal(logits(0.0, 1), logits(0.0, 2))  # the prior's mean: no noise left
    assert not torch.equal(logits(1.0, 1), logits(1.0, 2))
    cold, warm = logits(0.5, 1), logits(1.0, 1)  # the same normal draws, half the spread
    assert not torch.equal(cold, warm)
    model.train()  # training draws (posterior, the Q-halt decode's prior) keep temperature 1
    assert torch.equal(logits(0.0, 3), logits(1.0, 3))
