"""Learning-rate schedules against their closed forms, and their config validation."""
from __future__ import annotations

import math

import pytest

from dlrun import registry
from dlrun.config import load_config
from dlrun.errors import ConfigError
from conftest import write


def lrs(spec, base=0.1, epochs=10, n=None):
    s = registry.schedules.build(spec)
    s.start(base, epochs)
    return [s.value(e) for e in range(1, (n or epochs) + 1)]


def test_step():
    got = lrs({"type": "step", "step_size": 3, "gamma": 0.5}, n=7)
    assert got == pytest.approx([0.1, 0.1, 0.1, 0.05, 0.05, 0.05, 0.025], rel=1e-15)


def test_exponential():
    got = lrs({"type": "exponential", "gamma": 0.9})
    assert got == pytest.approx([0.1 * 0.9 ** k for k in range(10)], rel=1e-15)


def test_cosine_default_period_is_the_run():
    got = lrs({"type": "cosine"}, base=1.0, epochs=10)
    assert got[0] == 1.0
    assert got[5] == pytest.approx(0.5, abs=1e-15)  # epoch 6: cos(π/2)
    assert got == pytest.approx([0.5 * (1 + math.cos(math.pi * (e - 1) / 10)) for e in range(1, 11)], rel=1e-15)


def test_cosine_min_lr_and_period_then_flat():
    got = lrs({"type": "cosine", "min_lr": 0.01, "period": 4}, base=0.1, epochs=10, n=7)
    want = [0.01 + 0.09 * 0.5 * (1 + math.cos(math.pi * min(e - 1, 4) / 4)) for e in range(1, 8)]
    assert got == pytest.approx(want, rel=1e-14)
    assert got[4:] == pytest.approx([0.01] * 3, rel=1e-14)


def test_warmup_alone_then_constant():
    assert lrs({"type": "warmup", "epochs": 4}, base=1.0, n=6) == pytest.approx([0.25, 0.5, 0.75, 1.0, 1.0, 1.0])
    got = lrs({"type": "warmup", "epochs": 4, "start_factor": 0.2}, base=1.0, n=4)
    assert got == pytest.approx([0.2 + 0.8 * e / 4 for e in range(1, 5)])


def test_warmup_then_cosine_spans_the_remaining_epochs():
    got = lrs({"type": "warmup", "epochs": 4, "then": {"type": "cosine"}}, base=1.0, epochs=10)
    # cosine runs over the 6 epochs after warm-up: its epoch k is run epoch 4 + k
    want = [0.25, 0.5, 0.75, 1.0] + [0.5 * (1 + math.cos(math.pi * (k - 1) / 6)) for k in range(1, 7)]
    assert got == pytest.approx(want, rel=1e-14)
    assert got[7] == pytest.approx(0.5)  # epoch 8 is cosine's epoch 4 of 6: cos(π/2)


def test_warmup_then_step():
    got = lrs({"type": "warmup", "epochs": 2, "then": {"type": "step", "step_size": 2, "gamma": 0.1}}, base=1.0, n=7)
    assert got == pytest.approx([0.5, 1.0, 1.0, 1.0, 0.1, 0.1, 0.01])


def plateau_run(spec, values, base=1.0):
    s = registry.schedules.build(spec)
    s.start(base, len(values))
    used = []
    for e, v in enumerate(values, start=1):
        used.append(s.value(e))
        s.observe(e, {"val_loss": v, "val_accuracy": v, "train_loss": v})
    return used, s.value(len(values) + 1)


def test_reduce_on_plateau_scripted():
    values = [1.0, 0.9, 0.95, 0.92, 0.8, 0.85, 0.86, 0.87, 0.88]
    used, after = plateau_run({"type": "reduce_on_plateau", "factor": 0.5, "patience": 2, "min_delta": 0}, values)
    # epochs 3,4 do not improve on 0.9 -> halve after epoch 4; 6,7 not on 0.8 -> after 7; 8,9 -> after 9
    assert used == [1.0] * 4 + [0.5] * 3 + [0.25] * 2
    assert after == 0.125


def test_reduce_on_plateau_min_delta_cooldown_min_lr_and_max_mode():
    # improvements smaller than min_delta do not count
    used, after = plateau_run({"type": "reduce_on_plateau", "factor": 0.1, "patience": 1, "min_delta": 0.05,
                               "min_lr": 0.05}, [1.0, 0.99, 0.98, 0.5, 0.49])
    # 0.99 and 0.98 do not beat 1.0 by 0.05: two reductions, the second clamped at min_lr; 0.49 does
    # not beat 0.5, but the rate is at min_lr already
    assert used == [1.0, 1.0, 0.1, 0.05, 0.05] and after == 0.05
    # cooldown 2 (Keras' counting): the reduction after epoch 2 sets the counter to 2; epoch 3
    # counts it down to 1 and is ignored, epoch 4 counts it to 0 and waits again -> reduce
    used, _ = plateau_run({"type": "reduce_on_plateau", "factor": 0.5, "patience": 1, "cooldown": 2,
                           "min_delta": 0}, [1.0, 1.0, 1.0, 1.0, 1.0, 1.0])
    assert used == [1.0, 1.0, 0.5, 0.5, 0.25, 0.25]
    used, _ = plateau_run({"type": "reduce_on_plateau", "factor": 0.5, "patience": 1, "cooldown": 0,
                           "min_delta": 0}, [1.0, 1.0, 1.0, 1.0])
    assert used == [1.0, 1.0, 0.5, 0.25]
    # val_accuracy: auto mode maximises
    used, after = plateau_run({"type": "reduce_on_plateau", "monitor": "val_accuracy", "factor": 0.5,
                               "patience": 1, "min_delta": 0}, [0.5, 0.6, 0.7, 0.65])
    assert used == [1.0] * 4 and after == 0.5


CONFIG = """\
data: {type: blobs, samples: 60, classes: 3}
model:
  - {type: Linear, units: 3}
loss: SoftmaxCrossEntropy
optimizer: {type: SGD, learning_rate: 0.1}
train:
  epochs: 3
  schedule: %s
"""


def test_unknown_schedule_is_reported_with_line_and_suggestion(tmp_path):
    p = write(tmp_path / "c.yaml", CONFIG % "{type: cosin, min_lr: 0.0}")
    with pytest.raises(ConfigError) as e:
        load_config(p)
    text = str(e.value)
    assert "c.yaml:8" in text and "unknown schedule 'cosin'" in text and "did you mean cosine" in text


def test_schedule_options_are_checked_including_nested(tmp_path):
    p = write(tmp_path / "c.yaml", CONFIG % "{type: warmup, epochs: 0, then: {type: step, gama: 0.5}}")
    with pytest.raises(ConfigError) as e:
        load_config(p)
    text = str(e.value)
    assert "train.schedule.epochs: expected a positive integer, got 0" in text
    assert "train.schedule.then.gama" in text and "did you mean gamma" in text


def test_schedule_shorthand_and_set_override(tmp_path):
    p = write(tmp_path / "c.yaml", CONFIG % "exponential")
    cfg = load_config(p, ["train.schedule.gamma=0.5"])
    assert cfg.train.schedule == {"type": "exponential", "gamma": 0.5}


def per_step_rates(spec, base=0.1, epochs=3, batches=4):
    """The rates LearningRateScheduler sets in step mode, driven as Trainer.fit drives callbacks."""
    from dlrun.training.controls import LearningRateScheduler

    opt = type("Opt", (), {"learning_rate": base})()
    cb = LearningRateScheduler(registry.schedules.build(spec), epochs, "step")
    cb.on_train_begin(type("T", (), {"optimizer": opt})())
    rates = []
    for e in range(1, epochs + 1):
        cb.on_epoch_begin(e, batches)
        for b in range(1, batches + 1):
            rates.append(opt.learning_rate)  # the rate this step uses
            cb.on_batch_end(e, b)
    return rates


def test_per_step_cosine_is_the_closed_form_in_steps():
    # k = steps done before this one, K = all steps: lr = ½·lr₀·(1 + cos(πk/K)), as torch's CosineAnnealingLR per step
    got = per_step_rates({"type": "cosine"}, epochs=3, batches=4)
    assert got == pytest.approx([0.05 * (1 + math.cos(math.pi * k / 12)) for k in range(12)], rel=1e-12)


def test_per_step_warmup_reaches_lr0_at_the_last_warmup_step_then_anneals():
    got = per_step_rates({"type": "warmup", "epochs": 1, "then": {"type": "cosine"}}, epochs=3, batches=4)
    assert got[:4] == pytest.approx([0.025, 0.05, 0.075, 0.1], rel=1e-12)  # k/(W·B), k from 1
    # then cosine over the remaining 2 epochs = 8 steps, starting at lr₀
    assert got[4:] == pytest.approx([0.05 * (1 + math.cos(math.pi * k / 8)) for k in range(8)], rel=1e-12)


def test_warmup_begin_at_start_factor_starts_there_and_reaches_lr0_when_then_starts():
    # start_factor s = 0.25, W = 4: lr₀·(s + (1 − s)·(e − 1)/W) in epochs 1–4, lr₀ from epoch 5
    spec = {"type": "warmup", "epochs": 4, "start_factor": 0.25, "begin_at_start_factor": True}
    assert lrs(spec, base=0.1, n=6) == pytest.approx([0.025, 0.04375, 0.0625, 0.08125, 0.1, 0.1], rel=1e-14)
    default = {k: v for k, v in spec.items() if k != "begin_at_start_factor"}
    assert lrs(default, base=0.1, n=6) == pytest.approx([0.04375, 0.0625, 0.08125, 0.1, 0.1, 0.1], rel=1e-14)
    # wrapping cosine: its epoch 1 (lr₀) is epoch W + 1, and it anneals over the 6 epochs left
    got = lrs({**spec, "then": {"type": "cosine"}}, base=1.0, epochs=10)
    want = [0.25, 0.4375, 0.625, 0.8125] + [0.5 * (1 + math.cos(math.pi * (k - 1) / 6)) for k in range(1, 7)]
    assert got == pytest.approx(want, rel=1e-14)
    # per step: the line at each step's start, k/(W·B) for step k from 0; then cosine over its steps
    got = per_step_rates({**spec, "epochs": 1, "then": {"type": "cosine"}}, epochs=3, batches=4)
    assert got[:4] == pytest.approx([0.1 * (0.25 + 0.75 * k / 4) for k in range(4)], rel=1e-12)
    assert got[4:] == pytest.approx([0.05 * (1 + math.cos(math.pi * k / 8)) for k in range(8)], rel=1e-12)


def torch_rates(make, steps, base=0.1):
    """The rate of each of ``steps`` optimizer steps under a torch scheduler stepped after each."""
    import warnings

    torch = pytest.importorskip("torch")
    p = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([p], lr=base)
    sched = make(torch.optim.lr_scheduler, opt)
    out = []
    for _ in range(steps):
        out.append(opt.param_groups[0]["lr"])
        opt.step()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # SequentialLR's deprecation notes, if any
            sched.step()
    return out


# the schedule warm-up wraps, and torch's counterpart given (lr_scheduler, optimizer, the steps
# it spans, steps per epoch B)
THEN = {
    "alone": (None, None),
    "cosine": ({"type": "cosine"}, lambda L, o, n, b: L.CosineAnnealingLR(o, T_max=n)),
    "cosine-min-lr": ({"type": "cosine", "min_lr": 0.01}, lambda L, o, n, b: L.CosineAnnealingLR(o, T_max=n, eta_min=0.01)),
    "step": ({"type": "step", "step_size": 2, "gamma": 0.5}, lambda L, o, n, b: L.StepLR(o, step_size=2, gamma=0.5)),
    "exponential": ({"type": "exponential", "gamma": 0.8}, lambda L, o, n, b: L.ExponentialLR(o, gamma=0.8 ** (1 / b))),
}


@pytest.mark.parametrize("batches", [1, 3], ids=["per-epoch", "per-step"])
@pytest.mark.parametrize("case", sorted(THEN))
def test_warmup_matches_torch_linear_lr_and_sequential_lr(case, batches):
    """begin_at_start_factor gives PyTorch's LinearLR, then SequentialLR into the wrapped schedule;
    the default runs the same warm-up one epoch (or step) ahead, and the same schedule after it."""
    if case == "step" and batches > 1:
        pytest.skip("dlrun's step decay changes between epochs only; torch's StepLR stepped per batch counts batches")
    then, torch_then = THEN[case]
    epochs, warm, s = 10, 4, 0.25
    n, w = epochs * batches, warm * batches  # torch counts the scheduler's steps

    def make(L, o):
        linear = L.LinearLR(o, start_factor=s, total_iters=w)
        if then is None:
            return linear
        return L.SequentialLR(o, [linear, torch_then(L, o, n - w, batches)], milestones=[w])

    want = torch_rates(make, n)
    spec = {"type": "warmup", "epochs": warm, "start_factor": s, "then": then}

    def ours(**extra):
        if batches == 1:
            return lrs({**spec, **extra}, base=0.1, epochs=epochs)
        return per_step_rates({**spec, **extra}, base=0.1, epochs=epochs, batches=batches)

    assert ours(begin_at_start_factor=True) == pytest.approx(want, rel=1e-12)
    default = ours()
    assert default[:w] == pytest.approx(want[1:w + 1], rel=1e-12)  # the warm-up, one step ahead
    assert default[w:] == pytest.approx(want[w:], rel=1e-12)  # the wrapped schedule, unchanged


@pytest.mark.parametrize("spec", [{"type": "step", "step_size": 1, "gamma": 0.5}, {"type": "exponential", "gamma": 0.5},
                                  "reduce_on_plateau"])
def test_per_step_rates_agree_with_per_epoch_ones_at_each_epoch_start(spec):
    got = per_step_rates(spec, epochs=3, batches=4)
    assert got[::4] == pytest.approx(lrs(spec, epochs=3), rel=1e-12)
    if spec != {"type": "exponential", "gamma": 0.5}:  # step decay and plateau change only between epochs
        assert got == pytest.approx([r for r in lrs(spec, epochs=3) for _ in range(4)], rel=1e-12)
    else:  # exponential decays within the epoch too: 0.5^(1/4) per step
        assert got[1] / got[0] == pytest.approx(0.5 ** 0.25, rel=1e-12)


def test_schedule_interval_is_checked(tmp_path):
    from dlrun.training.controls import from_config
    from dlrun.schedules import Schedule

    base = "data: spiral\nmodel: [{type: Linear, units: 3}]\nloss: SoftmaxCrossEntropy\noptimizer: SGD\n"
    with pytest.raises(ConfigError, match="schedule_interval: expected one of 'epoch', 'step', got 'batch'"):
        load_config(write(tmp_path / "a.yaml", base + "train: {schedule: cosine, schedule_interval: batch}\n"))

    @registry.schedules.register("halving_test")
    class Halving(Schedule):
        """lr = lr₀ / 2^(epoch − 1), per epoch only."""

        def value(self, epoch):
            return self.base_lr / 2 ** (epoch - 1)

    try:
        cfg = load_config(write(tmp_path / "b.yaml", base + "train: {schedule: halving_test, schedule_interval: step}\n"))
        with pytest.raises(ConfigError, match="defines a rate per epoch only"):
            from_config(cfg, has_validation=False, classification=True)
        assert lrs("halving_test", n=3) == [0.1, 0.05, 0.025]  # per epoch it works
    finally:
        registry.schedules.unregister("halving_test")


def test_multistep_drops_after_each_milestone_epoch():
    got = lrs({"type": "multistep", "milestones": [2, 5], "gamma": 0.5}, base=1.0, epochs=7)
    assert got == [1.0, 1.0, 0.5, 0.5, 0.5, 0.25, 0.25]  # epochs 1-2, 3-5, 6-7
    assert per_step_rates({"type": "multistep", "milestones": [1]}, epochs=2, batches=3) == pytest.approx(
        [0.1] * 3 + [0.01] * 3, rel=1e-12)  # within an epoch the rate holds, as step decay


def onecycle_reference(T, pct=0.3, div=25.0, final=1e4, cos=True, three=False):
    init, peak = 1.0 / div, 1.0
    end_rate = init / final
    ends = [pct * T - 1] + ([2 * pct * T - 2, T - 1] if three else [T - 1])
    rates = [(init, peak)] + ([(peak, init), (init, end_rate)] if three else [(peak, end_rate)])
    out = []
    for s in range(T):
        start = 0.0
        for k, (end, (a, b)) in enumerate(zip(ends, rates)):
            if s <= end or k == len(ends) - 1:
                f = (s - start) / (end - start)
                out.append(b + (a - b) / 2 * (math.cos(math.pi * f) + 1) if cos else a + (b - a) * f)
                break
            start = end
    return out


@pytest.mark.parametrize("options,ref", [
    ({}, {}),
    ({"anneal": "linear", "pct_start": 0.25}, {"cos": False, "pct": 0.25}),
    ({"three_phase": True, "div_factor": 10, "final_div_factor": 100}, {"three": True, "div": 10.0, "final": 100.0})])
def test_onecycle_per_step_is_pytorch_onecycle(options, ref):
    """Over T = 3 epochs x 7 batches: the start at lr₀/div, the rise until step pct·T − 1, the last
    step at lr₀/(div·final_div); checked against PyTorch's formula written out step by step."""
    got = per_step_rates({"type": "onecycle", **options}, base=1.0, epochs=3, batches=7)
    want = onecycle_reference(21, **ref)
    assert got == pytest.approx(want, rel=1e-12)
    div = ref.get("div", 25.0)
    assert got[0] == pytest.approx(1 / div) and got[-1] == pytest.approx(1 / div / ref.get("final", 1e4))


def test_onecycle_and_multistep_match_torch_schedulers():
    torch = pytest.importorskip("torch")

    def torch_rates(make, steps):
        p = torch.nn.Parameter(torch.zeros(1))
        opt = torch.optim.SGD([p], lr=0.1)
        sched = make(opt)
        out = []
        for _ in range(steps):
            out.append(opt.param_groups[0]["lr"])
            opt.step()
            sched.step()
        return out

    for kw, opts in [({}, {}), ({"anneal_strategy": "linear", "pct_start": 0.4}, {"anneal": "linear", "pct_start": 0.4}),
                     ({"three_phase": True, "div_factor": 5.0}, {"three_phase": True, "div_factor": 5})]:
        want = torch_rates(lambda o: torch.optim.lr_scheduler.OneCycleLR(
            o, max_lr=0.1, total_steps=4 * 9, cycle_momentum=False, **kw), 36)
        assert per_step_rates({"type": "onecycle", **opts}, epochs=4, batches=9) == pytest.approx(want, rel=1e-12)
    want = torch_rates(lambda o: torch.optim.lr_scheduler.MultiStepLR(o, milestones=[3, 7], gamma=0.3), 10)
    assert lrs({"type": "multistep", "milestones": [3, 7], "gamma": 0.3}, epochs=10) == pytest.approx(want, rel=1e-12)


@pytest.mark.parametrize("schedule,message", [
    ("{type: multistep, milestones: [5, 5]}",
     "train.schedule.milestones: multistep: milestones must be a non-empty, strictly increasing list of epochs, got [5, 5]"),
    ("{type: multistep, milestones: []}", "train.schedule.milestones: multistep: milestones must be a non-empty"),
    ("{type: multistep}", "milestones"),
    ("{type: multistep, milestones: [0, 3]}", "train.schedule.milestones: item [0]: expected a positive integer, got 0"),
    ("{type: onecycle, three_phase: true, pct_start: 0.6}", "train.schedule.pct_start: onecycle: three_phase needs pct_start < 0.5"),
    ("{type: onecycle, pct_start: 1}", "train.schedule.pct_start"),
    ("{type: onecycle, anneal: cosine}", "train.schedule.anneal"),
])
def test_multistep_and_onecycle_options_are_checked(tmp_path, schedule, message):
    p = write(tmp_path / "c.yaml", CONFIG % schedule)
    with pytest.raises(ConfigError) as e:
        load_config(p)
    assert message in str(e.value) and "c.yaml:8" in str(e.value), str(e.value)


def test_onecycle_per_step_trains_and_records_the_last_steps_rate(tmp_path, cli):
    import csv

    p = write(tmp_path / "c.yaml", CONFIG % "onecycle" + "  schedule_interval: step\n  batch_size: 20\n")
    r = cli("train", p, "--runs-dir", tmp_path / "runs")
    assert r.code == 0, r.err
    rows = list(csv.DictReader(open(next((tmp_path / "runs").iterdir()) / "metrics.csv")))
    want = onecycle_reference(9)  # 3 epochs x 3 batches of 20; each row has its epoch's last step
    assert [float(row["learning_rate"]) for row in rows] == pytest.approx([0.1 * want[k] for k in (2, 5, 8)], rel=1e-6)
