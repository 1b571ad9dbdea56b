"""ModernBERT's schedule and optimizer (issue 37, item 4): warmup-stable-decay with a 1 - sqrt decay, by steps and by
the clock, that a run in its stable phase can extend; StableAdamW, AdamW with update clipping."""
import json
import math

import numpy as np
import pytest
import torch

from bertkit.optim import StableAdamW, lr_factor
from bertkit.pretrain.budget import lr_at


def test_wsd_holds_the_peak_then_decays_as_one_minus_sqrt():
    total, warmup = 110, 10  # 100 steps after warmup; the last 10 % (10 steps) decay
    assert lr_factor(4, total, warmup, "wsd") == pytest.approx(0.5)
    assert all(lr_factor(s, total, warmup, "wsd") == 1.0 for s in range(warmup, 100))
    assert lr_factor(105, total, warmup, "wsd") == pytest.approx(1 - math.sqrt(0.5))
    assert lr_factor(110, total, warmup, "wsd") == pytest.approx(0.0)
    # the clock-driven form has the same shape
    assert lr_at(0.5, 0.1, "wsd") == 1.0 and lr_at(1.0, 0.1, "wsd") == pytest.approx(0.0)
    assert lr_at(0.1 + 0.9 * 0.95, 0.1, "wsd") == pytest.approx(1 - math.sqrt(0.5))
    # extended at step 50 (still stable) from 110 to 210 steps: stays at the peak, decays at the new end
    assert lr_factor(51, 210, warmup, "wsd") == 1.0 and lr_factor(200, 210, warmup, "wsd") == pytest.approx(
        1 - math.sqrt(0.5))


def test_cosine_and_the_other_decay_shapes_of_wsd():
    """cosine against torch's CosineAnnealingLR after warmup; wsd-linear and wsd-cosine hold the peak like wsd and
    decay in a line or half a cosine over the last `decay` (the whole run after warmup: cosine itself)."""
    total, warmup = 110, 10
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    reference = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=total - warmup, eta_min=0.0)
    for step in range(warmup, total + 1):
        assert lr_factor(step, total, warmup, "cosine") == pytest.approx(opt.param_groups[0]["lr"], abs=1e-12), step
        opt.step()
        reference.step()
    assert lr_factor(4, total, warmup, "cosine") == pytest.approx(0.5)   # the warmup is every schedule's
    for shape, at_half, at_quarter in (("wsd-linear", 0.5, 0.75), ("wsd-cosine", 0.5, (1 + math.cos(math.pi / 4)) / 2),
                                       ("wsd", 1 - math.sqrt(0.5), 1 - math.sqrt(0.25))):
        assert all(lr_factor(s, total, warmup, shape, 0.2) == 1.0 for s in range(warmup, 90))
        assert lr_factor(100, total, warmup, shape, 0.2) == pytest.approx(at_half)     # half of the last 20 steps
        assert lr_factor(95, total, warmup, shape, 0.2) == pytest.approx(at_quarter)
        assert lr_factor(110, total, warmup, shape, 0.2) == pytest.approx(0.0, abs=1e-12)
        assert lr_at(0.5, 0.1, shape) == 1.0   # by the clock too
    assert all(lr_factor(s, total, warmup, "wsd-cosine", 1.0) == pytest.approx(lr_factor(s, total, warmup, "cosine"))
               for s in range(total + 1))


def _pair(lr=1e-2, wd=0.1):
    torch.manual_seed(0)
    a = torch.nn.Parameter(torch.randn(8, 4))
    b = torch.nn.Parameter(a.detach().clone())
    ours = StableAdamW([a], lr=lr, betas=(0.9, 0.98), eps=1e-8, weight_decay=wd)
    ref = torch.optim.AdamW([b], lr=lr, betas=(0.9, 0.98), eps=1e-8, weight_decay=wd)
    return a, b, ours, ref


def test_stableadamw_is_adamw_while_gradients_are_steady():
    a, b, ours, ref = _pair()
    g = torch.randn(8, 4)
    for _ in range(5):  # g^2 / v_hat == 1 exactly: no clipping
        a.grad, b.grad = g.clone(), g.clone()
        ours.step()
        ref.step()
    torch.testing.assert_close(a.detach(), b.detach(), rtol=0, atol=1e-6)


def test_stableadamw_clips_the_step_a_spike_would_take():
    a, _, ours, _ = _pair(wd=0.0)
    g = torch.randn(8, 4, dtype=torch.float64)
    m = v = np.zeros((8, 4))
    for t, scale in enumerate([1, 1, 1, 100], 1):  # the fourth gradient is a spike
        grad = (g * scale).numpy()
        before = a.detach().double().numpy().copy()
        a.grad = torch.tensor(grad, dtype=torch.float32)
        ours.step()
        m, v = 0.9 * m + 0.1 * grad, 0.98 * v + 0.02 * grad ** 2
        m_hat, v_hat = m / (1 - 0.9 ** t), v / (1 - 0.98 ** t)
        rms = math.sqrt(np.mean(grad ** 2 / v_hat))
        expected = before - 1e-2 / max(1.0, rms) * m_hat / (np.sqrt(v_hat) + 1e-8)
        np.testing.assert_allclose(a.detach().double().numpy(), expected, rtol=0, atol=1e-6)
    assert rms > 1.5  # the spike was clipped: AdamW would have stepped rms times further


def test_pretrain_with_stableadamw_and_wsd(tmp_path):
    from tests.helpers import tiny_run

    _, run = tiny_run(tmp_path, optimizer="stableadamw", schedule="wsd", decay=0.25, warmup=2, max_steps=12,
                      lr=1e-3)
    lrs = {r["step"]: r["lr"] for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines()) if "lr" in r}
    assert all(lrs[s] == pytest.approx(1e-3) for s in range(3, 9))  # stable
    assert lrs[11] < lrs[10] < 1e-3  # decaying over the last quarter
    assert json.loads((run / "config.json").read_text())["resolved"]["optimizer"] == "stableadamw"


def test_stableadamw_clips_each_tensor_by_its_own_rms():
    """Tensors of one group stepped together: a spike in one clips that tensor's step only; a bf16 tensor gets its
    fp32 update rounded back."""
    torch.manual_seed(1)
    shapes, wd, lr = [(6, 5), (7,), (3, 3)], 0.1, 1e-2
    params = [torch.nn.Parameter(torch.randn(s)) for s in shapes[:2]] + [torch.nn.Parameter(
        torch.randn(shapes[2]).bfloat16())]
    opt = StableAdamW([{"params": params, "weight_decay": wd}], lr=lr, betas=(0.9, 0.98), eps=1e-8)
    w = [p.detach().double().numpy().copy() for p in params]
    m, v = [np.zeros(s) for s in shapes], [np.zeros(s) for s in shapes]
    for t in range(1, 5):
        grads = [torch.randn(s, dtype=torch.float64).numpy() * (100 if (i == 0 and t == 4) else 1)
                 for i, s in enumerate(shapes)]
        for p, g in zip(params, grads):
            p.grad = torch.tensor(g, dtype=p.dtype)
            g[...] = p.grad.double().numpy()  # what the optimizer sees (bf16 rounds it)
        opt.step()
        for i, g in enumerate(grads):
            m[i], v[i] = 0.9 * m[i] + 0.1 * g, 0.98 * v[i] + 0.02 * g ** 2
            m_hat, v_hat = m[i] / (1 - 0.9 ** t), v[i] / (1 - 0.98 ** t)
            step_lr = lr / max(1.0, math.sqrt(np.mean(g ** 2 / v_hat)))
            w[i] = w[i] * (1 - step_lr * wd) - step_lr * m_hat / (np.sqrt(v_hat) + 1e-8)
            if i == 2:
                w[i] = torch.tensor(w[i]).bfloat16().double().numpy()  # the parameter's own precision
            np.testing.assert_allclose(params[i].detach().double().numpy(), w[i], rtol=0,
                                       atol=1e-6 if i < 2 else 2e-2)
