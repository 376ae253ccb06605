"""Foreground commands turn SIGTERM/SIGHUP (and SIGINT when asked) into StopRequested."""

import os
import signal

import pytest

from flows.signals import StopRequested, foreground_signals


def test_sigterm_raises_stop_requested_and_the_previous_handlers_come_back():
    before = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    with pytest.raises(StopRequested) as caught:
        with foreground_signals(raise_on=(signal.SIGTERM, signal.SIGHUP)):
            assert signal.getsignal(signal.SIGINT) is before[signal.SIGINT]  # Ctrl-C stays KeyboardInterrupt
            os.kill(os.getpid(), signal.SIGTERM)
            for _ in range(1000):  # Python runs the handler between bytecodes
                pass
    assert caught.value.args == ("SIGTERM",)
    assert {sig: signal.getsignal(sig) for sig in before} == before


def test_shield_ignores_a_second_signal_during_teardown():
    # A known previous handler: under `nohup` the inherited SIGHUP disposition is already SIG_IGN.
    def previous(signum, frame):
        raise AssertionError("the shield should have ignored the signal")

    original = signal.signal(signal.SIGHUP, previous)
    try:
        with foreground_signals() as signals:
            signals.shield()
            os.kill(os.getpid(), signal.SIGHUP)  # ignored: no exception, the process lives on
            assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
        assert signal.getsignal(signal.SIGHUP) is previous  # restored after the block
    finally:
        signal.signal(signal.SIGHUP, original)
