"""--time-budget and --schedule-from: a run limited by wall-clock time rather than by steps.

With a time budget the learning-rate schedule runs on the fraction of the budget used, not of --max-steps
(cramming's budget-aware schedule, Geiping & Goldstein 2023): warmup over the first --warmup of the budget, then
decay to 0 when it is spent, whatever the machine's speed. The loop measures the time (every rank agrees on one
value per step), the schedule records the fraction each step's rate was computed from, and RUN/schedule.json keeps
that record: `--schedule-from RUN` replays it step for step on any machine, so a budgeted run is reproducible.
"""
import json
import re
from pathlib import Path

from bertkit.fileio import atomic_write_json
from bertkit.optim import SCHEDULES, after_warmup

SCHEDULE_FILE = "schedule.json"
DEFAULT_MAX_STEPS = 10000
_DURATION = re.compile(r"^\s*(?:(\d+(?:\.\d+)?)h)?\s*(?:(\d+(?:\.\d+)?)m)?\s*(?:(\d+(?:\.\d+)?)s)?\s*$")


def parse_duration(text: str) -> float:
    """Seconds in "2h", "30m", "1h30m", "90s" or "1.5h"; ValueError saying what is accepted otherwise."""
    m = _DURATION.match(str(text).lower())
    if not m or not any(m.groups()):
        raise ValueError(f"{text!r} is not a duration; write it as 2h, 30m, 1h30m or 90s")
    h, mins, s = (float(g) if g else 0.0 for g in m.groups())
    seconds = 3600 * h + 60 * mins + s
    if not seconds > 0:
        raise ValueError(f"{text!r}: a time budget must be longer than 0")
    return seconds


def lr_at(fraction: float, warmup: float, schedule: str, decay: float = 0.1) -> float:
    """The peak rate's multiplier at `fraction` (0 to 1) of a run: linear warmup over the first `warmup`, then the
    schedule's shape (bertkit.optim.after_warmup) to 0 at 1."""
    if warmup > 0 and fraction < warmup:
        return max(fraction / warmup, 1e-3)  # never exactly 0: the first step still moves
    return after_warmup((fraction - warmup) / max(1e-12, 1.0 - warmup), schedule, decay)


class BudgetSchedule:
    """LambdaLR's factor for a time-budgeted run. `used_s` is set by the loop after every step; `trace[s]` is the
    fraction that the rate of step s + 1 came from (a replay reads it back instead of the clock). LambdaLR keeps
    this object's fields in its state, so a checkpoint carries the time used and the trace: --resume continues both."""

    def __init__(self, budget_s: float | None, warmup: float, schedule: str, replay: list[float] | None = None,
                 decay: float = 0.1):
        after_warmup(0.0, schedule, decay)  # validates the name
        self.budget_s, self.warmup, self.schedule, self.decay = budget_s, warmup, schedule, decay
        self.replay = replay
        self.used_s = 0.0
        self.trace: list[float] = []

    def spent(self) -> bool:
        return self.replay is None and self.used_s >= self.budget_s

    def __call__(self, step: int) -> float:
        if self.replay is not None:
            fraction = self.replay[min(step, len(self.replay) - 1)]
        else:
            fraction = min(1.0, self.used_s / self.budget_s)
        del self.trace[step:]  # a rollback or a resume rewinds the record with the step count
        self.trace.append(fraction)
        return lr_at(fraction, self.warmup, self.schedule, self.decay)

    def record(self, run_dir: Path, steps: int) -> None:
        """RUN/schedule.json: what --schedule-from replays (rank 0, at every checkpoint)."""
        atomic_write_json(Path(run_dir) / SCHEDULE_FILE, {
            "time_budget_s": self.budget_s, "time_used_s": round(self.used_s, 3), "steps": steps,
            "warmup": self.warmup, "schedule": self.schedule, "decay": self.decay,
            "fraction": self.trace[:steps]})


def read_schedule(run_dir) -> dict:
    """A run's recorded schedule, for --schedule-from; ValueError naming the file when there is none."""
    path = Path(run_dir) / SCHEDULE_FILE
    try:
        d = json.loads(path.read_text())
        fraction = [float(f) for f in d["fraction"]]
        if not fraction or d["schedule"] not in SCHEDULES:
            raise ValueError("no steps recorded")
        return {**d, "fraction": fraction}
    except FileNotFoundError:
        raise ValueError(f"--schedule-from {run_dir}: no {SCHEDULE_FILE} there; only a run with --time-budget "
                         "records its schedule") from None
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ValueError(f"--schedule-from {run_dir}: {path} is not a recorded schedule ({e})") from None


def plan_schedule(cfg) -> tuple[BudgetSchedule | None, int | None]:
    """(the budget schedule or None, the step limit or None) for a PretrainConfig: --schedule-from replays a
    recorded run (its steps unless --max-steps asks for fewer); --time-budget runs until the time is spent (or
    --max-steps, if given, comes first); otherwise --max-steps (10,000 when not given) on the step schedule."""
    if cfg.schedule_from:
        rec = read_schedule(cfg.schedule_from)
        steps = cfg.max_steps or rec["steps"]
        if steps > len(rec["fraction"]):
            raise ValueError(f"--max-steps {steps}: --schedule-from {cfg.schedule_from} recorded only "
                             f"{len(rec['fraction'])} steps")
        return BudgetSchedule(rec["time_budget_s"], rec["warmup"], rec["schedule"], replay=rec["fraction"],
                              decay=rec.get("decay", 0.1)), steps
    if cfg.time_budget:
        return BudgetSchedule(cfg.time_budget, cfg.warmup, cfg.schedule, decay=cfg.decay), cfg.max_steps
    return None, cfg.max_steps or DEFAULT_MAX_STEPS
