"""How a process that moves messages sets Python's collector (actors.collector)."""

from __future__ import annotations

import gc

import pytest

from actors import collector


@pytest.fixture(autouse=True)
def _restored(monkeypatch):
    """Each test starts at Python's default, and leaves the process as it found it."""
    before = gc.get_threshold()
    monkeypatch.delenv(collector.KEEP_ENV, raising=False)
    gc.unfreeze()  # nothing frozen before, so a freeze count says what the test did
    gc.set_threshold(*collector.PYTHON_DEFAULT)
    yield
    gc.unfreeze()
    gc.set_threshold(*before)


def test_a_handle_raises_the_young_threshold_of_an_untuned_process():
    assert collector.client_process() is True
    assert gc.get_threshold() == collector.BUSY_THRESHOLDS
    assert gc.get_freeze_count() == 0  # a client's process is not frozen: it is not ours


def test_a_handle_leaves_a_collector_its_owner_tuned():
    gc.set_threshold(500, 5, 5)
    assert collector.client_process() is False
    assert gc.get_threshold() == (500, 5, 5)


@pytest.mark.parametrize("value", ["1", "yes"])
def test_keep_gc_leaves_the_default(monkeypatch, value):
    monkeypatch.setenv(collector.KEEP_ENV, value)
    assert collector.client_process() is False
    assert gc.get_threshold() == collector.PYTHON_DEFAULT


@pytest.mark.parametrize("value", ["", "0"])
def test_keep_gc_empty_or_zero_does_not_keep(monkeypatch, value):
    monkeypatch.setenv(collector.KEEP_ENV, value)
    assert collector.client_process() is True
    assert gc.get_threshold() == collector.BUSY_THRESHOLDS


def test_a_brokers_process_freezes_what_it_holds_and_raises_the_threshold():
    collector.own_process()
    assert gc.get_freeze_count() > 0
    assert gc.get_threshold() == collector.BUSY_THRESHOLDS
