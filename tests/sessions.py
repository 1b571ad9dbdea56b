"""Find and SIGKILL the processes of a session a test started (Ray's workers leave their process group, not their
session). Plain standard library, so the srun stand-in and benchmarks/scale_out.py import it too."""
import os
import signal
import time


def session_members(sid: int) -> list[int]:
    """The live processes of session `sid`."""
    members = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
                if int(fields[3]) == sid and fields[0] != "Z":
                    members.append(int(entry))
            except (OSError, ValueError, IndexError):
                pass
    return members


def session_alive(sid: int) -> bool:
    return bool(session_members(sid))


def kill_session(sid: int) -> None:
    """SIGKILL every process of the session, again until none is left (one may be forking)."""
    for _ in range(100):
        members = session_members(sid)
        if not members:
            return
        for pid in members:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        time.sleep(0.05)
