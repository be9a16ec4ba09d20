"""The `parley` command: config printed with secrets masked, serves, stops on SIGTERM, clear config errors."""

import json
import os
import re
import signal
import subprocess
import sys
import urllib.request

import pytest

ENV = {**os.environ, "PARLEY_SECRET": "s3cret-value", "PARLEY_ICE_ADDRESSES": "127.0.0.1"}


def test_serve_prints_config_and_stops_cleanly():
    proc = subprocess.Popen([sys.executable, "-m", "gateway", "serve", "--port", "0", "--max-sessions", "7"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV)
    try:
        config_line = proc.stdout.readline()
        assert config_line.startswith("Parley configuration: ")
        config = json.loads(config_line.split(": ", 1)[1])
        assert config["max_sessions"] == 7 and config["secret"] == "***" and config["ice_addresses"] == ["127.0.0.1"]
        assert "s3cret-value" not in config_line
        url = re.search(r"http://\S+", proc.stdout.readline()).group(0)
        with urllib.request.urlopen(url + "/livez", timeout=30) as response:
            assert response.status == 200
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    finally:
        proc.kill()
        proc.communicate()


@pytest.mark.parametrize("args, env, message", [
    (["--max-sessions", "0"], {}, "max_sessions: 0 must be at least 1"),
    (["--mode", "karaoke"], {}, "mode: 'karaoke' is not one of"),
    ([], {"PARLEY_PORT": "eighty"}, "port: cannot read 'eighty' as int"),
])
def test_config_errors_are_clear(args, env, message):
    result = subprocess.run([sys.executable, "-m", "gateway", "serve", *args], capture_output=True, text=True,
                            env={**ENV, **env}, timeout=60)
    assert result.returncode == 2
    assert message in result.stderr
