"""Progress off a terminal (Slurm, nohup, CI, `make demo > demo.log`): plain lines now and then, never a bar redrawn
with carriage returns; on a terminal, tqdm's bar."""
import io
import subprocess

from bertkit.progress import LINE_FRACTION, LogLines, tqdm
from tests.helpers import BIN, env_without_dist


def test_off_a_terminal_a_line_every_five_percent_and_at_the_end():
    out = io.StringIO()
    bar = tqdm(total=1000, desc="work", file=out)
    assert isinstance(bar, LogLines)
    for i in range(1000):
        bar.update(1)
        bar.set_postfix(loss=f"{1000 - i}")
    bar.close()
    lines = [line for line in out.getvalue().splitlines() if line]  # (tqdm ends a closed bar with a newline)
    assert "\r" not in out.getvalue()
    assert len(lines) == 2 + round(1 / LINE_FRACTION)  # the first line, one per 5 %, the final state at close
    assert lines[-1].startswith("work: 100%") and "1000/1000" in lines[-1] and "loss=1" in lines[-1]


def test_a_stage_logged_to_a_file_writes_short_lines(tmp_path):
    (tmp_path / "in").mkdir()
    for i in range(30):
        (tmp_path / "in" / f"d{i}.txt").write_text(" ".join(f"Word{j} w{i}." for j in range(200)) + "\n")
    with open(tmp_path / "log", "w") as log:
        subprocess.run([str(BIN / "bertkit"), "prepare-corpus", str(tmp_path / "in"), "--out", str(tmp_path / "c"),
                        "--min-chars", "5"], stdout=log, stderr=subprocess.STDOUT, env=env_without_dist(), check=True,
                       timeout=300)
    text = (tmp_path / "log").read_text()
    assert "\r" not in text and "prepare-corpus" in text
    assert max(len(line) for line in text.splitlines()) < 300


def test_no_progress_is_plain_lines_even_on_a_terminal(tmp_path):
    """Issue 81: --no-progress printed nothing (a 29-minute vocabulary, a 25-minute pretraining, silent); it is now
    no bar but a plain line each minute or 5 %, on a terminal too."""
    class Terminal(io.StringIO):
        def isatty(self):
            return True

    for plain, kind in ((False, "a bar"), (True, "lines")):
        bar = tqdm(total=10, file=Terminal(), plain=plain)
        assert isinstance(bar, LogLines) == (kind == "lines")
        bar.close()
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "d.txt").write_text("A sentence of some length here. Another one follows it.\n")
    done = subprocess.run([str(BIN / "bertkit"), "prepare-corpus", str(tmp_path / "in"), "--out", str(tmp_path / "c"),
                           "--min-chars", "5", "--no-progress"], capture_output=True, text=True,
                          env=env_without_dist(), timeout=300)
    assert done.returncode == 0 and "prepare-corpus: 100%" in done.stderr, done.stderr
