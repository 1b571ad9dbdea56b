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


def update_moments(p, state: dict, beta1: float, beta2: float):
    """Adam's moments of one tensor updated in place (fp32 state); returns (grad, m, v, bias corrections 1 and 2).
    One tensor at a time, finished while it is in cache, with few temporaries: on the CPU that is 2-3x the speed of
    bias-corrected copies (and faster than torch._foreach_* over the whole model beyond a few million parameters)."""
    grad = p.grad.float()
    if not state:
        state["step"] = 0
        state["exp_avg"] = torch.zeros_like(p, dtype=torch.float32)
        state["exp_avg_sq"] = torch.zeros_like(p, dtype=torch.float32)
    state["step"] += 1
    m, v = state["exp_avg"], state["exp_avg_sq"]
    m.lerp_(grad, 1 - beta1)
    v.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
    return grad, m, v, 1 - beta1 ** state["step"], 1 - beta2 ** state["step"]


class PerTensorAdam(torch.optim.Optimizer):
    """Adam's moments, one tensor at a time (update_moments); a subclass says how each tensor then steps."""

    def __init__(self, params, lr, betas, eps, weight_decay):
        if lr < 0 or eps < 0 or not (0 <= betas[0] < 1 and 0 <= betas[1] < 1):
            raise ValueError(f"invalid {type(self).__name__} settings lr={lr} betas={betas} eps={eps}")
        super().__init__(params, dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay))

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                w = p.float()
                self.step_tensor(w, *update_moments(p, self.state[p], *group["betas"]), group)
                if w is not p:  # p.float() is p itself for fp32
                    p.copy_(w)
        return loss

    def step_tensor(self, w, grad, m, v, bc1: float, bc2: float, group: dict) -> None:
        raise NotImplementedError


class Lamb(PerTensorAdam):
    """LAMB in PyTorch (CPU, or any device without DeepSpeed's fused op).

    update = m_hat / (sqrt(v_hat) + eps) + weight_decay * w;  w -= lr * (||w|| / ||update||) * update,
    the trust ratio taken as 1 when either norm is 0 (fresh zero-initialised biases, zero gradients).
    """

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-6, weight_decay=0.0):
        super().__init__(params, lr, betas, eps, weight_decay)

    def step_tensor(self, w, grad, m, v, bc1, bc2, group):
        update = v.sqrt().div_(bc2 ** 0.5).add_(group["eps"]).mul_(bc1)   # bc1 (sqrt(v_hat) + eps)
        torch.div(m, update, out=update)                                  # m_hat / (sqrt(v_hat) + eps)
        if group["weight_decay"]:
            update.add_(w, alpha=group["weight_decay"])
        w_norm, u_norm = w.norm(), update.norm()
        trust = torch.where((w_norm > 0) & (u_norm > 0), w_norm / u_norm, torch.ones_like(w_norm))
        w.sub_(update.mul_(trust), alpha=group["lr"])


class StableAdamW(PerTensorAdam):
    """AdamW with update clipping (Wortsman et al. 2023, the optimizer ModernBERT trained with): each tensor's step
    size is divided by max(1, RMS(g² / v̂)), so a gradient far above its running second moment (a spike) cannot
    take a step far larger than the rate; otherwise it is AdamW exactly (decoupled weight decay, bias correction)."""

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.98), eps=1e-6, weight_decay=0.0):
        super().__init__(params, lr, betas, eps, weight_decay)

    def step_tensor(self, w, grad, m, v, bc1, bc2, group):
        denom = v.sqrt().div_(bc2 ** 0.5)  # sqrt(v_hat)
        # RMS(g² / max(v_hat, eps²)) = ||g / max(sqrt(v_hat), eps)|| / sqrt(numel)
        rms = float(torch.linalg.vector_norm(grad / denom.clamp_min(group["eps"]))) / w.numel() ** 0.5
        lr = group["lr"] / max(1.0, rms)
        w.mul_(1 - lr * group["weight_decay"]).addcdiv_(m, denom.add_(group["eps"]), value=-lr / bc1)


def adamw(groups: list[dict], lr: float, betas, eps: float) -> torch.optim.AdamW:
    """torch's AdamW with its fused kernel (CPU and CUDA alike): one pass over each tensor, where the CPU's default
    is a loop of small ops per tensor, several times slower (benchmarks/gates/optimizer_step.py)."""
    return torch.optim.AdamW(groups, lr=lr, betas=tuple(betas), eps=eps, fused=True)


def build_optimizer(name: str, groups: list[dict], lr: float, betas, eps: float, on_cuda: bool):
    name = name.lower()
    if name == "lamb":
        if on_cuda:
            from deepspeed.ops.lamb import FusedLamb  # compiles DeepSpeed's fused LAMB op on first use

            return FusedLamb(groups, lr=lr, betas=tuple(betas), eps=eps)
        return Lamb(groups, lr=lr, betas=betas, eps=eps)
    if name == "adamw":
        return adamw(groups, lr, betas, eps)
    if name == "stableadamw":
        return StableAdamW(groups, lr=lr, betas=tuple(betas), eps=eps)
    raise ValueError(f"unknown optimizer {name!r}; choose 'lamb', 'adamw' or 'stableadamw'")


SCHEDULES = ("linear", "poly", "cosine", "wsd", "wsd-linear", "wsd-cosine")


def after_warmup(progress: float, schedule: str, decay: float = 0.1) -> float:
    """The peak rate's multiplier at `progress` (0 to 1) of the steps after warmup.

    linear: linear decay to 0 (the BERT paper); poly: (1 - progress) ** 0.5 (NVIDIA's BERT recipe); cosine: half a
    cosine down to 0;
    wsd:    warmup-stable-decay (ModernBERT's): the peak until the last `decay` of the run, then 1 - sqrt of the
            decay's progress down to 0 (wsd-linear: a straight line; wsd-cosine: half a cosine). A run still in its
            stable phase can be extended (--resume --max-steps) and decays at its new end.
    """
    if schedule not in SCHEDULES:
        raise ValueError(f"unknown schedule {schedule!r}; choose one of {', '.join(SCHEDULES)}")
    remaining = max(0.0, 1.0 - progress)
    if schedule == "linear":
        return remaining
    if schedule == "poly":
        return math.sqrt(remaining)
    if schedule == "cosine":
        return 0.5 * (1.0 + math.cos(math.pi * (1.0 - remaining)))
    if remaining >= decay or decay <= 0:
        return 1.0
    decayed = min(1.0, (decay - remaining) / decay)   # the decay's progress, 0 to 1
    if schedule == "wsd-linear":
        return 1.0 - decayed
    if schedule == "wsd-cosine":
        return 0.5 * (1.0 + math.cos(math.pi * decayed))
    return 1.0 - math.sqrt(decayed)


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
