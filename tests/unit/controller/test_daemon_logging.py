"""The log format both processes share (`daemon.configure_logging`, `daemon.capture_stdlib_logging`): JSON lines
in the cluster, console lines at a terminal, the same choice for structlog and the standard library's records, one
line per record even when threads log at once."""

from __future__ import annotations

import io
import json
import logging
import threading
import time

import pytest
import structlog

from dractl import config, daemon


class _Terminal(io.StringIO):
    """A stream that says it is a terminal."""

    def isatty(self) -> bool:
        return True


def _log_both(log_format: config.LogFormat | None, out: io.StringIO) -> list[str]:
    """One structlog line and one standard-library line with a traceback, written in `log_format` to `out`."""
    daemon.configure_logging(log_format, stream=out)
    undo = daemon.capture_stdlib_logging(log_format, stream=out)
    try:
        structlog.get_logger("t").info("from structlog", claim="ns/c")
        try:
            raise ValueError("bad")
        except ValueError:
            logging.getLogger("dractl.kube.informer").exception("from logging")
    finally:
        undo()
    return out.getvalue().splitlines()


@pytest.mark.parametrize(
    ("log_format", "stream"),
    [(None, io.StringIO), (config.LogFormat.JSON, _Terminal)],
    ids=["unset-on-a-pipe", "json-on-a-terminal"],
)
def test_json_lines_carry_the_traceback_as_a_field(
    log_format: config.LogFormat | None, stream: type[io.StringIO]
) -> None:
    """Guards: JSON (asked for, or unset on a stream that is not a terminal) makes every line of both loggers one
    JSON object with its event, level and timestamp, the traceback in its `exception` field."""
    lines = [json.loads(line) for line in _log_both(log_format, stream())]
    assert [(line["event"], line["level"]) for line in lines] == [("from structlog", "info"), ("from logging", "error")]
    assert all("timestamp" in line for line in lines)
    assert lines[0]["claim"] == "ns/c"
    assert "ValueError: bad" in lines[1]["exception"]


@pytest.mark.parametrize(
    ("log_format", "stream"),
    [(None, _Terminal), (config.LogFormat.CONSOLE, io.StringIO)],
    ids=["unset-on-a-terminal", "console-on-a-pipe"],
)
def test_console_lines_are_not_json(log_format: config.LogFormat | None, stream: type[io.StringIO]) -> None:
    """Guards: console (asked for, or unset on a terminal) writes readable lines for both loggers, the traceback
    after them, and no JSON."""
    lines = _log_both(log_format, stream())
    assert not [line for line in lines if line.startswith("{")]
    text = "\n".join(lines)
    assert "from structlog" in text and "claim" in text and "from logging" in text
    assert "ValueError" in text and "bad" in text


class _Yielding(io.StringIO):
    """A stream that hands the interpreter to another thread before each write, as a busy process's stderr may:
    a line written in two pieces (text, then newline) is then split by whatever another thread writes."""

    def write(self, text: str) -> int:
        time.sleep(0)
        return super().write(text)


def test_lines_of_both_loggers_never_merge_when_threads_log_at_once() -> None:
    """Guards: structlog lines and standard-library records written by many threads at once each stay one JSON
    object on one line (a stdlib record between a structlog line and its newline merged two objects on one line)."""
    out = _Yielding()
    daemon.configure_logging(config.LogFormat.JSON, stream=out)
    undo = daemon.capture_stdlib_logging(config.LogFormat.JSON, stream=out)

    def log(index: int) -> None:
        for n in range(200):
            if index % 2:
                structlog.get_logger("t").info("structlog", n=n)
            else:
                logging.getLogger("dractl.kube.events").info("stdlib %d", n)

    threads = [threading.Thread(target=log, args=(index,)) for index in range(6)]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=60)
    finally:
        undo()
    lines = out.getvalue().splitlines()
    assert len(lines) == 6 * 200
    events = [json.loads(line)["event"] for line in lines]
    assert events.count("structlog") == 600 and len([e for e in events if e.startswith("stdlib ")]) == 600
