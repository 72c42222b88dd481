"""GRAM: config, paper size, the deterministic core, where the guidance comes from, truncated
gradients and the KL term."""

import pytest
import torch

from urm_ray.errors import ConfigError
from urm_ray.losses import guided_loss
from urm_ray.models.gram import GRAM, LOGVAR_MAX, LOGVAR_MIN, GRAMConfig, kl_coef_at
from urm_ray.models.registry import TaskSpec, build_model, config_class
from urm_ray.models.trm import TRMConfig

from gradients import grads
from guided import check_free_kl_trains_only_heads, check_prior_match_pass, check_prior_match_start, head_calls, roll

TASK = TaskSpec(vocab_size=10, seq_len=12, num_puzzle_identifiers=3)
TINY = {"hidden_size": 32, "num_heads": 4, "num_layers": 1, "h_cycles": 3, "l_cycles": 2, "puzzle_emb_dim": 32,
        "puzzle_emb_len": 2, "max_segments": 3, "latent_dim": 8}
# the paper's algorithm 1: KL of the last transition only, summed, Q-halt on the training state
PAPER = {"kl_transitions": "last", "kl_reduction": "sum", "halt_decode": "posterior"}


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"latent_dim": -1}, "model.latent_dim=-1"),
        ({"noise_scale": -0.5}, "model.noise_scale=-0.5"),
        ({"kl_coef": -1.0}, "model.kl_coef=-1.0"),
        ({"kl_balance": 1.5}, "model.kl_balance=1.5"),
        ({"prior_match": -0.5}, "model.prior_match=-0.5"),
        ({"prior_match": 1.0, "prior_match_start": -1}, "model.prior_match_start=-1"),
        ({"kl_coef_start": 0.5}, r"model.kl_coef_start=0.5 needs .* model.kl_ramp_steps >= 1 \(got 0\)"),
        ({"kl_coef_start": -1.0, "kl_ramp_steps": 5}, "model.kl_coef_start=-1.0"),
        ({"kl_ramp_steps": 5}, r"model.kl_ramp_steps=5 needs model.kl_coef_start"),
        ({"h_cycles": 0}, "model.h_cycles=0"),
    ],
)
def test_invalid_config_names_the_key(overrides, message):
    with pytest.raises(ConfigError, match=message):
        GRAMConfig(**{**TINY, **overrides})


def test_an_unknown_latent_scope_names_the_key_and_the_choices():
    from urm_ray.config import load_config

    with pytest.raises(ConfigError, match=r"model.latent_scope='cell': expected one of \['position', 'row'\]"):
        load_config("nqueens6-gram", ["model.latent_scope=cell"])


def test_options_without_effect_warn():
    with pytest.warns(UserWarning, match="model.noise_scale=0.*model.prior_match"):
        GRAMConfig(noise_scale=0.0)
    with pytest.warns(UserWarning, match="model.prior_match_targets='nearest' has no effect with model.prior_match=0"):
        GRAMConfig(prior_match_targets="nearest")
    with pytest.warns(UserWarning, match="model.prior_match_start=100 has no effect with model.prior_match=0"):
        GRAMConfig(prior_match_start=100)


def test_registered_and_paper_size():
    assert config_class("gram") is GRAMConfig
    cfg = GRAMConfig()
    assert (cfg.hidden_size, cfg.num_layers, cfg.expansion, cfg.prefix_len, cfg.latent_dim, cfg.kl_balance) == (
        512, 2, 4.0, 16, 256, 0.8)
    model = build_model(cfg, TaskSpec(vocab_size=11, seq_len=81, num_puzzle_identifiers=2))
    trm = 6_828_034  # TRM at the same size (test_models_trm.py)
    prior = 512 * 2 * 1536 + 1536 * 2 * 256  # SwiGLU head: u -> (mean, logvar)
    posterior = 1024 * 2 * 1536 + 1536 * 2 * 256  # [u; repr(y)] -> (mean, logvar)
    extra = prior + posterior + 256 * 512 + 11 * 512  # + latent projection + label embedding
    assert sum(p.numel() for p in model.parameters()) == trm + extra == 13_256_194


@pytest.mark.parametrize("train", [False, True])
def test_noise_off_is_exactly_trm(model_batch, train):
    torch.manual_seed(0)
    with pytest.warns(UserWarning, match="noise_scale=0"):
        gram = build_model(GRAMConfig(**{**TINY, "noise_scale": 0.0}), TASK)
    trm = build_model(TRMConfig(**{k: v for k, v in TINY.items() if k != "latent_dim"}), TASK)
    missing, unexpected = gram.load_state_dict(trm.state_dict(), strict=False)
    assert not unexpected and all(k.split(".")[0] in {"prior_head", "posterior_head", "noise_proj", "label_embed"}
                                  for k in missing)
    gram.train(train), trm.train(train)
    batch = model_batch(TASK)
    torch.manual_seed(1)  # same exploration draws in training
    ours = roll(gram, batch)
    torch.manual_seed(1)
    reference = roll(trm, batch)
    for mine, theirs in zip(ours, reference):
        assert "aux_loss" not in mine
        for key in ("logits", "q_halt_logits", "q_continue_logits"):
            assert torch.equal(mine[key], theirs[key]), key


def test_switching_noise_off_on_a_built_model_gives_its_core(model_batch):
    torch.manual_seed(0)
    gram = build_model(GRAMConfig(**TINY), TASK).eval()
    batch = model_batch(TASK)
    assert not torch.equal(roll(gram, batch, 1)[0]["logits"], roll(gram, batch, 1)[0]["logits"])  # stochastic
    gram.noise_scale = 0.0
    first, second = roll(gram, batch, 1)[0], roll(gram, batch, 1)[0]
    assert torch.equal(first["logits"], second["logits"])


@pytest.mark.parametrize(("recipe", "prior_calls"), [({}, 4), (PAPER, 1)])
def test_posterior_guides_every_training_transition_and_prior_every_eval_one(model_batch, recipe, prior_calls):
    model = build_model(GRAMConfig(**TINY, **recipe), TASK)
    batch = model_batch(TASK)
    calls, outputs = head_calls(model.train(), batch)
    # posterior in all 3 transitions; the prior for each charged KL (3, or the paper's last one)
    # and, with halt_decode=prior, once more for the Q-head's prior-guided decode
    assert calls == {"posterior_head": 3, "prior_head": prior_calls}
    assert outputs["aux_loss"].requires_grad and not outputs["kl"].requires_grad
    assert ("halt_logits" in outputs) == (recipe.get("halt_decode", "prior") == "prior")
    calls, outputs = head_calls(model.eval(), batch)
    assert calls == {"posterior_head": 0, "prior_head": 3} and "aux_loss" not in outputs


def test_log_variance_is_clamped():
    model = build_model(GRAMConfig(**TINY), TASK)
    with torch.no_grad():
        model.prior_head.down_proj.weight.mul_(1e4)
    _, logvar = model.prior_head(torch.randn(2, 5, 32))
    assert logvar.min() >= LOGVAR_MIN and logvar.max() <= LOGVAR_MAX
    assert (logvar == LOGVAR_MIN).any() and (logvar == LOGVAR_MAX).any()


def test_kl_is_zero_when_posterior_equals_prior(model_batch):
    model = build_model(GRAMConfig(**TINY), TASK).train()
    with torch.no_grad():  # posterior ignores repr(y) and reuses the prior's weights on u
        post, prior = model.posterior_head, model.prior_head
        post.gate_up_proj.weight.zero_()
        post.gate_up_proj.weight[:, :32] = prior.gate_up_proj.weight
        post.down_proj.weight.copy_(prior.down_proj.weight)
    _, outputs = model(model.initial_carry(model_batch(TASK)), model_batch(TASK))
    assert outputs["kl"] == outputs["kl_first"] == outputs["kl_last"] == outputs["aux_loss"] == 0


def test_kl_of_every_posterior_guided_transition_is_positive(model_batch):
    torch.manual_seed(0)
    model = build_model(GRAMConfig(**TINY), TASK).train()
    _, outputs = model(model.initial_carry(model_batch(TASK)), model_batch(TASK))
    # 3 transitions: the middle one's KL is what the total holds beyond the first and the last
    assert outputs["kl_first"] > 0 and outputs["kl_last"] > 0
    assert outputs["kl"] > outputs["kl_first"] + outputs["kl_last"]


@pytest.mark.parametrize("reduction", ["sum", "token_mean"])
def test_aux_loss_is_the_weighted_balanced_kl(model_batch, reduction):
    torch.manual_seed(0)
    model = build_model(GRAMConfig(**{**TINY, "kl_coef": 0.25, "kl_reduction": reduction}), TASK).train()
    batch = model_batch(TASK)
    labels = batch["labels"]
    carry, outputs = model(model.initial_carry(batch), batch)
    assert outputs["kl"] > 0
    tokens = (labels != -100).sum(-1).clamp_min(1)
    if reduction == "sum":
        torch.testing.assert_close(outputs["aux_loss"].detach(), 0.25 * outputs["kl"])
    else:  # every row of the fixture has the same number of supervised tokens
        assert bool((tokens == tokens[0]).all())
        torch.testing.assert_close(outputs["aux_loss"].detach(), 0.25 * outputs["kl"] / tokens[0])
    total, metrics = guided_loss(outputs, carry.current_data["labels"], carry.halted, carry.segments)
    torch.testing.assert_close(total, metrics["lm_loss"].double() + 0.5 * metrics["q_halt_loss"].double()
                               + outputs["aux_loss"].double())
    assert metrics["kl"] == outputs["kl"] and metrics["kl_last"] == outputs["kl_last"]


def test_kl_schedule_ramps_the_weight_of_the_kl(model_batch):
    """kl_coef_start -> kl_coef over kl_ramp_steps, then kl_coef; the training loop sets the step."""
    config = GRAMConfig(**{**TINY, "kl_coef": 4.0, "kl_coef_start": 0.5, "kl_ramp_steps": 100,
                           "kl_reduction": "sum"})
    assert [kl_coef_at(config, step) for step in (0, 50, 100, 1000)] == [0.5, 2.25, 4.0, 4.0]
    assert kl_coef_at(GRAMConfig(**{**TINY, "kl_coef": 3.0}), 0) == 3.0  # no schedule: constant
    torch.manual_seed(0)
    model = build_model(config, TASK).train()
    batch = model_batch(TASK)
    for step, weight in ((0, 0.5), (50, 2.25), (500, 4.0)):
        model.schedule(step)
        torch.manual_seed(1)
        _, outputs = model(model.initial_carry(batch), batch)
        assert outputs["kl"] > 0
        torch.testing.assert_close(outputs["aux_loss"].detach(), weight * outputs["kl"])
    assert "kl_weight" not in model.state_dict()  # set by the training step from the step, not saved


def test_the_training_step_sets_the_kl_schedule_step():
    from tiny import batch as tiny_batch, trainer
    from urm_ray.train.step import train_step

    tiny = trainer("gram", False, ("model.kl_coef=2.0", "model.kl_coef_start=0.0", "model.kl_ramp_steps=4",
                                  "train.steps=3"))
    seen = []
    for i in range(3):
        train_step(tiny, tiny_batch(i))
        seen.append(float(tiny.model.kl_weight))
    assert seen == [0.0, 0.5, 1.0]


def test_kl_of_no_gradient_transitions_trains_only_the_heads(model_batch):
    """Charging every transition adds gradient to the guidance heads and the label embedding,
    and none to the core: the core's gradient is the same as with the last transition's KL only."""
    check_free_kl_trains_only_heads(
        lambda transitions: build_model(GRAMConfig(**{**TINY, "kl_transitions": transitions}), TASK),
        model_batch(TASK), "net.")


def _reference_loss(model: GRAM, batch: dict, probe: torch.Tensor) -> torch.Tensor:
    """The paper's segment by hand: posterior-guided transitions, all states detached but the
    last's, whose KL is the only one charged."""
    x = model.embed_input(batch["inputs"], batch["puzzle_identifiers"])
    rope, target = model.rope(x.shape[1]), model.embed_labels(batch["labels"])
    z_H, z_L = model.init_z_H.expand_as(x), model.init_z_L.expand_as(x)
    for step in range(model.config.h_cycles):
        last = step == model.config.h_cycles - 1
        u, z_L = model.cycle(z_H, z_L, x, rope)
        z_H, kl = model.guide(u, target, charge=last)
        if not last:
            z_H, z_L = z_H.detach(), z_L.detach()
    logits = model.lm_head(z_H[:, model.prefix_len:])
    return (logits * probe).sum() + model.q_head(z_H[:, 0]).sum() + model.config.kl_coef * kl.sum()


def test_gradients_only_through_the_last_transition(model_batch):
    torch.manual_seed(0)
    model = build_model(GRAMConfig(**{**TINY, **PAPER, "kl_coef": 0.1}), TASK).train()
    batch = model_batch(TASK)
    probe = torch.randn(2, TASK.seq_len, TASK.vocab_size)
    torch.manual_seed(1)  # same noise draws in both passes
    _, outputs = model(model.initial_carry(batch), batch)
    loss = (outputs["logits"] * probe).sum() + outputs["q_halt_logits"].sum() + outputs["q_continue_logits"].sum()
    ours = grads(model, loss + outputs["aux_loss"])
    torch.manual_seed(1)
    reference = grads(model, _reference_loss(model, batch, probe))
    assert ours.keys() == reference.keys() and {"prior_head.down_proj.weight", "label_embed.weight"} <= ours.keys()
    for name in ours:
        torch.testing.assert_close(ours[name], reference[name], rtol=1e-4, atol=1e-6, msg=name)


def _ddp_noise_off_rank(rank: int, world_size: int) -> list[str]:
    from torch.nn.parallel import DistributedDataParallel

    torch.manual_seed(0)
    with pytest.warns(UserWarning, match="noise_scale=0"):
        model = build_model(GRAMConfig(**{**TINY, "noise_scale": 0.0}), TASK).train()
    ddp = DistributedDataParallel(model)  # find_unused_parameters off, as Ray Train's default
    gen = torch.Generator().manual_seed(rank)
    inputs = torch.randint(0, TASK.vocab_size, (2, TASK.seq_len), generator=gen)
    batch = {"inputs": inputs, "labels": inputs.clone(), "puzzle_identifiers": torch.zeros(2, dtype=torch.long)}
    carry = model.initial_carry(batch)
    for _ in range(2):  # the second backward fails if the first left a parameter unreduced
        carry, outputs = ddp(carry, batch)
        (outputs["logits"].sum() + outputs["q_halt_logits"].sum()).backward()
    return [name for name, p in model.named_parameters() if p.grad is None]


def test_noise_off_trains_under_ddp_without_unused_parameters(tmp_path):
    from ranks import run_ranks

    assert run_ranks(_ddp_noise_off_rank, world_size=2, folder=tmp_path) == [[], []]


def test_prior_match_adds_a_prior_guided_pass_that_trains_the_core_and_the_prior(model_batch):
    check_prior_match_pass(lambda match: build_model(GRAMConfig(**{**TINY, "prior_match": match}), TASK),
                           model_batch(TASK), transitions=3, core="net.")


def test_prior_match_runs_from_its_start_step(model_batch):
    check_prior_match_start(
        lambda start: build_model(GRAMConfig(**{**TINY, "prior_match": 1.0, "prior_match_start": start}), TASK),
        model_batch(TASK))
