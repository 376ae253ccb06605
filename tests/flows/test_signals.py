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


# -- nipflow run / resume / sweep: SIGTERM and SIGHUP stop them like Ctrl-C ---------------------------

HANDLED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


@pytest.fixture
def handlers():
    """The handlers before the test, put back after it (a stop leaves its handler installed)."""
    before = {sig: signal.getsignal(sig) for sig in HANDLED}
    yield before
    for sig, handler in before.items():
        signal.signal(sig, handler)


def _deliver(sig):
    os.kill(os.getpid(), sig)
    for _ in range(1000):  # Python runs the handler between bytecodes
        pass


def test_the_first_stop_signal_raises_interrupted_and_later_ones_are_ignored(handlers, capfd):
    from flows.signals import Interrupted, stop_like_ctrl_c

    with pytest.raises(Interrupted) as caught:
        with stop_like_ctrl_c():
            _deliver(signal.SIGTERM)
    assert isinstance(caught.value, KeyboardInterrupt)  # every `except KeyboardInterrupt` clean-up runs
    assert (caught.value.exit_status, str(caught.value)) == (143, "stopped by SIGTERM")
    for sig in HANDLED:  # the process is ending: its atexit hooks must not be cut short either
        _deliver(sig)
    err = capfd.readouterr().err
    assert all(f"{sig.name} ignored: stopping already" in err for sig in HANDLED)


def test_without_a_signal_the_handlers_come_back_and_ignored_signals_stay_ignored(handlers):
    from flows.signals import stop_like_ctrl_c

    signal.signal(signal.SIGHUP, signal.SIG_IGN)  # as under nohup
    with stop_like_ctrl_c() as stop:
        assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
        assert signal.getsignal(signal.SIGTERM) == stop.handle
        _deliver(signal.SIGHUP)  # nothing happens
    assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
    assert signal.getsignal(signal.SIGTERM) == handlers[signal.SIGTERM]
    assert signal.getsignal(signal.SIGINT) == handlers[signal.SIGINT]


def test_once_a_clean_up_began_a_first_stop_signal_is_ignored_too(handlers, capfd):
    # e.g. the preemption guard stopped the training: the records written next must not be cut short
    from flows.signals import shield_active_stop, stop_like_ctrl_c

    with stop_like_ctrl_c() as stop:
        shield_active_stop()
        _deliver(signal.SIGTERM)  # ignored: no Interrupted
    assert stop.received is None and "SIGTERM ignored: stopping already" in capfd.readouterr().err
    assert signal.getsignal(signal.SIGTERM) == handlers[signal.SIGTERM]  # no stop: the handlers came back
    shield_active_stop()  # outside a block: nothing to shield


@pytest.mark.parametrize("sig, status", [(signal.SIGTERM, 143), (signal.SIGHUP, 129), (signal.SIGINT, 130)])
def test_nipflow_run_exits_128_plus_the_signal_after_a_clean_up_that_a_second_signal_does_not_cut(
        handlers, monkeypatch, capfd, sig, status):
    import time

    from flows import cli

    cleaned = []

    def training(args):
        _deliver(sig)
        time.sleep(30)  # interrupted at once
        raise AssertionError("not stopped")

    def release():
        _deliver(signal.SIGTERM)  # a supervisor's second SIGTERM during the clean-up
        cleaned.append("servers released")

    monkeypatch.setitem(cli.COMMANDS, "run", training)
    monkeypatch.setattr(cli, "_release_llm_servers", release)
    assert cli.main(["run", "graph_isomorphism", "vanilla_ppo"]) == status
    err = capfd.readouterr().err
    assert cleaned == ["servers released"]
    assert ("nipflow: interrupted" if sig == signal.SIGINT else f"nipflow: stopped by {sig.name}") in err
    assert "SIGTERM ignored: stopping already" in err


# -- a stop raised where Python swallows exceptions (a weakref callback, __del__) is raised again -------

class _Collected:
    pass


def _signal_inside_a_weakref_callback(sig):
    """Deliver ``sig`` while a weakref callback runs: its handler's exception is "ignored" there."""
    import weakref

    target = _Collected()
    ref = weakref.ref(target, lambda _: signal.raise_signal(sig))  # raise_signal runs the handler at once
    del target
    return ref


def _spin(seconds):
    import time

    end = time.monotonic() + seconds
    while time.monotonic() < end:  # Python code: the handler can run between any two bytecodes
        pass


def test_a_stop_swallowed_in_a_weakref_callback_still_stops_the_command(handlers, capfd):
    import sys

    from flows.signals import Interrupted, stop_like_ctrl_c

    hook = sys.unraisablehook
    with pytest.raises(Interrupted) as caught:
        with stop_like_ctrl_c() as stop:
            _signal_inside_a_weakref_callback(signal.SIGINT)
            _spin(10)  # without the second delivery the command trains on
    assert (caught.value.exit_status, stop.received) == (130, signal.SIGINT)
    assert "Exception ignored" not in capfd.readouterr().err
    assert sys.unraisablehook is hook  # the previous hook is put back after the block


def test_a_foreground_stop_swallowed_in_a_weakref_callback_is_raised_again():
    from flows.signals import foreground_signals

    with pytest.raises(StopRequested) as caught:
        with foreground_signals():
            _signal_inside_a_weakref_callback(signal.SIGTERM)
            _spin(10)
    assert caught.value.args == ("SIGTERM",)


def test_other_unraisable_exceptions_still_reach_the_previous_hook(handlers):
    import sys

    from flows.signals import stop_like_ctrl_c

    seen = []

    class Noisy:
        def __del__(self):
            raise ValueError("in __del__")

    previous, sys.unraisablehook = sys.unraisablehook, lambda u: seen.append(type(u.exc_value))
    try:
        with stop_like_ctrl_c():
            Noisy()
        assert seen == [ValueError]
    finally:
        sys.unraisablehook = previous
