"""speedup_report: rendered in a real headless Chromium, and its handling of bad input.

The browser is driven over the DevTools protocol through
`--remote-debugging-pipe` (NUL-terminated JSON on file descriptors 3 and 4),
which needs nothing beyond the standard library.
"""
import base64
import fcntl
import json
import os
import select
import signal
import time

import keras
import pandas as pd
import pytest

import kerasjit
from kerasjit import workloads
from kerasjit.callbacks import JitProfiler
from kerasjit.report import speedup_report

CHROMIUM = "/usr/bin/chromium"


class Browser:
    """Headless Chromium on a DevTools pipe; records console errors and requests of one page."""

    def __init__(self, profile_dir):
        if not os.path.exists(CHROMIUM):
            pytest.fail(f"{CHROMIUM} is missing: the report is checked in a real browser. Install "
                        "it with `apt-get install -y chromium chromium-driver` (.ci/run does).",
                        pytrace=False)
        to_browser, self._to_browser = os.pipe()
        self._from_browser, from_browser = os.pipe()
        # Chromium reads fd 3 and writes fd 4. posix_spawn puts the pipes there (subprocess's
        # preexec_fn is unsafe with threads, as TensorFlow runs); lifting them above 4 first
        # keeps one from being overwritten by the other's dup2.
        lifted = [fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 5) for fd in (to_browser, from_browser)]
        for fd in (to_browser, from_browser):
            os.close(fd)
        to_browser, from_browser = lifted
        self.pid = os.posix_spawn(CHROMIUM, [
            CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
            "--disable-background-networking", "--disable-component-update", "--disable-sync",
            "--host-resolver-rules=MAP * ~NOTFOUND", f"--user-data-dir={profile_dir}",
            "--remote-debugging-pipe", "about:blank"], os.environ, file_actions=[
            (os.POSIX_SPAWN_DUP2, to_browser, 3), (os.POSIX_SPAWN_DUP2, from_browser, 4),
            (os.POSIX_SPAWN_OPEN, 1, os.devnull, os.O_WRONLY, 0),
            (os.POSIX_SPAWN_OPEN, 2, os.devnull, os.O_WRONLY, 0)])
        for fd in (to_browser, from_browser):
            os.close(fd)
        self._buffer, self._next_id, self.events = b"", 0, []
        target = self.send("Target.createTarget", url="about:blank")["targetId"]
        self.session = self.send("Target.attachToTarget", targetId=target,
                                 flatten=True)["sessionId"]
        for domain in ("Page", "Runtime", "Log", "Network"):
            self.send(f"{domain}.enable", session=self.session)

    def _message(self, deadline):
        while b"\0" not in self._buffer:
            if not select.select([self._from_browser], [], [], max(0, deadline - time.time()))[0]:
                raise TimeoutError("Chromium did not answer")
            chunk = os.read(self._from_browser, 1 << 20)
            if not chunk:
                raise RuntimeError("Chromium closed the DevTools pipe")
            self._buffer += chunk
        message, self._buffer = self._buffer.split(b"\0", 1)
        return json.loads(message)

    def send(self, method, session=None, timeout=30, **params):
        self._next_id += 1
        command = {"id": self._next_id, "method": method, "params": params}
        if session:
            command["sessionId"] = session
        os.write(self._to_browser, json.dumps(command).encode() + b"\0")
        deadline = time.time() + timeout
        while True:
            message = self._message(deadline)
            if message.get("id") == self._next_id:
                if "error" in message:
                    raise RuntimeError(f"{method}: {message['error']}")
                return message["result"]
            self.events.append(message)

    def open(self, path, timeout=30):
        """Load a page and wait for its load event; returns the events it caused."""
        self.events.clear()
        self.send("Page.navigate", session=self.session, url=path.as_uri())
        deadline = time.time() + timeout
        while not any(e.get("method") == "Page.loadEventFired" for e in self.events):
            self.events.append(self._message(deadline))
        self.send("Runtime.evaluate", session=self.session, expression="1")  # drain late events
        return self.events

    def evaluate(self, expression):
        result = self.send("Runtime.evaluate", session=self.session, expression=expression,
                           returnByValue=True)
        return result["result"]["value"]

    def screenshot(self, path, width=1200):
        self.send("Emulation.setDeviceMetricsOverride", session=self.session, width=width,
                  height=900, deviceScaleFactor=1, mobile=False)
        data = self.send("Page.captureScreenshot", session=self.session, format="png",
                         captureBeyondViewport=True)["data"]
        path.write_bytes(base64.b64decode(data))

    def close(self):
        os.kill(self.pid, signal.SIGTERM)
        os.waitpid(self.pid, 0)
        os.close(self._to_browser)
        os.close(self._from_browser)


def problems(events):
    """Console errors, exceptions, browser-logged errors, and requests that leave the file."""
    found = []
    for event in events:
        method, params = event.get("method"), event.get("params", {})
        if method == "Runtime.consoleAPICalled" and params["type"] in ("error", "assert"):
            found.append(f"console.{params['type']}: {params['args']}")
        elif method == "Runtime.exceptionThrown":
            found.append(f"exception: {params['exceptionDetails']}")
        elif method == "Log.entryAdded" and params["entry"]["level"] == "error":
            found.append(f"log error: {params['entry']['text']}")
        elif method == "Network.requestWillBeSent":
            url = params["request"]["url"]
            if not url.startswith(("file:", "data:")):
                found.append(f"request: {url}")
    return found


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    b = Browser(tmp_path_factory.mktemp("chromium-profile"))
    yield b
    b.close()


@pytest.fixture(scope="module")
def profiled_runs():
    """Plain Keras and kerasjit (reference backend) on a small softmax regression."""
    x, y = workloads.classification_data(1000, (784,), 10)
    runs = []
    for name in ("plain Keras", "kerasjit"):
        keras.utils.set_random_seed(0)
        model = workloads.softmax_regression()
        if name == "kerasjit":
            model = kerasjit.wrap(model, backend="reference")
        profiler = JitProfiler(name=name, batch_size=100)
        model.fit(x, y, batch_size=100, epochs=3, verbose=0, callbacks=[profiler])
        runs.append(profiler)
    return runs, kerasjit.explain(model, x[:100], y[:100])


def test_report_renders_offline_in_chromium(profiled_runs, browser, tmp_path):
    runs, explanation = profiled_runs
    path = speedup_report(runs, tmp_path / "report.html", explanations={"kerasjit": explanation},
                          notes={"about": "a <b>test</b> note"})
    events = browser.open(path)
    assert problems(events) == []
    page = browser.evaluate("""({
        charts: [...document.querySelectorAll('svg.chart')].map(s => {
            const box = s.getBoundingClientRect();
            return {w: box.width, h: box.height,
                    lines: [...s.querySelectorAll('polyline.series')]
                           .map(p => p.getAttribute('points').trim().split(/\\s+/).length),
                    title: s.querySelector('text').textContent};
        }),
        tables: [...document.querySelectorAll('table')].map(t => t.rows.length),
        summary: document.querySelector('table.summary').innerText,
        clusters: document.querySelector('table.clusters').innerText,
        text: document.body.innerText,
        scripts: document.scripts.length,
        external: [...document.querySelectorAll('[src],[href]')].map(e => e.src || e.href),
    })""")
    # (both runs in this process: one RSS, no chart of two identical lines)
    assert [c["title"] for c in page["charts"]] == [
        "Epoch wall time, s (incl. compiling)", "Cumulative wall time, s (incl. compiling)"]
    assert "shared one process" in page["text"]
    for chart in page["charts"]:
        assert chart["w"] > 300 and chart["h"] > 150 and chart["lines"] == [3, 3]
    # summary (header + 2 runs), 2 per-epoch tables (header + 3 epochs), the cluster table
    assert page["tables"][:3] == [3, 4, 4] and len(page["tables"]) == 4
    assert "plain Keras" in page["summary"] and "baseline" in page["summary"]
    assert "compiled" in page["clusters"]
    assert "a <b>test</b> note" in page["text"]          # notes are text, not markup
    assert page["scripts"] == 0 and all(u.startswith("data:") for u in page["external"])
    browser.screenshot(tmp_path / "report.png", width=1280)
    assert (tmp_path / "report.png").stat().st_size > 10_000
    # At 1280 px every table fits: nothing scrolls sideways, nothing is cut.
    overflow = browser.evaluate("""[document.documentElement.scrollWidth - innerWidth,
        ...[...document.querySelectorAll('div.wide')].map(d => d.scrollWidth - d.clientWidth)]""")
    assert max(overflow) <= 0, overflow
    epochs = browser.evaluate("[...document.querySelectorAll('table.epochs')].flatMap("
                              "t => [...t.tBodies[0].rows].map(r => r.cells[0].innerText))")
    assert epochs == ["1", "2", "3"] * 2         # counted from 1, as the charts count


def test_browser_check_catches_requests_and_errors(browser, tmp_path):
    # The detectors above must be able to fail: a page that requests and errs.
    bad = tmp_path / "bad.html"
    bad.write_text("<img src='http://example.invalid/x.png'><script>console.error('boom')"
                   "</script>")
    found = problems(browser.open(bad))
    assert any(p.startswith("request: http://example.invalid") for p in found)
    assert any("boom" in p for p in found)


def frame(name, seconds, compile_seconds=None, rss=1000.0):
    return name, pd.DataFrame({
        "epoch": range(len(seconds)), "epoch_seconds": seconds,
        "compile_seconds": compile_seconds or [0.0] * len(seconds),
        "peak_rss_mib": [rss] * len(seconds)})


def test_speedup_and_payoff(tmp_path):
    text = speedup_report([frame("base", [1.0, 1.0, 1.0]), frame("fast", [1.5, 0.2, 0.2]),
                           frame("slow start", [3.0, 0.5, 0.5]), frame("slower", [1.0, 2.0, 2.0])],
                          tmp_path / "r.html").read_text()
    assert "5.00× faster" in text and "epoch 2<" in text          # cumulative 1.7 < 2.0
    assert "2.00× faster" in text and "~epoch 6 (projected)" in text  # 5.5 < 6.0 at epoch 6
    assert "2.00× slower" in text and "never (slower per epoch)" in text
    assert "× (" not in text                  # a ratio said once ("2.00× faster")
    short = speedup_report([frame("base", [1.0, 1.0]), frame("fast", [3.0, 0.5])],
                           tmp_path / "s.html").read_text()
    assert "not within 2 epoch(s) (too few to project)" in short and "projected" not in short


def test_different_epoch_counts_and_early_stop(profiled_runs, tmp_path):
    runs, _ = profiled_runs
    x, y = workloads.classification_data(200, (784,), 10)
    stopped = JitProfiler(name="stopped early", batch_size=100)
    workloads.softmax_regression().fit(
        x, y, batch_size=100, epochs=10, verbose=0,
        callbacks=[stopped, keras.callbacks.EarlyStopping(monitor="loss", min_delta=10)])
    assert len(stopped.rows) == 2
    text = speedup_report([runs[0], stopped], tmp_path / "r.html").read_text()
    assert "different numbers of epochs (plain Keras: 3, stopped early: 2)" in text
    assert "use the first 2" in text


def test_empty_runs_are_reported(profiled_runs, tmp_path):
    runs, _ = profiled_runs
    text = speedup_report([runs[0], JitProfiler(name="never trained"), ("empty", pd.DataFrame())],
                          tmp_path / "r.html").read_text()
    assert text.count("no epochs recorded") == 2
    text = speedup_report([("empty baseline", pd.DataFrame()), runs[1]],
                          tmp_path / "r.html").read_text()
    assert "The baseline recorded no epochs: no speedups." in text


def test_bad_input_raises_clear_errors(profiled_runs, tmp_path):
    runs, _ = profiled_runs
    history = pd.DataFrame({"loss": [1.0, 0.5], "accuracy": [0.1, 0.2]})
    with pytest.raises(ValueError, match=r"run 'history' lacks column\(s\) epoch, epoch_seconds, "
                                         r"compile_seconds, peak_rss_mib"):
        speedup_report([runs[0], ("history", history)], tmp_path / "r.html")
    name, broken = frame("broken", [1.0, 2.0])
    broken["epoch_seconds"] = ["1.0", "fast"]
    with pytest.raises(ValueError, match="run 'broken': column epoch_seconds has non-numeric"):
        speedup_report([runs[0], (name, broken)], tmp_path / "r.html")
    with pytest.raises(ValueError, match="at least 2 runs"):
        speedup_report([runs[0]], tmp_path / "r.html")
    with pytest.raises(TypeError, match="run 2: expected a JitProfiler"):
        speedup_report([runs[0], [1.0, 2.0]], tmp_path / "r.html")
    assert not (tmp_path / "r.html").exists()


def test_a_race_tensorflow_won_is_told_beside_the_headline(tmp_path):
    from types import SimpleNamespace
    explained = SimpleNamespace(clusters=[
        SimpleNamespace(kind="compiled", ops=["MatMul"] * 40, reason=""),
        SimpleNamespace(kind="tensorflow", ops=["Conv2D", "Relu"],
                        reason="TensorFlow ran it faster here (1.00 vs 2.00 ms per call compiled)")])
    text = speedup_report([frame("base", [1.0, 1.0, 1.0]), frame("jit", [1.5, 0.5, 0.5])],
                          tmp_path / "r.html", explanations={"jit": explained}).read_text()
    start = text.index("<p class='headline'>")
    headline = text[start:text.index("</p>", start)]
    assert "TensorFlow runs 1 of its parts (2 ops): it ran them faster here" in headline
