"""Logging configured once: every module's logger reaches the one handler, as text or JSON lines."""

from __future__ import annotations

import io
import json
import logging

import pytest

from prebake.engine.common.logs import Countdown, LogSettingError, configure


@pytest.fixture
def restore_root():
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


def test_json_format_writes_one_object_a_line_from_any_modules_logger(restore_root):
    out = io.StringIO()
    configure({"PREBAKE_LOG_FORMAT": "json"}, stream=out)
    logging.getLogger("prebake.registry.backends.s3").info("fetched %s", "blob")
    logging.getLogger("prebake.trust").warning("two\nlines")
    first, second = (json.loads(line) for line in out.getvalue().splitlines())
    assert (
        first["logger"] == "prebake.registry.backends.s3"
        and first["message"] == "fetched blob"
        and first["level"] == "INFO"
    )
    assert second["message"] == "two\nlines" and second["ts"].endswith("Z")


def test_configuring_twice_replaces_the_handler_and_the_level_filters(restore_root):
    out = io.StringIO()
    configure({}, stream=io.StringIO())
    configure({"PREBAKE_LOG_LEVEL": "warning"}, stream=out)
    logging.getLogger("engine.x").info("hidden")
    logging.getLogger("engine.x").warning("shown")
    (line,) = out.getvalue().splitlines()
    assert line.endswith(" WARNING engine.x: shown") and line[:4].isdigit()


def test_an_unknown_level_or_format_is_refused_with_the_choices():
    with pytest.raises(LogSettingError, match="DEBUG, INFO"):
        configure({"PREBAKE_LOG_LEVEL": "loud"}, stream=io.StringIO())
    with pytest.raises(LogSettingError, match="text or json"):
        configure({"PREBAKE_LOG_FORMAT": "xml"}, stream=io.StringIO())


def test_a_countdown_counts_and_estimates_the_time_left():
    countdown = Countdown(12)
    line = countdown.line("warm-up a")
    assert line.startswith("[ 1/12] warm-up a (~") and line.endswith(" left)")
