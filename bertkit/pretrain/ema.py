"""`pretrain --ema DECAY`: an exponential moving average of the weights, kept beside training (fp32, on global rank
0: under ZeRO 0-2 every rank holds the whole model), updated after every step that stands (a step rolled back for
divergence never enters it), saved in every checkpoint as ema.pt (listed with its checksum: a resume and a rollback
restore it exactly) and written as a model by `bertkit export RUN --ema`."""
import io
from pathlib import Path

import torch

EMA_FILE = "ema.pt"


class EMA:
    """average <- decay x average + (1 - decay) x weights, per parameter (tied ones once)."""

    def __init__(self, model: torch.nn.Module, decay: float):
        self.decay, self.params = decay, list({id(p): p for p in model.parameters()}.values())
        ids = {id(p): i for i, p in enumerate(self.params)}
        # state_dict keys (a tied weight under two names) -> the parameter's place
        self.keys = {k: ids[id(v)] for k, v in model.state_dict(keep_vars=True).items() if id(v) in ids}
        self.average = [p.detach().float().clone() for p in self.params]

    @torch.no_grad()
    def update(self) -> None:
        torch._foreach_lerp_(self.average, [p.detach().float() for p in self.params], 1.0 - self.decay)

    def state_dict(self) -> dict:
        return {k: self.average[i] for k, i in self.keys.items()}

    def to_bytes(self) -> bytes:
        buffer = io.BytesIO()
        torch.save(self.state_dict(), buffer)
        return buffer.getvalue()

    @torch.no_grad()
    def load(self, checkpoint: Path) -> bool:
        """The average a checkpoint holds; False (the average starts at the weights) where it holds none."""
        if not (Path(checkpoint) / EMA_FILE).is_file():
            return False
        state = read_ema(checkpoint)
        if missing := [k for k, i in self.keys.items() if k not in state or state[k].shape != self.average[i].shape]:
            from bertkit.errors import DamagedFileError

            raise DamagedFileError(Path(checkpoint) / EMA_FILE, f"holds no average for {missing[0]!r} of this model")
        for key, i in self.keys.items():
            self.average[i].copy_(state[key])
        return True


def read_ema(checkpoint: Path) -> dict:
    """A checkpoint's ema.pt: a dictionary of tensors, or DamagedFileError naming it."""
    from bertkit.errors import DamagedFileError
    from bertkit.safe_load import safe_load

    state = safe_load(Path(checkpoint) / EMA_FILE)
    if not isinstance(state, dict) or not all(torch.is_tensor(v) for v in state.values()):
        raise DamagedFileError(Path(checkpoint) / EMA_FILE, "not a dictionary of tensors",
                               "choose another --checkpoint, or export without --ema")
    return state
