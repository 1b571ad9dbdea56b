"""Every random generator a training step draws from (Python's, NumPy's global, torch's CPU and CUDA), as one
plain-data dict, so a resumed run (pretraining's checkpoints, a fine-tuning's OUT/resume/) draws what an
uninterrupted one would have drawn."""
import random

import numpy as np
import torch


def rng_state() -> dict:
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def set_rng_state(state: dict) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])
