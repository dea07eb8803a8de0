"""The command line's temporary Prefect API, started as the command starts it: the real
server command over Prefect's app and the retry middleware (processes/temporary_server.py),
here on the test session's database so it starts without a migration."""

from __future__ import annotations

import json
import os
import urllib.request

from compat.prefect_compat import SERVER_ENV
from processes.temporary_api import _launch_api, server_command


def test_the_real_temporary_api_command_serves_prefects_api_through_the_retry(prefect_api):
    from prefect.settings import PREFECT_API_DATABASE_CONNECTION_URL

    database = PREFECT_API_DATABASE_CONNECTION_URL.value()
    env = {**os.environ, **SERVER_ENV, "PREFECT_API_DATABASE_CONNECTION_URL": database}
    env.pop("PREFECT_API_URL", None)
    api = _launch_api(server_command(), env)
    try:
        api.wait_until_up(120)
        request = urllib.request.Request(
            f"{api.api_url}/flows/", data=json.dumps({"name": "temporary-api-probe"}).encode(),
            headers={"Content-Type": "application/json"}, method="POST",
        )
        with urllib.request.urlopen(request, timeout=30) as response:  # a write, its body replayed to the app
            assert response.status in (200, 201)
            assert json.loads(response.read())["name"] == "temporary-api-probe"
        assert api.process.poll() is None
    finally:
        api.stop()
