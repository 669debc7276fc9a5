"""The child process that runs a TARGET's code for ``scan`` / ``simulate``, and everything it starts.

``os._exit`` in a TARGET ends the process that called it, and a TARGET that never returns can only be stopped
from outside; so the user's code runs in a child, and the parent prints one line when it ends without finishing.
The parent owns the child's whole process tree: the child starts in its own session (its own process group),
``--timeout`` and SIGINT / SIGTERM / SIGHUP end that group (processes the TARGET forked included), and whatever
the TARGET left running is ended when the check is over. A signal is the command's end too: one line, exit code
128 + the signal's number (130, 143, 129), as a shell reports it.

The parent hands the child its state (``sys.path``, ``sys.argv``) and a status channel through a file descriptor
named on the child's own command line, never through the environment: a variable set outside (a stray
``TORCHDOCTOR_CLI_CHILD`` of an older release) can neither redirect anything nor turn a limit off. The child
writes ``target SPEC`` while it works on a TARGET and ``exit N`` just before it leaves.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from typing import Any, NoReturn

_ROLE: dict[str, Any] = {"where": None, "pid": None, "pending": False}
_GRACE = 2.0  # seconds the child gets to end at a forwarded signal before its group is killed

# The child's first code: read the state the parent wrote, then become the child. Names torchdoctor only after
# sys.path is the parent's, so the same torchdoctor (a source checkout, a PYTHONPATH entry) is imported.
_BOOT = ("import json, os, sys; w, n = sys.argv[1], int(sys.argv[2]); "
         "s = json.loads(os.pread(int(w[3:]), n, 0) if w.startswith('fd:') else open(w[5:], 'rb').read(n)); "
         "sys.path[:] = s['path']; sys.argv[:] = s['argv']; "
         "from torchdoctor._cli import child; child.adopt(int(w[3:]) if w.startswith('fd:') else w[5:]); "
         "from torchdoctor._cli.main import main; sys.exit(main())")


def adopt(where: int | str) -> None:
    """This process is the child: ``where`` is the status descriptor (POSIX) or file. Only the boot code above
    calls it."""
    _ROLE.update(where=where, pid=os.getpid(), pending=True)
    if isinstance(where, int):
        os.set_inheritable(where, False)  # a program the TARGET starts never gets it


def in_child() -> bool:
    """This process is a CLI child running the user's code (the whole process is the user's run, as under python)."""
    return _ROLE.get("pid") == os.getpid()


def child_role() -> bool:
    """True once, for the ``main()`` the boot code calls; a ``main()`` the TARGET's own code calls runs in-process."""
    pending = bool(_ROLE["pending"])
    _ROLE["pending"] = False
    return pending


def tell_parent(line: str) -> None:
    """A status line for the parent (nothing outside a child, nothing from a process the TARGET forked)."""
    where = _ROLE["where"]
    if where is None or _ROLE["pid"] != os.getpid():
        return
    data = (line.replace("\n", " ") + "\n").encode("utf-8", "surrogateescape")
    try:
        if isinstance(where, int):
            os.write(where, data)
        else:
            with open(where, "ab") as fh:
                fh.write(data)
    except OSError:
        pass


def child_exit(code: int) -> NoReturn:
    """The child's end: output flushed, the code written for the parent, then gone (a thread the TARGET
    started and never stopped must not keep a finished check alive)."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    tell_parent(f"exit {code}")
    os._exit(code)


def _status(path: str) -> tuple[str | None, int | None]:
    target, code = None, None
    try:
        with open(path, "rb") as fh:
            fh.readline()  # the state the parent wrote
            for raw in fh:
                word, _, rest = raw.decode("utf-8", "surrogateescape").rstrip("\n").partition(" ")
                if word == "target":
                    target = rest
                elif word == "exit" and rest.lstrip("-").isdigit():
                    code = int(rest)
    except OSError:
        pass
    return target, code


class _Signalled(Exception):
    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


def _raise(signum: int, frame: Any) -> None:
    raise _Signalled(signum)


def _handlers(install: Any) -> dict[int, Any]:
    """SIGINT, SIGTERM and SIGHUP set to ``install`` (main thread only: Python's rule); the previous ones."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        return {}
    previous = {}
    for name in ("SIGINT", "SIGTERM", "SIGHUP"):
        signum = getattr(signal, name, None)
        if signum is not None:
            previous[signum] = signal.signal(signum, install)
    return previous


def _wait(proc: Any, timeout: float | None) -> bool:
    """Until the child has ended (True) or ``timeout`` passed (False). On Linux the child is left unreaped, so
    its process group id cannot be given to another process before the group is ended."""
    import time

    if not hasattr(os, "waitid"):
        import subprocess

        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return False
        return True
    if timeout is None:
        os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOWAIT)
        return True
    deadline = time.monotonic() + timeout
    delay = 0.0005
    while os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is None:
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        time.sleep(min(delay, left))
        delay = min(delay * 2, 0.05)
    return True


def _end_group(proc: Any, signum: int) -> None:
    """``signum`` to the child's whole process group (POSIX); elsewhere, the child itself is killed."""
    if os.name == "posix":
        try:
            os.killpg(proc.pid, signum)
        except OSError:  # the group is already empty
            pass
    elif proc.poll() is None:
        proc.kill()


def _on_signal(proc: Any, signum: int) -> None:
    """Forward the signal to the group (the child ends as it would at that signal), give it a moment, then kill
    what is left. Further signals are ignored meanwhile: the grace period is short and the end is certain."""
    import signal

    _handlers(signal.SIG_IGN)
    _end_group(proc, signum)
    _wait(proc, _GRACE)
    _end_group(proc, signal.SIGKILL)
    proc.wait()


def _write_all(fd: int, data: bytes) -> None:
    while data:
        data = data[os.write(fd, data):]


def run_in_child(argv: Sequence[str], verb: str, first: str, timeout: float | None) -> int:
    """Run ``torchdoctor ARGV`` in a child Python with this interpreter's flags, ``sys.path`` and ``sys.argv``
    (so TARGET resolves exactly as it would here), sharing stdout and stderr. Returns the child's exit code; 2
    with one line when the child ended without finishing (``os._exit``, a signal) or outlived ``timeout``;
    128 + N with one line when this process got signal N (the child's group is ended first)."""
    import json
    import signal
    import subprocess
    import tempfile

    posix = os.name == "posix"
    fd, path = tempfile.mkstemp(prefix="torchdoctor-", suffix=".status")
    state = json.dumps({"path": sys.path, "argv": [sys.argv[0] if sys.argv else "torchdoctor", *argv]}).encode()
    _write_all(fd, state + b"\n")
    if not posix:
        os.close(fd)
    where = f"fd:{fd}" if posix else f"path:{path}"
    cmd = [sys.executable, *subprocess._args_from_interpreter_flags(),  # type: ignore[attr-defined]
           "-c", _BOOT, where, str(len(state))]
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    proc: Any = None
    previous = _handlers(_raise)
    try:
        try:
            proc = subprocess.Popen(cmd, pass_fds=(fd,) if posix else (), start_new_session=posix)
            finished = _wait(proc, timeout)
        except _Signalled as sig:
            if proc is not None:
                _on_signal(proc, sig.signum)
            target, _ = _status(path)
            name = signal.Signals(sig.signum).name
            print(f"torchdoctor {verb}: {target or first}: stopped by {name}; the TARGET and the processes it "
                  "started were ended, nothing was checked", file=sys.stderr)
            return 128 + sig.signum
        if not finished:
            _end_group(proc, signal.SIGKILL)
            proc.wait()
            target, _ = _status(path)
            print(f"torchdoctor {verb}: {target or first}: still running after {timeout:g} s (--timeout); "
                  "stopped, nothing was checked", file=sys.stderr)
            return 2
        _end_group(proc, signal.SIGKILL)  # what the TARGET started and left running ends with the check
        proc.wait()
        target, code = _status(path)
        if code is not None:
            return code
        rc = proc.returncode
        how = f"killed by {signal.Signals(-rc).name}" if rc < 0 and -rc in set(signal.Signals) else f"exit code {rc}"
        print(f"torchdoctor {verb}: {target or first}: the TARGET ended the process ({how}; os._exit or "
              "sys.exit in its code?) before the check finished: nothing was checked", file=sys.stderr)
        return 2
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        if posix:
            os.close(fd)
        try:
            os.unlink(path)
        except OSError:
            pass


def descendants(root: int) -> list[int]:
    """The processes below ``root`` (children, theirs, ...), read from ``/proc`` (Linux; elsewhere none)."""
    children: dict[int, list[int]] = {}
    try:
        entries = os.listdir("/proc")
    except OSError:
        return []
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as fh:
                stat = fh.read()
        except OSError:
            continue
        fields = stat[stat.rfind(b")") + 2:].split()  # after "(comm)", which may hold spaces
        if len(fields) > 1:
            children.setdefault(int(fields[1]), []).append(int(entry))
    out, todo = [], list(children.get(root, []))
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo.extend(children.get(pid, []))
    return out


def _end_processes(pids: list[int], signum: int) -> None:
    import signal
    import time

    for sig in (signum, signal.SIGKILL):
        for pid in pids:
            try:
                os.kill(pid, sig)
            except OSError:
                pass
        deadline = time.monotonic() + _GRACE
        while sig == signum and time.monotonic() < deadline and any(os.path.exists(f"/proc/{p}") for p in pids):
            time.sleep(0.05)


class ProgramSignals:
    """For ``run`` and ``trace``, which run a program in this process: SIGTERM and SIGHUP (what ``timeout``, CI
    runners and a closed terminal send) end the processes the program started, then this one, with one line and
    128 + N. A handler the program installs itself wins, as under python; a process the program forked that gets
    the signal ends as python would. SIGINT stays python's KeyboardInterrupt (the terminal sends it to the whole
    foreground group anyway)."""

    def __init__(self, verb: str, err: Any) -> None:
        self.verb, self.err, self.pid = verb, err, os.getpid()
        self.previous: dict[int, Any] = {}

    def __enter__(self) -> ProgramSignals:
        import signal
        import threading

        if os.name == "posix" and threading.current_thread() is threading.main_thread():
            for signum in (signal.SIGTERM, signal.SIGHUP):
                self.previous[signum] = signal.signal(signum, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        import signal

        for signum, handler in self.previous.items():
            if signal.getsignal(signum) == self._handle:  # not one the program replaced it with
                signal.signal(signum, handler)

    def _handle(self, signum: int, frame: Any) -> None:
        import signal

        if os.getpid() != self.pid:  # a forked copy of the program: the default end
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
            return
        _end_processes(descendants(self.pid), signum)
        line = (f"torchdoctor {self.verb}: stopped by {signal.Signals(signum).name}; the program and the processes "
                "it started were ended\n")
        try:
            os.write(self.err, line.encode("utf-8", "backslashreplace"))
        except OSError:
            pass
        os._exit(128 + signum)
