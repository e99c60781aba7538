"""The helpers that start services for the runner and engine tests (tests/portable.py)."""
from __future__ import annotations

import socket

import pytest

from tests.portable import brief, ephemeral_port_range, free_port

pytestmark = pytest.mark.unit


def test_free_ports_are_distinct_bindable_and_below_the_ephemeral_range():
    """A port in the ephemeral range could be taken, between choosing and binding it, as the
    local port of any outgoing connection; one handed out twice would clash with itself."""
    ports = [free_port() for _ in range(20)]
    low, _ = ephemeral_port_range()
    assert len(set(ports)) == len(ports)
    assert all(1024 <= port < low for port in ports), (ports, low)
    for port in ports:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind(("127.0.0.1", port))


def test_brief_keeps_the_first_line_and_the_tail():
    text = "jobmanager exited with code 1\n" + "\n".join(f"log line {i}" for i in range(100)) + "\n\n"
    assert brief(text, tail=3).splitlines() == [
        "jobmanager exited with code 1", "  ... (97 lines)", "log line 97", "log line 98", "log line 99"]
    assert brief("one\n\ntwo", tail=3) == "one\ntwo"
