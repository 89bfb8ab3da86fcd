"""Unit tests cover the plain core: Ray must not start here."""

import pytest


@pytest.fixture(autouse=True)
def _no_ray(monkeypatch):
    import ray

    def refuse(*args, **kwargs):
        raise AssertionError("unit tests must not start Ray; put this test under integration/")

    monkeypatch.setattr(ray, "init", refuse)
