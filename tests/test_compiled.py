"""The training step: compiled equals eager for every family, one graph per shape (evaluation's
batch sizes share one), no graph break, no host sync inside it, and no silent fallback to eager."""

from __future__ import annotations

import warnings
from contextlib import nullcontext
from pathlib import Path

import pytest
import torch
import torch._dynamo
import torch._inductor.config
from torch._dynamo.utils import counters

from urm_ray.eval import testtime
from urm_ray.eval.config import EvalConfig
from urm_ray.eval.heldout import evaluate_batch, evaluate_sampled
from urm_ray.train.compiled import compile_enabled, compile_model
from urm_ray.train.step import TrainState, autocast, bf16_autocast, evaluation_model, train_step

from syncs import HostSyncs
from tiny import FAMILIES, batch, config, trainer


def _assert_rel_close(actual: torch.Tensor, expected: torch.Tensor, name: str, tol: float = 1e-5) -> None:
    """|actual - expected| / |expected| <= tol in the 2-norm: fused kernels reorder float32 sums,
    so single elements near zero differ by more than tol of themselves."""
    error = (actual.double() - expected.double()).norm() / expected.double().norm().clamp_min(1e-12)
    assert error <= tol, f"{name}: relative error {error:.2e} > {tol:.0e}"


def _loss_and_grads(trainer: TrainState, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict]:
    """The first step's forward and backward, as ``train_step`` runs them, without the update."""
    torch.manual_seed(1)
    model = trainer.model.train()
    with autocast(trainer):
        carry, outputs = model(model.initial_carry(batch), batch)
        loss, _ = trainer.objective(outputs, carry)
    loss.backward()
    grads = {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    return loss.detach(), grads


def _three_steps(tiny: TrainState) -> list[dict[str, torch.Tensor]]:
    torch.manual_seed(2)  # ACT exploration and GRAM's noise draw the same numbers on both sides
    return [train_step(tiny, batch(step)) for step in range(3)]


# every family, and GRAM with its prior match (a second, prior-guided pass and its matched loss)
CASES = [pytest.param(family, (), id=family) for family in sorted(FAMILIES)] + [
    pytest.param("gram_urm", ("model.prior_match=1.0",), id="gram_urm-prior_match")]


@pytest.mark.parametrize(("family", "extra"), CASES)
def test_compiled_step_equals_eager(family: str, extra: tuple[str, ...]):
    eager, compiled = trainer(family, False, extra), trainer(family, True, extra)
    assert "core" in vars(compiled.model) and "core" not in vars(eager.model)  # compiled in place only
    with torch._inductor.config.patch(fallback_random=True):  # compiled randn = eager's stream
        loss_e, grads_e = _loss_and_grads(eager, batch(0))
        loss_c, grads_c = _loss_and_grads(compiled, batch(0))
        _assert_rel_close(loss_c, loss_e, "loss")
        assert grads_e and grads_c.keys() == grads_e.keys()
        for name, grad in grads_e.items():
            _assert_rel_close(grads_c[name], grad, name)
        steps_e, steps_c = _three_steps(eager), _three_steps(compiled)
    for metrics_e, metrics_c in zip(steps_e, steps_c):
        assert metrics_c["count"] == metrics_e["count"]  # the same rows halted
        for key in ("lm_loss", "q_halt_loss", *(("prior_match_loss",) if extra else ())):
            _assert_rel_close(metrics_c[key], metrics_e[key], key)
    for (name, p_e), (_, p_c) in zip(eager.model.named_parameters(), compiled.model.named_parameters()):
        _assert_rel_close(p_c, p_e, name)
    if eager.model.puzzle_emb is not None:  # the sign-SGD table moved identically
        torch.testing.assert_close(compiled.model.puzzle_emb.weights, eager.model.puzzle_emb.weights)
        assert eager.model.puzzle_emb.weights.abs().sum() > 0


def _rows(data: dict[str, torch.Tensor], rows: int) -> dict[str, torch.Tensor]:
    """The first ``rows`` rows of a batch: the last, partial batch of an evaluation."""
    return {k: v[:rows] for k, v in data.items()}


def _evaluations(model: torch.nn.Module, guided: bool, last_rows: int) -> None:
    """Every evaluation a run does, at the eval batch size (8) and at a last, partial batch."""
    for data in (batch(100), _rows(batch(101), last_rows)):
        evaluate_batch(model, data)
        if guided:  # GRAM's sampling: K x B rows
            evaluate_sampled(model, data, 3)
        settings = EvalConfig(width=2)  # test-time width: N x B rows
        with testtime.applied(model, settings):
            testtime.evaluate_testtime(model, _rows(data, last_rows // 2 + 1), settings)


@pytest.mark.parametrize(("family", "extra"), CASES)
def test_compiled_step_and_evaluation_compile_whole_graphs_once(family: str, extra: tuple[str, ...]):
    """No graph break in the compiled parts of training and evaluation, and once the first steps
    and an evaluation have compiled every graph (grad / no-grad, train / eval), nothing compiles
    again: not the next steps, and not evaluation at batch sizes it has not seen (the last batch,
    K x B samples, N x B trajectories), which share one graph. A recompile raises. The steps
    after the first read nothing back to the host (tests/syncs.py), except the one documented
    copy of GRAM's prior match."""
    torch._dynamo.reset()
    counters.clear()
    tiny = trainer(family, True, extra)
    guided = family.startswith("gram")

    def steps_and_evaluation(first: int, last_rows: int, syncs: HostSyncs | nullcontext) -> None:
        with syncs:
            for step in range(first, first + 3):
                train_step(tiny, batch(step))
        with evaluation_model(tiny) as model:
            _evaluations(model, guided, last_rows)

    # fallback_random as in test_compiled_step_equals_eager: the same inductor settings find the
    # kernels that test compiled in inductor's cache. The first pass compiles every graph outside
    # the recorder, whose Python profile hook would see every call of the compiler.
    with torch._inductor.config.patch(fallback_random=True):
        steps_and_evaluation(0, 5, nullcontext())
        graphs = counters["stats"]["unique_graphs"]
        assert graphs > 0
        syncs = HostSyncs(compiled=True)
        with torch._dynamo.config.patch(error_on_recompile=True):
            steps_and_evaluation(3, 3, syncs)
    assert counters["stats"]["unique_graphs"] == graphs
    assert dict(counters["graph_break"]) == {}
    assert all("matched_answers" in seen for seen in syncs.seen) and bool(syncs.seen) == bool(extra), syncs.report()
    assert torch._dynamo.config.fail_on_recompile_limit_hit  # past the limit: an error, never eager


def test_hitting_the_recompile_limit_raises_rather_than_running_eagerly():
    """What ``compile_model`` turns on: a function compiled past Dynamo's recompile limit raises."""
    torch._dynamo.reset()

    class Model(torch.nn.Module):
        def core(self, state: dict, x: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
            return x

    compile_model(Model())  # sets fail_on_recompile_limit_hit

    @torch.compile(backend="eager", dynamic=False)
    def double(x: torch.Tensor) -> torch.Tensor:
        return x * 2

    with torch._dynamo.config.patch(recompile_limit=2), pytest.raises(Exception, match="recompile_limit"):
        for size in range(1, 5):
            double(torch.ones(size))


def test_a_trial_forgets_the_graphs_its_actor_compiled_before():
    """A reused Tune trial actor starts a trial with train.compile on from no graphs; off, it
    leaves them."""
    from urm_ray.tune.trial import forget_compiled_graphs

    torch._dynamo.reset()
    counters.clear()

    @torch.compile(backend="eager", dynamic=False)
    def double(x: torch.Tensor) -> torch.Tensor:
        return x * 2

    def compiles() -> int:
        before = counters["stats"]["unique_graphs"]
        double(torch.ones(2))
        return counters["stats"]["unique_graphs"] - before

    assert compiles() == 1 and compiles() == 0
    forget_compiled_graphs(config("urm", compiled=False))
    assert compiles() == 0
    forget_compiled_graphs(config("urm", compiled=True))
    assert compiles() == 1


def test_graph_break_and_recompile_checks_see_them():
    """The checks themselves: a break in a compiled function is counted, a recompile raises."""
    torch._dynamo.reset()
    counters.clear()

    @torch.compile(backend="eager", dynamic=False)
    def broken(x: torch.Tensor) -> torch.Tensor:
        torch._dynamo.graph_break()
        return x * 2

    broken(torch.ones(2))
    assert dict(counters["graph_break"])
    with torch._dynamo.config.patch(error_on_recompile=True), pytest.raises(Exception, match="ecompil"):
        broken(torch.ones(3))  # a new shape


def test_compile_setting_auto_means_cuda_only():
    assert not compile_enabled("auto", torch.device("cpu"))
    assert compile_enabled("auto", torch.device("cuda"))
    assert compile_enabled(True, torch.device("cpu")) and not compile_enabled(False, torch.device("cuda"))


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_cpu_bf16_step_is_close_to_fp32(family: str):
    """train.bf16=true on CPU: the same loss and gradients as fp32 to bf16's precision, and the
    weights after 3 optimizer steps move as fp32's do."""
    fp32, bf16 = trainer(family, False), trainer(family, False, ("train.bf16=true",))
    before = [p.detach().clone() for p in fp32.model.parameters()]
    loss_32, grads_32 = _loss_and_grads(fp32, batch(0))
    loss_16, grads_16 = _loss_and_grads(bf16, batch(0))
    assert loss_16 != loss_32  # bf16 ran
    _assert_rel_close(loss_16, loss_32, "loss", tol=1e-2)
    flat_32, flat_16 = (torch.cat([g[n].flatten() for n in sorted(grads_32)]) for g in (grads_32, grads_16))
    assert torch.cosine_similarity(flat_16, flat_32, dim=0) > 0.99
    _three_steps(fp32), _three_steps(bf16)
    moved_32 = torch.cat([(p - b).flatten() for p, b in zip(fp32.model.parameters(), before)])
    moved_16 = torch.cat([(p - b).flatten() for p, b in zip(bf16.model.parameters(), before)])
    assert moved_32.norm() > 0 and torch.cosine_similarity(moved_16, moved_32, dim=0) > 0.9


def test_bf16_setting_auto_means_cuda_only():
    def on(device: str, setting: bool | str) -> bool:  # not entered: CUDA is not here
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "CUDA is not available ... Disabling autocast"
            ctx = bf16_autocast(torch.device(device), setting)
        return isinstance(ctx, torch.autocast) and (ctx.device, ctx.fast_dtype) == (device, torch.bfloat16)
    assert on("cuda", "auto") and on("cuda", True) and not on("cuda", False)
    assert not on("cpu", "auto") and on("cpu", True) and not on("cpu", False)


def test_a_diverging_step_is_flagged_on_the_device_and_stops_the_run():
    """lr = 1e6 blows the weights up within a few steps: the step flags it without a host read,
    and the check at the next report raises, naming the first bad step."""
    from urm_ray.errors import TrainingDiverged
    from urm_ray.train.evaluation import InRun
    from urm_ray.train.hosts import ProcessHost
    from urm_ray.train.live import Sender
    from urm_ray.tracking import NullTracker
    from urm_ray.train.loop import Loop, _first_nonfinite

    healthy = trainer("urm", False)
    metrics = train_step(healthy, batch(0))
    assert float(metrics["nonfinite"]) == 0.0
    diverging = trainer("urm", False)
    for optimizer in diverging.optimizers:
        for group in optimizer.param_groups:
            group["base_lr"] = 1e6  # the schedule sets each step's lr from it
    first = torch.full((), -1)
    for step in range(1, 9):
        metrics = train_step(diverging, batch(step))
        first = _first_nonfinite(first, metrics["nonfinite"], step)
    assert 1 < int(first) <= 8
    loop = Loop(diverging, ProcessHost({}, Path("unused"), 1), NullTracker(), Sender(),
                InRun(diverging.cfg, None, None, None, 0, None))
    with pytest.raises(TrainingDiverged, match=f"non-finite loss at step {int(first)}:"):
        loop._stop_if_diverged(first)
    loop._stop_if_diverged(torch.full((), -1))  # nothing seen: no error
    wrapped = RuntimeError(f"Worker group failed:\n  File x\n{TrainingDiverged('non-finite loss at step 7: why')}\n")
    assert str(TrainingDiverged.find(wrapped)) == "non-finite loss at step 7: why"
    assert TrainingDiverged.find(RuntimeError("other")) is None
