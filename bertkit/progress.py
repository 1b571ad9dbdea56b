"""Progress for people: a redrawn bar on a terminal, a plain line now and then in a log.

Off a terminal (Slurm, nohup, CI, `make demo > demo.log`) tqdm still redraws its bar with carriage returns on every
update, which makes lines thousands of characters long. `tqdm(...)` here is tqdm on a terminal and LogLines
elsewhere (and under a stage's --no-progress): the same object and numbers, written as a whole line every
LINE_SECONDS or every LINE_FRACTION of the total, and at the end. Every stage imports its progress bar from here.
"""
import sys
import time

from tqdm import tqdm as _tqdm

LINE_SECONDS = 60.0
LINE_FRACTION = 0.05


class LogLines(_tqdm):
    """tqdm that writes plain lines (see the module docstring)."""

    def __init__(self, *args, **kwargs):
        self._line_t, self._line_n, self._line_text = time.time(), None, None
        kwargs["mininterval"] = 0  # display() below decides when a line is due
        kwargs.setdefault("dynamic_ncols", False)
        kwargs["ncols"] = None
        super().__init__(*args, **kwargs)

    def display(self, msg=None, pos=None):
        if self.disable and pos != 0:  # close() disables the bar, then displays it one last time with pos=0
            return True
        now, n, text = time.time(), self.n, self.__str__().rstrip()
        if pos == 0:  # close(): the final state, unless that very line was the last one written
            due = text != self._line_text
        elif self._line_n == n:  # nothing new since the last line
            return True
        else:
            step = self.total * LINE_FRACTION if self.total else None
            due = (self._line_n is None or now - self._line_t >= LINE_SECONDS or (step and n - self._line_n >= step)
                   or (self.total and n >= self.total))
        if due:
            self.fp.write(text + "\n")
            self.fp.flush()
            self._line_t, self._line_n, self._line_text = now, n, text
        return True


def _is_terminal(stream) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


def tqdm(*args, plain: bool = False, **kwargs):
    """tqdm on a terminal, LogLines elsewhere (same arguments). plain=True (a stage's --no-progress): LogLines on a
    terminal too: no bar, but a line a minute (or each 5 %), so a long stage never runs for half an hour unheard."""
    stream = kwargs.get("file") or sys.stderr
    return (LogLines if plain or not _is_terminal(stream) else _tqdm)(*args, **kwargs)


tqdm.write = _tqdm.write
