"""Screenshot a flow run's page in the Prefect UI with headless Chromium.

    source .prefect/local/env.sh          # written by `make serve`: PREFECT_API_URL
    python -m bench.ui_screenshot --run-name tiny-cpu --out docs/images/flow-run-page.png
    python -m bench.ui_screenshot --artifact-key ppo-tiny-cpu-summary --window 1600,1200 --out /tmp/summary.png
    # and a zoomed detail of the run graph (a box in CSS pixels of the 1600x1000 page):
    python -m bench.ui_screenshot --run-name tiny-cpu --crop 1105,105,1330,490 --out docs/images/flow-run-graph.png

The proof that the UI tells a run's story without a terminal: the run
graph shows each stage by name (`rollout[iter=2]`). The page is a single-page app
that draws the graph on a canvas after several API calls, so Chromium gets a virtual
time budget to finish before the shot; the device scale factor (2 by default) keeps
the graph's small labels legible when the image is zoomed.

Needs Debian's `chromium` (`apt-get install -y chromium`); nothing is downloaded.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
# Quiet, offline, reproducible headless flags.
CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--hide-scrollbars",
)


def find_chromium() -> str:
    for name in CHROMIUM_NAMES:
        if path := shutil.which(name):
            return path
    raise SystemExit(
        f"error: no Chromium found (looked for {', '.join(CHROMIUM_NAMES)} on PATH); "
        "on Debian: apt-get update && apt-get install -y chromium"
    )


def ui_url_from_api(api_url: str) -> str:
    """The server serves its UI at the API URL without the trailing /api."""
    api_url = api_url.rstrip("/")
    return api_url[: -len("/api")] if api_url.endswith("/api") else api_url


def find_flow_run_id(run_name: str) -> str:
    """The newest flow run with this name (the flow run is named after job.name, so a
    resumed run's latest attempt wins)."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterName
    from prefect.client.schemas.sorting import FlowRunSort

    with get_client(sync_client=True) as client:
        runs = client.read_flow_runs(
            flow_run_filter=FlowRunFilter(name=FlowRunFilterName(any_=[run_name])),
            sort=FlowRunSort.START_TIME_DESC,
            limit=1,
        )
    if not runs:
        raise SystemExit(f"error: no flow run named {run_name!r} at {os.environ.get('PREFECT_API_URL')}")
    return str(runs[0].id)


def latest_artifact_id(key: str) -> str:
    from prefect.artifacts import Artifact

    artifact = Artifact.get(key)
    if artifact is None:
        raise SystemExit(f"error: no artifact with key {key!r} at {os.environ.get('PREFECT_API_URL')}")
    return str(artifact.id)


def flow_run_page(ui_url: str, flow_run_id: str) -> str:
    return f"{ui_url.rstrip('/')}/runs/flow-run/{flow_run_id}"


def crop(png: Path, box_css: str, scale: float) -> None:
    """Keep only `box_css` (LEFT,TOP,RIGHT,BOTTOM in CSS pixels): the graph draws a
    short run's stages in a narrow strip of a wide page."""
    from PIL import Image  # Pillow comes with matplotlib

    try:
        left, top, right, bottom = (round(float(v) * scale) for v in box_css.split(","))
    except ValueError:
        raise SystemExit(
            f"error: --crop {box_css!r}: expected LEFT,TOP,RIGHT,BOTTOM in CSS pixels, e.g. 1120,110,1260,490"
        )
    with Image.open(png) as image:
        image.crop((left, top, right, bottom)).save(png)


def screenshot(
    url: str, out: Path, window: str = "1600,1000", scale: float = 2.0, budget_ms: int = 15000, timeout_s: int = 180
) -> Path:
    out.parent.mkdir(parents=True, exist_ok=True)
    if out.exists():
        out.unlink()
    with tempfile.TemporaryDirectory(prefix="ppo-chromium-") as profile:
        command = [
            find_chromium(),
            *CHROMIUM_FLAGS,
            f"--user-data-dir={profile}",
            f"--force-device-scale-factor={scale}",
            f"--virtual-time-budget={budget_ms}",
            f"--window-size={window}",
            f"--screenshot={out.resolve()}",
            url,
        ]
        result = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s)
    if not out.is_file() or out.stat().st_size == 0:
        raise SystemExit(
            f"error: Chromium wrote no screenshot of {url} (exit {result.returncode}):\n{result.stderr[-2000:]}"
        )
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.ui_screenshot", description=__doc__.splitlines()[0])
    which = parser.add_mutually_exclusive_group(required=True)
    which.add_argument("--run-name", help="flow run name (= job.name); the newest such run is used")
    which.add_argument("--flow-run-id", help="flow run id")
    which.add_argument(
        "--artifact-key", help="shoot the newest artifact with this key instead, e.g. ppo-tiny-cpu-summary"
    )
    parser.add_argument("--out", type=Path, default=Path("docs/images/flow-run-page.png"), help="PNG to write")
    parser.add_argument("--crop", default=None, help="keep only LEFT,TOP,RIGHT,BOTTOM (CSS pixels) of the page")
    parser.add_argument("--ui-url", default=None, help="UI address (default: PREFECT_API_URL without /api)")
    parser.add_argument("--window", default="1600,1000", help="window size WIDTH,HEIGHT in CSS pixels")
    parser.add_argument("--scale", type=float, default=2.0, help="device scale factor (2: labels stay legible)")
    parser.add_argument("--budget-ms", type=int, default=15000, help="Chromium virtual time budget")
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)

    api_url = os.environ.get("PREFECT_API_URL")
    if not api_url and not args.ui_url:
        print("error: PREFECT_API_URL is not set; `source .prefect/local/env.sh` after `make serve`", file=sys.stderr)
        return 2
    ui_url = (args.ui_url or ui_url_from_api(api_url)).rstrip("/")
    if args.artifact_key:
        url = f"{ui_url}/artifacts/artifact/{latest_artifact_id(args.artifact_key)}"
    else:
        url = flow_run_page(ui_url, args.flow_run_id or find_flow_run_id(args.run_name))
    out = screenshot(url, args.out, args.window, args.scale, args.budget_ms)
    if args.crop:
        crop(out, args.crop, args.scale)
    print(f"{out}: {url}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
