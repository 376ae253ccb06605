"""Sandboxed execution of candidate stdin→stdout Python solutions.

Each run happens in a fresh Python subprocess with a fresh temporary working
directory. The child interpreter is started with ``-P -S -s -B`` (no script directory
on ``sys.path``, no ``site``, no user site, no byte-code writing): the standard
library works, third-party packages of the parent environment do not leak in. The
environment is rebuilt from scratch, so no ``PYTHON*`` variable of the parent reaches
the child, and ``PYTHONHASHSEED`` is pinned so that set/dict iteration order (and thus
the outcome of a run) is reproducible.

Resource limits are applied by a small bootstrap that runs inside the child before the
solution is executed, rather than via ``subprocess.Popen(preexec_fn=...)``: the
documentation warns that ``preexec_fn`` can deadlock when the parent has threads, and
test cases are run from a thread pool here.

stdin and stdout go through files in the temporary directory (not pipes), so that a
solution printing in an endless loop is stopped by ``RLIMIT_FSIZE`` instead of filling
the parent's memory.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Literal, Sequence

from pydantic import BaseModel, ConfigDict, Field

__all__ = [
    "CheckResult",
    "ExecutionResult",
    "ResourceLimits",
    "TestCase",
    "check_solution",
    "normalise_output",
    "run_solution",
]

ExecutionStatus = Literal["ok", "error", "timeout"]

# The bootstrap reads its limits from argv so that the same text is used for every run.
_BOOTSTRAP = r"""
import resource, sys
cpu_s, as_bytes, fsize_bytes, nproc = (int(v) for v in sys.argv[1:5])
def _limit(kind, value, hard=None):
    try:
        resource.setrlimit(kind, (value, value if hard is None else hard))
    except (ValueError, OSError):
        pass  # not settable here; the wall-clock timeout still applies
# soft < hard: the soft limit delivers SIGXCPU (reported as a timeout); at an equal
# hard limit Linux sends SIGKILL instead
_limit(resource.RLIMIT_CPU, cpu_s, cpu_s + 1)
_limit(resource.RLIMIT_AS, as_bytes)
_limit(resource.RLIMIT_FSIZE, fsize_bytes)
_limit(resource.RLIMIT_CORE, 0)
if nproc >= 0:
    _limit(resource.RLIMIT_NPROC, nproc)
with open("solution.py", encoding="utf-8") as f:
    source = f.read()
del resource, f, _limit, cpu_s, as_bytes, fsize_bytes, nproc
sys.argv = ["solution.py"]
import builtins
builtins.exit = builtins.quit = sys.exit  # normally installed by `site`, which is off
del builtins
code = compile(source, "solution.py", "exec")
del source
exec(code, {"__name__": "__main__", "__file__": "solution.py", "__builtins__": __builtins__})
"""

_STDERR_KEEP_CHARS = 4000


class ResourceLimits(BaseModel):
    """Limits applied to every solution run.

    Parameters
    ----------
    address_space_bytes : int
        ``RLIMIT_AS`` of the child (virtual memory).
    output_bytes : int
        ``RLIMIT_FSIZE``: the largest file (and so stdout) the child may write.
    max_processes : int
        ``RLIMIT_NPROC``; ``0`` forbids forking. Ignored by the kernel for root. A
        negative value leaves the limit unchanged.
    cpu_seconds : int, optional
        ``RLIMIT_CPU``. Default: ``int(timeout_s) + 2``, a back-stop behind the
        wall-clock timeout. Setting it below the wall-clock timeout makes the limit
        independent of machine load (CPU time does not grow while a process waits
        for a core), which the dataset builder relies on for reproducibility.
    """

    model_config = ConfigDict(frozen=True)

    address_space_bytes: int = 512 * 1024 * 1024
    output_bytes: int = 8 * 1024 * 1024
    max_processes: int = 0
    cpu_seconds: int | None = Field(default=None, ge=1)


class TestCase(BaseModel):
    """One stdin→stdout test case."""

    model_config = ConfigDict(frozen=True)
    __test__ = False  # not a pytest class

    input: str
    output: str


class ExecutionResult(BaseModel):
    """The outcome of one run of a solution on one input.

    Attributes
    ----------
    status : {"ok", "error", "timeout"}
        ``"ok"``: exited with code 0; ``"timeout"``: the wall-clock limit was reached
        (the process group was killed) or the CPU-time limit was (``SIGXCPU``);
        ``"error"``: any other non-zero exit or signal (exceptions, ``MemoryError``,
        output limit).
    stdout, stderr : str
        Captured output (stderr truncated to its last 4,000 characters).
    returncode : int | None
        Exit code; negative for a signal; ``None`` on a wall-clock timeout.
    duration_s : float
        Wall-clock time of the run.
    """

    status: ExecutionStatus
    stdout: str
    stderr: str
    returncode: int | None
    duration_s: float


class CheckResult(BaseModel):
    """Aggregate outcome of a solution on a list of test cases.

    ``outcomes[i]`` is ``"pass"``, ``"fail"`` (ran, wrong output), ``"error"`` or
    ``"timeout"`` for test case ``i``; ``max_duration_s`` is the longest run.
    """

    passed: int
    failed: int
    errors: int
    timeouts: int
    outcomes: list[Literal["pass", "fail", "error", "timeout"]]
    max_duration_s: float = 0.0

    @property
    def total(self) -> int:
        """Number of test cases."""
        return len(self.outcomes)

    @property
    def all_passed(self) -> bool:
        """True iff every test case passed (and there was at least one)."""
        return self.total > 0 and self.passed == self.total

    @property
    def pass_fraction(self) -> float:
        """Fraction of the test cases passed (0.0 when there are none)."""
        return self.passed / self.total if self.total else 0.0


def normalise_output(text: str) -> str:
    """Normalise program output for comparison.

    Trailing whitespace on each line and leading/trailing blank lines are ignored;
    inner blank lines and spacing inside a line are kept.
    """
    lines = [line.rstrip() for line in text.replace("\r\n", "\n").split("\n")]
    return "\n".join(lines).strip("\n")


def _child_env() -> dict[str, str]:
    # Only what the interpreter needs: a pinned hash seed for reproducible runs and a
    # UTF-8 locale for text I/O.
    return {
        "PATH": os.defpath,
        "PYTHONHASHSEED": "0",
        "PYTHONIOENCODING": "utf-8",
        "LC_ALL": "C.UTF-8",
        "LANG": "C.UTF-8",
    }


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    proc.wait()


def _read_text(path: str, limit: int) -> str:
    with open(path, "rb") as f:
        data = f.read(limit)
    return data.decode("utf-8", errors="replace")


def run_solution(
    code: str,
    stdin: str,
    timeout_s: float = 2.0,
    *,
    limits: ResourceLimits | None = None,
) -> ExecutionResult:
    """Run a Python program in a sandboxed subprocess.

    Parameters
    ----------
    code : str
        Source of a complete program reading stdin and writing stdout.
    stdin : str
        Text fed to the program's standard input.
    timeout_s : float
        Wall-clock limit.
    limits : ResourceLimits, optional
        Memory, output, process and CPU-time limits (defaults: 512 MiB, 8 MiB, no
        forking, ``int(timeout_s) + 2`` CPU seconds).

    Returns
    -------
    ExecutionResult
        The status, captured output, exit code and duration.
    """
    limits = limits or ResourceLimits()
    cpu_s = limits.cpu_seconds or int(timeout_s) + 2
    with tempfile.TemporaryDirectory(prefix="nipflow-cv-run-") as workdir:
        with open(os.path.join(workdir, "solution.py"), "w", encoding="utf-8") as f:
            f.write(code)
        stdin_path = os.path.join(workdir, "stdin.txt")
        with open(stdin_path, "w", encoding="utf-8") as f:
            f.write(stdin)
        stdout_path = os.path.join(workdir, "stdout.txt")
        stderr_path = os.path.join(workdir, "stderr.txt")
        argv = [
            sys.executable, "-P", "-S", "-s", "-B", "-c", _BOOTSTRAP,
            str(cpu_s), str(limits.address_space_bytes), str(limits.output_bytes),
            str(limits.max_processes),
        ]  # fmt: skip
        start = time.monotonic()
        with (
            open(stdin_path, "rb") as fin,
            open(stdout_path, "wb") as fout,
            open(stderr_path, "wb") as ferr,
        ):
            proc = subprocess.Popen(
                argv,
                stdin=fin,
                stdout=fout,
                stderr=ferr,
                cwd=workdir,
                env=_child_env(),
                close_fds=True,
                # Own process group, so a timeout kills anything the solution spawned.
                start_new_session=True,
            )
            try:
                returncode: int | None = proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                _kill_group(proc)
                returncode = None
        duration = time.monotonic() - start
        stdout = _read_text(stdout_path, limits.output_bytes)
        stderr = _read_text(stderr_path, 1 << 20)[-_STDERR_KEEP_CHARS:]
    if returncode is None or returncode == -signal.SIGXCPU:
        status: ExecutionStatus = "timeout"
    elif returncode == 0:
        status = "ok"
    else:
        status = "error"
    return ExecutionResult(
        status=status,
        stdout=stdout,
        stderr=stderr,
        returncode=returncode,
        duration_s=duration,
    )


def _default_workers() -> int:
    return max(1, min(4, os.cpu_count() or 1))


def check_solution(
    code: str,
    tests: Sequence[TestCase | tuple[str, str]],
    *,
    timeout_s: float = 2.0,
    max_workers: int | None = None,
    limits: ResourceLimits | None = None,
) -> CheckResult:
    """Run a solution on every test case and compare normalised outputs.

    Parameters
    ----------
    code : str
        The program to check.
    tests : sequence of TestCase or (input, expected_output) pairs
        The test cases, run concurrently.
    timeout_s : float
        Per-test wall-clock limit.
    max_workers : int, optional
        Size of the thread pool (default: ``min(4, cpu_count)``).
    limits : ResourceLimits, optional
        Passed to :func:`run_solution`.

    Returns
    -------
    CheckResult
        Counts of passed / failed / errored / timed-out tests and per-test outcomes.
    """
    cases = [t if isinstance(t, TestCase) else TestCase(input=t[0], output=t[1]) for t in tests]

    def _one(case: TestCase) -> tuple[str, float]:
        result = run_solution(code, case.input, timeout_s, limits=limits)
        if result.status != "ok":
            return result.status, result.duration_s
        same = normalise_output(result.stdout) == normalise_output(case.output)
        return ("pass" if same else "fail"), result.duration_s

    workers = max_workers or _default_workers()
    if workers == 1 or len(cases) <= 1:
        runs = [_one(c) for c in cases]
    else:
        with ThreadPoolExecutor(max_workers=workers) as pool:
            runs = list(pool.map(_one, cases))
    outcomes = [outcome for outcome, _ in runs]
    return CheckResult(
        passed=outcomes.count("pass"),
        failed=outcomes.count("fail"),
        errors=outcomes.count("error"),
        timeouts=outcomes.count("timeout"),
        outcomes=outcomes,
        max_duration_s=max((d for _, d in runs), default=0.0),
    )
