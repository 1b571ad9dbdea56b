"""Optimizers and learning-rate schedules for pretraining.

LAMB (You et al. 2020, "Large Batch Optimization for Deep Learning"): Adam's moments with bias correction, decoupled
weight decay, and a per-tensor trust ratio ||w|| / ||update||. On CUDA DeepSpeed's FusedLamb is used; elsewhere the
PyTorch `Lamb` below. Weight decay applies to matrices only: biases and LayerNorm parameters (all 1-D) are excluded,
as in the BERT reference.
"""
import math

import torch


def param_groups(model: torch.nn.Module, weight_decay: float) -> list[dict]:
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        (no_decay if p.ndim < 2 or name.endswith(".bias") else decay).append(p)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def adam_moments(p, state: dict, beta1: float, beta2: float):
    """Adam's moment update for one tensor (fp32 state); returns (grad, m_hat, v_hat), bias-corrected."""
    grad = p.grad.float()
    if not state:
        state["step"] = 0
        state["exp_avg"] = torch.zeros_like(p, dtype=torch.float32)
        state["exp_avg_sq"] = torch.zeros_like(p, dtype=torch.float32)
    state["step"] += 1
    m, v = state["exp_avg"], state["exp_avg_sq"]
    m.mul_(beta1).add_(grad, alpha=1 - beta1)
    v.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
    return grad, m / (1 - beta1 ** state["step"]), v / (1 - beta2 ** state["step"])


class Lamb(torch.optim.Optimizer):
    """LAMB in PyTorch (CPU, or any device without DeepSpeed's fused op).

    update = m_hat / (sqrt(v_hat) + eps) + weight_decay * w;  w -= lr * (||w|| / ||update||) * update,
    the trust ratio taken as 1 when either norm is 0 (fresh zero-initialised biases, zero gradients).
    """

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-6, weight_decay=0.0):
        if lr < 0 or eps < 0 or not (0 <= betas[0] < 1 and 0 <= betas[1] < 1):
            raise ValueError(f"invalid LAMB settings lr={lr} betas={betas} eps={eps}")
        super().__init__(params, dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay))

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                grad, m_hat, v_hat = adam_moments(p, self.state[p], beta1, beta2)
                update = m_hat / (v_hat.sqrt() + group["eps"])
                w = p.float()
                if group["weight_decay"]:
                    update.add_(w, alpha=group["weight_decay"])
                w_norm, u_norm = w.norm(), update.norm()
                trust = torch.where((w_norm > 0) & (u_norm > 0), w_norm / u_norm, torch.ones_like(w_norm))
                p.copy_(w - group["lr"] * trust * update)
        return loss


class StableAdamW(torch.optim.Optimizer):
    """AdamW with update clipping (Wortsman et al. 2023, the optimizer ModernBERT trained with): each tensor's step
    size is divided by max(1, RMS(g² / v̂)), so a gradient far above its running second moment (a spike) cannot
    take a step far larger than the rate; otherwise it is AdamW exactly (decoupled weight decay, bias correction)."""

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.98), eps=1e-6, weight_decay=0.0):
        if lr < 0 or eps < 0 or not (0 <= betas[0] < 1 and 0 <= betas[1] < 1):
            raise ValueError(f"invalid StableAdamW settings lr={lr} betas={betas} eps={eps}")
        super().__init__(params, dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay))

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                grad, m_hat, v_hat = adam_moments(p, self.state[p], beta1, beta2)
                rms = (grad.square() / v_hat.clamp_min(group["eps"] ** 2)).mean().sqrt()
                lr = group["lr"] / max(1.0, float(rms))
                w = p.float()
                w.mul_(1 - lr * group["weight_decay"]).addcdiv_(m_hat, v_hat.sqrt().add_(group["eps"]), value=-lr)
                p.copy_(w)
        return loss


def build_optimizer(name: str, groups: list[dict], lr: float, betas, eps: float, on_cuda: bool):
    name = name.lower()
    if name == "lamb":
        if on_cuda:
            from deepspeed.ops.lamb import FusedLamb  # compiles DeepSpeed's fused LAMB op on first use

            return FusedLamb(groups, lr=lr, betas=tuple(betas), eps=eps)
        return Lamb(groups, lr=lr, betas=betas, eps=eps)
    if name == "adamw":
        return torch.optim.AdamW(groups, lr=lr, betas=tuple(betas), eps=eps, fused=on_cuda or None)
    if name == "stableadamw":
        return StableAdamW(groups, lr=lr, betas=tuple(betas), eps=eps)
    raise ValueError(f"unknown optimizer {name!r}; choose 'lamb', 'adamw' or 'stableadamw'")


SCHEDULES = ("linear", "poly", "wsd")


def after_warmup(progress: float, schedule: str, decay: float = 0.1) -> float:
    """The peak rate's multiplier at `progress` (0 to 1) of the steps after warmup.

    linear: linear decay to 0 (the BERT paper); poly: (1 - progress) ** 0.5 (NVIDIA's BERT recipe);
    wsd:    warmup-stable-decay (ModernBERT's): the peak until the last `decay` of the run, then 1 - sqrt of the
            decay's progress down to 0. A run still in its stable phase can be extended (--resume --max-steps) and
            decays at its new end.
    """
    if schedule not in SCHEDULES:
        raise ValueError(f"unknown schedule {schedule!r}; choose one of {', '.join(SCHEDULES)}")
    remaining = max(0.0, 1.0 - progress)
    if schedule == "linear":
        return remaining
    if schedule == "poly":
        return math.sqrt(remaining)
    if remaining >= decay:
        return 1.0
    return 1.0 - math.sqrt(min(1.0, (decay - remaining) / decay)) if decay > 0 else 1.0


def lr_factor(step: int, total_steps: int, warmup_steps: int, schedule: str, decay: float = 0.1) -> float:
    """Multiplier of the peak learning rate after `step` optimizer steps: linear warmup, then after_warmup."""
    if schedule not in SCHEDULES:
        raise ValueError(f"unknown schedule {schedule!r}; choose one of {', '.join(SCHEDULES)}")
    if warmup_steps > 0 and step < warmup_steps:
        return (step + 1) / warmup_steps
    return after_warmup((step - warmup_steps) / max(1, total_steps - warmup_steps), schedule, decay)


def build_scheduler(optimizer, total_steps: int, warmup_steps: int, schedule: str, decay: float = 0.1):
    after_warmup(0.0, schedule, decay)  # validates the name now, not at the first step
    return torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: lr_factor(step, total_steps, warmup_steps, schedule, decay))
