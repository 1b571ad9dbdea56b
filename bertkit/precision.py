"""bf16 mixed precision as torch.autocast: weights, gradients and optimizer state stay fp32, matrix products run in
bf16. That is how bertkit runs `--precision bf16` on a CPU (pretraining and fine-tuning) and in fine-tuning on a GPU:
on a CPU with bf16 matrix units (Intel AMX, Sapphire Rapids and later) a bf16 product is 5-7x an fp32 one on one core,
while DeepSpeed's bf16 (the weights themselves in bf16) made a CPU step slower
(docs/studies/2026-11-26-cpu-bf16.md). Pretraining on a GPU keeps DeepSpeed's bf16."""
import functools
import os
from pathlib import Path

import torch


def autocast(device, precision: str):
    """The context a forward (and its loss) runs in: bf16 autocast when precision is bf16, else nothing."""
    return torch.autocast(torch.device(device).type, dtype=torch.bfloat16, enabled=precision == "bf16")


def cpu_bf16_units() -> bool:
    """Whether this CPU multiplies bf16 matrices in hardware (AMX tiles or AVX-512 BF16); without them a bf16 CPU
    step is slower than fp32. BERTKIT_CPU_BF16_UNITS=0|1 answers instead (the tests pin it, so what `--precision
    auto` picks, and with it their numbers, does not depend on the machine that runs them)."""
    pinned = os.environ.get("BERTKIT_CPU_BF16_UNITS")
    if pinned in ("0", "1"):
        return pinned == "1"
    return probe_cpu_bf16_units()


@functools.cache  # the CPU does not change under a running process
def probe_cpu_bf16_units() -> bool:
    """Linux says so in /proc/cpuinfo's flags; elsewhere torch's private probes are asked."""
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.is_file():
        flags = next((line.split(":", 1)[1].split() for line in cpuinfo.read_text().splitlines()
                      if line.startswith("flags")), [])
        return bool({"amx_bf16", "avx512_bf16"} & set(flags))
    try:
        return bool(torch.cpu._is_amx_tile_supported() or torch.cpu._is_avx512_bf16_supported())
    except AttributeError:  # an older torch: no way to tell
        return False


def bf16_units(device) -> bool:
    """Whether the device multiplies bf16 in hardware: a GPU that has it, a CPU with AMX or AVX-512 BF16."""
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.is_bf16_supported()
    return device.type == "cpu" and cpu_bf16_units()


def resolve(device, precision: str) -> str:
    """auto -> bf16 where the device has bf16 units, else fp32; fp32 and bf16 stay as they are."""
    if precision != "auto":
        return precision
    return "bf16" if bf16_units(device) else "fp32"


def slow_bf16_note(device, precision: str) -> str | None:
    """A line to print when bf16 was asked for on a CPU that would run it slower than fp32."""
    if precision == "bf16" and torch.device(device).type == "cpu" and not cpu_bf16_units():
        return ("note: this CPU has no bf16 matrix units (Intel AMX or AVX-512 BF16), so --precision bf16 runs "
                "slower than fp32 here; drop it")
    return None
