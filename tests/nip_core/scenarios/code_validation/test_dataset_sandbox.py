"""Tests of the sandboxed solution runner."""

import os
import signal

import pytest

from nip_core.scenarios.code_validation.dataset.sandbox import (
    ResourceLimits,
    TestCase,
    check_solution,
    normalise_output,
    run_solution,
)

ADDER = "import sys\nprint(sum(map(int, sys.stdin.read().split())))\n"


def test_run_solution_feeds_stdin_and_captures_stdout():
    result = run_solution(ADDER, "1 2 3\n4\n")
    assert result.status == "ok"
    assert result.returncode == 0
    assert result.stdout == "10\n"
    assert result.stderr == ""


def test_wrong_output_is_a_failure_not_an_error():
    tests = [("1 2", "3"), ("5 5", "11"), ("0 0", "0")]
    result = check_solution(ADDER, tests)
    assert (result.passed, result.failed, result.errors, result.timeouts) == (2, 1, 0, 0)
    assert result.outcomes == ["pass", "fail", "pass"]
    assert not result.all_passed
    assert result.pass_fraction == pytest.approx(2 / 3)


def test_endless_loop_times_out():
    result = run_solution("while True:\n    pass\n", "", timeout_s=0.5)
    assert result.status == "timeout"
    assert result.returncode is None
    assert 0.5 <= result.duration_s < 5.0


def test_crash_is_an_error_with_traceback():
    result = run_solution("x = int(input())\nprint(10 // x)\n", "0\n")
    assert result.status == "error"
    assert result.returncode == 1
    assert "ZeroDivisionError" in result.stderr


def test_memory_limit_raises_memory_error():
    code = "data = bytearray(400 * 1024 * 1024)\nprint(len(data))\n"
    result = run_solution(code, "", limits=ResourceLimits(address_space_bytes=256 * 1024 * 1024))
    assert result.status == "error"
    assert "MemoryError" in result.stderr
    assert result.stdout == ""


def test_output_limit_stops_a_flood_of_output():
    code = "while True:\n    print('x' * 1000)\n"
    result = run_solution(code, "", timeout_s=10.0, limits=ResourceLimits(output_bytes=64 * 1024))
    assert result.status == "error"  # killed by SIGXFSZ long before the timeout
    assert result.returncode != 0
    assert len(result.stdout) <= 64 * 1024


@pytest.mark.skipif(os.geteuid() == 0, reason="RLIMIT_NPROC is not enforced for root")
def test_fork_is_refused():
    result = run_solution("import os\nos.fork()\nprint('forked')\n", "")
    assert result.status == "error"
    assert "BlockingIOError" in result.stderr or "Resource temporarily unavailable" in result.stderr


def test_each_run_has_a_fresh_working_directory():
    code = (
        "import os\n"
        "print(sorted(f for f in os.listdir('.') if f.startswith('mark')))\n"
        "open('mark.txt', 'w').write('x')\n"
    )
    first = run_solution(code, "")
    second = run_solution(code, "")
    assert first.stdout == second.stdout == "[]\n"


def test_child_environment_is_clean_and_deterministic():
    code = (
        "import os, sys\n"
        "print(os.environ.get('PYTHONHASHSEED'), os.environ.get('NIPFLOW_SECRET_PROBE'))\n"
        "print(hash('nipflow'))\n"
    )
    os.environ["NIPFLOW_SECRET_PROBE"] = "leak"
    try:
        first = run_solution(code, "")
        second = run_solution(code, "")
    finally:
        del os.environ["NIPFLOW_SECRET_PROBE"]
    assert first.stdout.splitlines()[0] == "0 None"
    assert first.stdout == second.stdout  # pinned hash seed: same string hash in both runs


def test_third_party_packages_are_not_importable_but_stdlib_is():
    stdlib = run_solution("import collections, heapq, bisect, re, fractions, datetime\nprint('ok')\n", "")
    assert stdlib.stdout == "ok\n"
    third_party = run_solution("import pydantic\n", "")
    assert third_party.status == "error"
    assert "ModuleNotFoundError" in third_party.stderr


def test_exit_builtin_works_without_site():
    assert run_solution("print(1)\nexit(0)\nprint(2)\n", "").stdout == "1\n"
    assert run_solution("exit(3)\n", "").returncode == 3


def test_check_solution_counts_timeouts_and_errors():
    code = "n = int(input())\nwhile n == 0:\n    pass\nprint(10 // (n - 1))\n"
    tests = [TestCase(input="2\n", output="10"), TestCase(input="0\n", output="?"), TestCase(input="1\n", output="?")]
    result = check_solution(code, tests, timeout_s=0.5)
    assert result.outcomes == ["pass", "timeout", "error"]
    assert (result.passed, result.failed, result.errors, result.timeouts) == (1, 0, 1, 1)


def test_normalise_output_ignores_trailing_whitespace_only():
    assert normalise_output("1 2  \r\n3\n\n") == "1 2\n3"
    assert normalise_output("\n\n5") == "5"
    assert normalise_output("a\n\nb") != normalise_output("a\nb")
    assert normalise_output("a  b") != normalise_output("a b")


def test_cpu_limit_counts_as_timeout():
    result = run_solution("while True:\n    pass\n", "", timeout_s=30.0, limits=ResourceLimits(cpu_seconds=1))
    assert result.status == "timeout"
    assert result.returncode == -signal.SIGXCPU
    assert result.duration_s < 20.0
