"""The heatmap on the real stages: ``fleetpulse demo`` as a subprocess, a headless Chromium.

One demo process serves the module: a 128-GPU fleet (2 rows x 2 racks x 4 nodes x 8 GPUs)
at 20x speed with faults the health rules catch within seconds (a GPU falling off the bus,
an ECC storm, a power brake). The page must show one cell per GPU, drill into a rack, and
ring a GPU that has an injected fault once the detector fires on it. At the end the demo
runs with no --duration and is stopped with SIGINT, as Ctrl-C would, and must exit cleanly
with its JSON summary.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from test_web_page import CHROMEDRIVER, CHROMIUM, BrowserPage, chromium

from agent.fleet import Topology

pytestmark = [
    pytest.mark.skipif(
        CHROMIUM is None or CHROMEDRIVER is None,
        reason="needs Debian chromium and chromium-driver (scripts/test.sh installs them)",
        installed_by_test_command=True,
    ),
    pytest.mark.timeout(600),  # the first test also waits for the demo to come up
]

ROOT = Path(__file__).resolve().parent.parent
SHAPE = {"NODES_PER_RACK": "4", "RACKS_PER_ROW": "2"}
GPUS = 128


@dataclass
class DemoProcess:
    proc: subprocess.Popen[str]
    labels_path: Path
    stderr: list[str] = field(default_factory=list)
    url: str = ""

    def read_stderr(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.stderr.append(line.rstrip("\n"))

    def wait_url(self, timeout: float) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for line in self.stderr:
                m = re.search(r"heatmap and query API on (http://\S+)", line)
                if m:
                    return m.group(1)
            if self.proc.poll() is not None:
                break
            time.sleep(0.1)
        raise AssertionError("demo did not come up:\n" + "\n".join(self.stderr[-40:]))

    def labels(self) -> list[dict[str, Any]]:
        return json.loads(self.labels_path.read_text())


def gpu_paths() -> list[str]:
    """Entity paths of the demo's GPUs, in global index order (as the labels number them)."""
    topo = Topology(GPUS, 8, int(SHAPE["NODES_PER_RACK"]), int(SHAPE["RACKS_PER_ROW"]), "sim")
    return [f"{topo.identity(g // 8).path}/gpu-{g % 8}" for g in range(GPUS)]


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DemoProcess]:
    tmp = tmp_path_factory.mktemp("demo")
    labels = tmp / "labels.json"
    env = dict(os.environ) | {f"FLEETPULSE_DEMO_{k}": v for k, v in SHAPE.items()}
    env["FLEETPULSE_DEMO_WEB__REFRESH_S"] = "0.5"
    # faults start 60-180 simulated seconds in: a few wall seconds at 20x
    env["FLEETPULSE_DEMO_FAULT_HORIZON_S"] = "300"
    cmd = [sys.executable, "-m", "fleetpulse", "demo", "--gpus", str(GPUS), "--speed", "20",
           "--duration", "0", "--faults", "3", "--seed", "5",
           "--fault-kinds", "fallen_off_bus,ecc_storm,power_brake",
           "--labels", str(labels), "--listen", "127.0.0.1:0", "--json"]
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    dp = DemoProcess(proc, labels)
    reader = threading.Thread(target=dp.read_stderr, daemon=True)
    reader.start()
    try:
        dp.url = dp.wait_url(240)  # a cold numba cache compiles the stages' kernels first
        yield dp
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(30)
        reader.join(10)
        for pipe in (proc.stdout, proc.stderr):
            if pipe is not None:
                pipe.close()


@pytest.fixture(scope="module")
def page(demo: DemoProcess) -> Iterator[BrowserPage]:
    driver = chromium()
    try:
        bp = BrowserPage(driver)
        # the first frames need a few seconds to become rollups the page can show
        bp.wait(lambda: _has_data(demo.url), 180, "data in the query API")
        bp.open(demo.url, timeout=60)
        yield bp
    finally:
        driver.quit()


def _has_data(url: str) -> bool:
    import urllib.parse
    import urllib.request

    q = url + "api/v1/query?" + urllib.parse.urlencode(
        {"query": 'fleetpulse_gpu_temperature_celsius{level="gpu"}'})
    try:
        with urllib.request.urlopen(q, timeout=10) as resp:  # 127.0.0.1 only
            return len(json.loads(resp.read())["data"]["result"]) == GPUS
    except OSError:  # busy starting up (numba kernels load on first use)
        return False


def test_page_has_one_cell_per_gpu(page: BrowserPage) -> None:
    page.wait(lambda: page.attr("cells") == str(GPUS), 30, "every GPU drawn")
    assert page.attr("view") == "cluster"
    assert page.attr("rows") == "2"
    assert float(page.attr("renderMs")) < 1000


def test_clicking_a_rack_shows_its_nodes(page: BrowserPage) -> None:
    page.js("window.location.hash = ''; document.querySelector('#crumbs a').click()")
    page.wait(lambda: page.attr("view") == "cluster", 5, "cluster view")
    rack = "sim/row-001/rack-001-00"
    page.click_label(rack)
    page.wait(lambda: page.attr("view") == "rack", 5, "rack view")
    assert page.attr("entity") == rack
    assert page.attr("groups") == SHAPE["NODES_PER_RACK"]
    assert int(page.attr("cells")) == int(SHAPE["NODES_PER_RACK"]) * 8
    page.js("document.querySelector('#crumbs a').click()")
    page.wait(lambda: page.attr("view") == "cluster", 5, "back to the cluster")


def test_faulted_gpu_is_highlighted_when_the_detector_fires(page: BrowserPage,
                                                            demo: DemoProcess) -> None:
    paths = gpu_paths()
    faulted = {paths[lab["gpu"]] for lab in demo.labels()}
    assert len(faulted) == 3
    hit = page.wait(lambda: page.highlighted() & faulted, 90, "a faulted GPU ringed")
    # every ring is on a GPU with an alert listed, and the list links to the cell
    listed = set(page.js(
        "return [...document.querySelectorAll('#alerts li.firing')].map(li => li.dataset.entity)"))
    assert page.highlighted() <= listed
    path = sorted(hit)[0]
    page.js("document.querySelector(`#alerts li[data-entity='${arguments[0]}']`).click()", path)
    page.wait(lambda: page.attr("entity") == path, 5, "alert click drills to the GPU")
    assert page.attr("view") == "gpu"


def test_sigint_stops_cleanly_with_a_summary(page: BrowserPage, demo: DemoProcess) -> None:
    demo.proc.send_signal(signal.SIGINT)
    try:
        demo.proc.wait(timeout=150)  # the demo bounds its own shutdown well below this
    except subprocess.TimeoutExpired:
        raise AssertionError("no exit after SIGINT:\n" + "\n".join(demo.stderr[-40:])) from None
    assert demo.proc.returncode == 0, "\n".join(demo.stderr[-30:])
    assert demo.proc.stdout is not None
    summary = json.loads(demo.proc.stdout.read().strip().splitlines()[-1])
    assert summary["gpus"] == GPUS
    assert summary["samples"] > 0 and summary["metrics_per_s"] > 0
    assert 1 <= summary["faults_detected"] <= summary["faults_injected"] <= 3
    assert summary["alerts"] >= summary["faults_detected"]
