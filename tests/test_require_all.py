"""PARLEY_REQUIRE_ALL=1 (set by .ci/run): a missing system test dependency fails the run."""

import pytest

from tests.conftest import REQUIRE_ALL_ENV, missing


def test_a_missing_test_dependency_skips_by_default(monkeypatch):
    monkeypatch.delenv(REQUIRE_ALL_ENV, raising=False)
    with pytest.raises(pytest.skip.Exception, match="redis-server"):
        missing("redis-server is not installed")


def test_under_require_all_a_missing_test_dependency_fails(monkeypatch):
    monkeypatch.setenv(REQUIRE_ALL_ENV, "1")
    with pytest.raises(pytest.fail.Exception, match="Chromium"):
        missing("needs Chromium")
