"""The training step: compiled equals eager for every family, and no host sync inside it."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
import torch
import torch._dynamo
import torch._inductor.config
from torch._dynamo.utils import counters
from torch.overrides import TorchFunctionMode

from urm_ray.train.compiled import compile_enabled
from urm_ray.eval.heldout import evaluate_batch
from urm_ray.train.step import TrainState, autocast, bf16_autocast, evaluation_model, train_step

from tiny import FAMILIES, batch, trainer

# Tensor methods that copy a device value to the host (a sync on CUDA)
HOST_READS = {"item", "cpu", "tolist", "numpy", "__bool__", "__float__", "__int__", "__index__"}


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


@pytest.mark.parametrize(("family", "extra"), CASES)
def test_compiled_step_and_evaluation_compile_whole_graphs_once(family: str, extra: tuple[str, ...]):
    """No graph break in the compiled parts of training and evaluation, and once the first steps
    and an evaluation have compiled every graph (grad / no-grad, train / eval), nothing compiles
    again: a recompile raises."""
    torch._dynamo.reset()
    counters.clear()
    tiny = trainer(family, True, extra)

    def steps_and_evaluation(first: int) -> None:
        for step in range(first, first + 3):
            train_step(tiny, batch(step))
        with evaluation_model(tiny) as model:
            evaluate_batch(model, batch(100 + first))

    steps_and_evaluation(0)
    graphs = counters["stats"]["unique_graphs"]
    assert graphs > 0
    with torch._dynamo.config.patch(error_on_recompile=True):
        steps_and_evaluation(3)
    assert counters["stats"]["unique_graphs"] == graphs
    assert dict(counters["graph_break"]) == {}


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


class _HostReads(TorchFunctionMode):
    """Records every Tensor method call that reads a value back to the host."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[str] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", "")
        # .to("cpu") written out is a copy to the host; .to(device) with the compute device
        # (what torch's own helpers do) is not, so only the string form counts
        if name in HOST_READS or (name == "to" and "cpu" in [*args[1:], *(kwargs or {}).values()]):
            self.calls.append(name)
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("family", ["urm", "gram"])
def test_training_step_reads_nothing_back_to_the_host(family: str):
    tiny = trainer(family, False)
    train_step(tiny, batch(0))  # first step: optimizer state is created
    with _HostReads() as reads:
        for step in range(1, 3):
            metrics = train_step(tiny, batch(step))
    assert reads.calls == []
    assert all(value.device == tiny.device and value.dim() == 0 for value in metrics.values())


def test_host_read_counter_sees_reads():
    """The counter itself: a step that logged with .item() would be caught."""
    with _HostReads() as reads:
        value = torch.ones(2).sum()
        value.item(), float(value), bool(value > 0), value.cpu(), value.to("cpu")
    assert reads.calls == ["item", "__float__", "__bool__", "cpu", "to"]


def test_a_diverging_step_is_flagged_on_the_device_and_stops_the_run():
    """lr = 1e6 blows the weights up within a few steps: the step flags it without a host read,
    and the check at the next report raises, naming the first bad step."""
    from urm_ray.errors import TrainingDiverged
    from urm_ray.eval.inrun import InRun
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
                InRun(diverging.cfg, None, 0, None))
    with pytest.raises(TrainingDiverged, match=f"non-finite loss at step {int(first)}:"):
        loop._stop_if_diverged(first)
    loop._stop_if_diverged(torch.full((), -1))  # nothing seen: no error
    wrapped = RuntimeError(f"Worker group failed:\n  File x\n{TrainingDiverged('non-finite loss at step 7: why')}\n")
    assert str(TrainingDiverged.find(wrapped)) == "non-finite loss at step 7: why"
    assert TrainingDiverged.find(RuntimeError("other")) is None
