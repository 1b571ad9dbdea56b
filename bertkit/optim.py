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
                grad = p.grad.float()
                state = self.state[p]
                if not state:
                    state["step"] = 0
                    state["exp_avg"] = torch.zeros_like(p, dtype=torch.float32)
                    state["exp_avg_sq"] = torch.zeros_like(p, dtype=torch.float32)
                state["step"] += 1
                m, v = state["exp_avg"], state["exp_avg_sq"]
                m.mul_(beta1).add_(grad, alpha=1 - beta1)
                v.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
                m_hat = m / (1 - beta1 ** state["step"])
                v_hat = v / (1 - beta2 ** state["step"])
                update = m_hat / (v_hat.sqrt() + group["eps"])
                w = p.float()
                if group["weight_decay"]:
                    update.add_(w, alpha=group["weight_decay"])
                w_norm, u_norm = w.norm(), update.norm()
                trust = torch.where((w_norm > 0) & (u_norm > 0), w_norm / u_norm, torch.ones_like(w_norm))
                p.copy_(w - group["lr"] * trust * update)
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
    raise ValueError(f"unknown optimizer {name!r}; choose 'lamb' or 'adamw'")


def lr_factor(step: int, total_steps: int, warmup_steps: int, schedule: str) -> float:
    """Multiplier of the peak learning rate after `step` optimizer steps.

    linear: linear warmup, then linear decay to 0 at total_steps (the BERT paper).
    poly:   linear warmup, then (1 - progress) ** 0.5 (NVIDIA's BERT recipe).
    """
    if schedule not in ("linear", "poly"):
        raise ValueError(f"unknown schedule {schedule!r}; choose 'linear' or 'poly'")
    if warmup_steps > 0 and step < warmup_steps:
        return (step + 1) / warmup_steps
    progress = (step - warmup_steps) / max(1, total_steps - warmup_steps)
    remaining = max(0.0, 1.0 - progress)
    return remaining if schedule == "linear" else math.sqrt(remaining)


def build_scheduler(optimizer, total_steps: int, warmup_steps: int, schedule: str):
    lr_factor(0, total_steps, warmup_steps, schedule)  # validates the name now, not at the first step
    return torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: lr_factor(step, total_steps, warmup_steps, schedule))
