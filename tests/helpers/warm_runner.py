"""Run documented code in fresh processes that start with torch already imported.

The docs test runs every Python block and example in a process of its own. Starting a
Python that imports torch costs more than most blocks themselves, so this server imports
torch once, and then forks one child per job from that state: each job gets a new
process in which no other block, test or fixture ever ran (its own globals, cwd and
output), just without paying for ``import torch`` again. Nothing else is imported before
the fork (no Qt, no tracing), so what a block imports it imports itself.

Protocol, one JSON line per job on stdin: ``{"cwd", "code" | "script", "argv", "timeout"}``;
one JSON line back per job: ``{"rc", "stdout", "stderr"}``.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import traceback

import torch  # the one thing every block imports; paid once, here

torch.set_num_threads(1)


def _child(job: dict, out_path: str, err_path: str) -> None:
    os.chdir(job["cwd"])
    out = os.open(out_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    err = os.open(err_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    os.dup2(out, 1)
    os.dup2(err, 2)
    sys.stdout = os.fdopen(1, "w", buffering=1)
    sys.stderr = os.fdopen(2, "w", buffering=1)
    rc = 0
    try:
        if "script" in job:
            import runpy

            sys.argv = [job["script"], *job.get("argv", [])]
            sys.path.insert(0, os.path.dirname(job["script"]))
            runpy.run_path(job["script"], run_name="__main__")
        else:
            sys.argv = ["-c"]
            sys.path.insert(0, "")
            exec(compile(job["code"], "<block>", "exec"), {"__name__": "__main__"})
    except SystemExit as e:
        rc = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except BaseException:
        traceback.print_exc()
        rc = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(rc)


def main() -> None:
    for line in sys.stdin:
        job = json.loads(line)
        out_path = os.path.join(job["cwd"], ".stdout")
        err_path = os.path.join(job["cwd"], ".stderr")
        pid = os.fork()
        if pid == 0:
            _child(job, out_path, err_path)
        signal.signal(signal.SIGALRM, lambda *_, pid=pid: os.kill(pid, signal.SIGKILL))
        signal.alarm(int(job.get("timeout", 120)))
        _, status = os.waitpid(pid, 0)
        signal.alarm(0)
        rc = os.waitstatus_to_exitcode(status)
        with open(out_path) as f, open(err_path) as g:
            reply = {"rc": rc, "stdout": f.read(), "stderr": g.read()}
        print(json.dumps(reply), flush=True)


if __name__ == "__main__":
    main()
